"""End to end on the deployed stack, on the virtual clock: a job message on the queue, the recorded
alarm event on EventBridge, the real JobLifecycle execution, the handlers in-process, EC2 answering
from the market. The test plays the agent (task token from the attempt record) and the time."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from moto.moto_api._internal import mock_random

from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import TAG_JOB_ID
from spotrelay.local import Launch, LocalRuntime, LocalStack, VirtualClock
from spotrelay.models import AttemptOutcome, JobState

from .conftest import SEED, START, example_market

HEARTBEAT_EVERY = timedelta(minutes=5)  # the stack's HeartbeatSeconds is 900 s: beat well within it
RecordedEvent = Callable[..., dict[str, Any]]


def deployed(runtime: LocalRuntime) -> LocalStack:
    assert runtime.stack is not None
    return runtime.stack


def store_of(runtime: LocalRuntime) -> DynamoJobStore:
    return DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb)


def submit_and_dispatch(
    runtime: LocalRuntime, clock: VirtualClock, message: str, recorded_event: RecordedEvent
) -> Launch:
    """Send the job, raise the queue-depth alarm's event (as CloudWatch would), let it all run."""
    stack = deployed(runtime)
    runtime.sqs.send_message(QueueUrl=stack.queue_url, MessageBody=message)
    with clock.exclusive():
        runtime.put_event(recorded_event("alarm-state-change", alarm_name=stack.depth_alarm_name))
    clock.wait_quiescent()
    assert [d.error for d in runtime.deliveries] == [None]  # the rule delivered to the dispatcher
    launches = runtime.market_launches()
    assert len(launches) == 1, launches
    return launches[0]


def open_task_token(runtime: LocalRuntime, job_id: str) -> str:
    """What the agent reads: the task token of the job's latest attempt."""
    attempt = store_of(runtime).attempts(job_id)[-1]
    assert attempt.outcome is None
    assert attempt.task_token
    return attempt.task_token


def work(runtime: LocalRuntime, clock: VirtualClock, token: str, until: datetime) -> None:
    """Play the agent while the job runs: heartbeat the task token until `until`."""
    while clock.now() < until:
        clock.advance_to(min(until, clock.now() + HEARTBEAT_EVERY))
        with clock.exclusive():
            runtime.sfn.send_task_heartbeat(taskToken=token)
        clock.wait_quiescent()


def succeed(runtime: LocalRuntime, clock: VirtualClock, token: str) -> None:
    with clock.exclusive():
        runtime.sfn.send_task_success(taskToken=token, output=json.dumps({"exit_code": 0}))
    clock.wait_quiescent()


def execution(runtime: LocalRuntime, job_id: str) -> dict[str, Any]:
    arn = deployed(runtime).state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"
    described = runtime.sfn.describe_execution(executionArn=arn)
    history = runtime.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    return {"status": described["status"], "entered": entered}


def test_happy_path(
    runtime: LocalRuntime, clock: VirtualClock, resnet50_message: str, recorded_event: RecordedEvent
) -> None:
    # Given a job on the queue and the queue-depth alarm's event on EventBridge
    launch = submit_and_dispatch(runtime, clock, resnet50_message, recorded_event)
    # Then the dispatcher admitted it, Place ranked the market's pools, Launch started the cheapest
    job_id = launch.tags[TAG_JOB_ID]
    assert (launch.pool.offering, launch.at, launch.spot_price) == ("g6.xlarge:us-east-1a", START, 0.35)
    assert execution(runtime, job_id) == {"status": "RUNNING", "entered": ["Place", "PlaceChoice", "Run"]}
    # When the agent works for an hour, heartbeating, and reports success
    token = open_task_token(runtime, job_id)
    work(runtime, clock, token, START + timedelta(hours=1))
    succeed(runtime, clock, token)
    # Then the execution succeeded, the job is SUCCEEDED with the hour's cost, the instance is gone
    assert execution(runtime, job_id)["status"] == "SUCCEEDED"
    job, _ = store_of(runtime).get_job(job_id)
    assert job.state is JobState.SUCCEEDED
    assert job.cost_usd == 0.35  # one hour at 0.35 $/h
    assert job.ended_at == START + timedelta(hours=1)
    described = runtime.ec2.describe_instances(InstanceIds=[launch.instance_id])
    assert described["Reservations"][0]["Instances"][0]["State"]["Name"] == "terminated"
    # And Finalize woke the dispatcher (an asynchronous invocation, run in-process)
    invoked = [i.function_name for i in runtime.lambdas.invocations]
    assert invoked[-2:] == [deployed(runtime).functions["finalize"], deployed(runtime).functions["dispatcher"]]


def test_interruption_recovers_on_another_pool(
    runtime: LocalRuntime, clock: VirtualClock, resnet50_message: str, recorded_event: RecordedEvent
) -> None:
    first = submit_and_dispatch(runtime, clock, resnet50_message, recorded_event)
    job_id = first.tags[TAG_JOB_ID]
    token = open_task_token(runtime, job_id)
    work(runtime, clock, token, START + timedelta(minutes=10))
    # When EC2 warns that the instance will be interrupted (the recorded event, bound to it)
    interrupted_at = clock.now()
    with clock.exclusive():
        runtime.put_event(recorded_event("spot-interruption-warning", instance_id=first.instance_id))
    clock.wait_quiescent()
    # Then Run fails with SpotInterrupted and Recover waits for the final checkpoint, on the clock
    assert execution(runtime, job_id)["entered"][-3:] == ["Recover", "RecoverChoice", "WaitForCheckpoint"]
    assert clock.next_wakeup() == interrupted_at + timedelta(seconds=15)
    assert len(runtime.market_launches()) == 1
    # When the clock runs on (no checkpoint comes), Then Recover gives up waiting and Place relaunches
    # on the next-cheapest pool: the interrupted one is blocked
    clock.advance_to(interrupted_at + timedelta(minutes=5))
    launches = runtime.market_launches()
    assert len(launches) == 2
    second = launches[1]
    assert second.pool.offering == "g6.xlarge:us-east-1b"
    assert second.at == interrupted_at + timedelta(seconds=150)  # the final-checkpoint wait, 15 s at a time
    entered = execution(runtime, job_id)["entered"]
    assert entered[:3] == ["Place", "PlaceChoice", "Run"]
    assert entered[-4:] == ["RecoverChoice", "Place", "PlaceChoice", "Run"]
    assert entered.count("WaitForCheckpoint") == 10
    store = store_of(runtime)
    blocked = {block.pool.offering for block in store.blocked_pools(clock.now())}
    assert blocked == {"g6.xlarge:us-east-1a"}
    attempts = store.attempts(job_id)
    assert [(a.pool.offering, a.outcome) for a in attempts] == [
        ("g6.xlarge:us-east-1a", AttemptOutcome.INTERRUPTED),
        ("g6.xlarge:us-east-1b", None),
    ]
    # When the second attempt finishes the job
    token = open_task_token(runtime, job_id)
    work(runtime, clock, token, second.at + timedelta(minutes=30))
    succeed(runtime, clock, token)
    # Then it succeeded after two attempts, paying for both
    assert execution(runtime, job_id)["status"] == "SUCCEEDED"
    job, _ = store.get_job(job_id)
    assert (job.state, job.attempts, job.interruptions) == (JobState.SUCCEEDED, 2, 1)
    spans = [(a.hourly_price, a.started_at, a.ended_at) for a in store.attempts(job_id)]
    paid = sum(price * (ended - started).total_seconds() / 3600 for price, started, ended in spans if ended is not None)
    assert all(ended is not None for _, _, ended in spans)
    assert abs(job.cost_usd - paid) < 1e-6
    assert abs(paid - (0.35 * 12.5 / 60 + 0.40 * 0.5)) < 1e-6


def test_the_same_seed_replays_the_same(
    synthesized_template: Path, resnet50_message: str, recorded_event: RecordedEvent
) -> None:
    def run() -> list[tuple[str, str, str, datetime]]:
        clock = VirtualClock(START)
        with LocalRuntime(clock=clock, market=example_market(), seed=SEED) as runtime:
            runtime.deploy(synthesized_template)
            # as the replay does: the first deploy in a process draws more of moto's random ids than later
            # ones (its lazily built backends), so the ids after it depend on what ran before in the process
            mock_random.seed(SEED)
            launch = submit_and_dispatch(runtime, clock, resnet50_message, recorded_event)
            with clock.exclusive():
                runtime.put_event(recorded_event("spot-interruption-warning", instance_id=launch.instance_id))
            clock.advance_to(START + timedelta(minutes=5))
            return [(x.tags[TAG_JOB_ID], x.instance_id, x.pool.offering, x.at) for x in runtime.market_launches()]

    first = run()
    assert len(first) == 2
    assert run() == first
