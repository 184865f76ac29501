"""EC2 throttling every RunInstances, end to end: the synthesized stack on moto (spotrelay.local), the real
JobLifecycle definition with its Retry, Catch and Wait states on the virtual clock, the handlers in-process,
and EC2 answering RequestLimitExceeded to every launch. How many launches over virtual time, and how the job
ends, are what a user and the account's API limits see."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotrelay.aws.store import DynamoJobStore
from spotrelay.local import LocalRuntime, VirtualClock
from spotrelay.local.chaos import REQUEST_LIMIT_EXCEEDED
from spotrelay.market import MarketBuilder
from spotrelay.models import JobState

START = datetime(2026, 11, 30, tzinfo=UTC)
PATIENCE_HOURS = 2
# A bound on each wait for quiescence (real seconds), never a sleep
STALL_SECONDS = 120.0


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch, synthesized_template: Path) -> Iterator[LocalRuntime]:
    """The stack deployed into moto on a virtual clock at START, two spot pools priced, every launch throttled."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(name, value)
    market = MarketBuilder(START)
    market.add_price("g6.xlarge", "us-east-1a", 0.35)
    market.add_price("g6.xlarge", "us-east-1b", 0.40)
    with LocalRuntime(clock=VirtualClock(START, stall_seconds=STALL_SECONDS), market=market.build(), seed=7) as local:
        local.deploy(synthesized_template)
        assert local.market is not None
        local.market.refusal_faults = lambda pool: REQUEST_LIMIT_EXCEEDED
        yield local


def submit(runtime: LocalRuntime, events_dir: Path, spec: dict[str, Any]) -> str:
    """Send the job and the queue-depth alarm's event (as CloudWatch would); the job id."""
    stack = runtime.stack
    assert stack is not None
    runtime.sqs.send_message(QueueUrl=stack.queue_url, MessageBody=json.dumps(spec))
    alarm = json.loads((events_dir / "recorded" / "alarm-state-change.json").read_text())
    alarm["detail"]["alarmName"] = stack.depth_alarm_name
    alarm["resources"] = [f"arn:aws:cloudwatch:{alarm['region']}:{alarm['account']}:alarm:{stack.depth_alarm_name}"]
    clock = runtime.clock
    assert isinstance(clock, VirtualClock)
    with clock.exclusive():
        runtime.put_event(alarm)
    clock.wait_quiescent()
    [job] = DynamoJobStore(stack.table_name, runtime.dynamodb).all_jobs()
    return job.job_id


def test_endless_throttling_is_paced_and_fails_the_job_when_its_patience_is_spent(
    runtime: LocalRuntime, events_dir: Path
) -> None:
    # Given a job with 2 h of patience that may not go on-demand, and EC2 throttling every RunInstances
    spec = yaml.safe_load((events_dir / "jobs" / "resnet50.yaml").read_text())
    spec["limits"] |= {"max_wait_hours": PATIENCE_HOURS, "on_demand_fallback": False}
    job_id = submit(runtime, events_dir, spec)
    clock = runtime.clock
    assert isinstance(clock, VirtualClock)
    # When the clock runs for 6 hours
    clock.advance_to(START + timedelta(hours=6))
    # Then RunInstances was called 7 times a round (the Run task's call and its 6 retries), the rounds backing
    # off to 11.5 minutes apart: at most 49 calls in the first hour, 37 in the second (without the backoff: 280
    # an hour, for as long as the throttling lasts), one round more as the patience ends, and none after
    assert runtime.market is not None
    calls = [r.at for r in runtime.market.refusals]
    assert {r.code for r in runtime.market.refusals} == {"RequestLimitExceeded"}
    assert runtime.market_launches() == []
    hours = [
        sum(1 for at in calls if START + timedelta(hours=h) <= at < START + timedelta(hours=h + 1)) for h in range(6)
    ]
    assert hours[0] <= 49
    assert hours[1] <= 37
    assert hours[2:] == [7, 0, 0, 0]  # the round the wait cut short to end with the patience, at 2 h
    rounds = [at for i, at in enumerate(calls) if i % 7 == 0]
    assert [int((at - rounds[0]).total_seconds()) for at in rounds[:5]] == [0, 180, 540, 1230, 1920]
    # And the job ended FAILED within two minutes of its patience, saying that EC2 throttled every launch
    stack = runtime.stack
    assert stack is not None
    job, _ = DynamoJobStore(stack.table_name, runtime.dynamodb).get_job(job_id)
    assert job.state is JobState.FAILED
    assert job.ended_at is not None
    assert timedelta(hours=PATIENCE_HOURS) <= job.ended_at - rounds[0] <= timedelta(hours=PATIENCE_HOURS, minutes=2)
    assert job.failure_reason is not None
    assert job.failure_reason.startswith(
        f"NoCapacity: nothing launched for {PATIENCE_HOURS:.1f} h (limits.max_wait_hours {PATIENCE_HOURS}); "
        "last: EC2 throttled RunInstances (RequestLimitExceeded: Request limit exceeded.)"
    )
    assert "\n" not in job.failure_reason
    assert len(job.failure_reason) <= 500
    # And the execution went through the Wait state between rounds, and ended through Finalize
    arn = stack.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{job_id}"
    assert runtime.sfn.describe_execution(executionArn=arn)["status"] == "FAILED"
    history = runtime.sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    assert entered.count("WaitForCapacity") == len(rounds) - 1
    assert entered[-5:] == ["PlaceChoice", "PlaceFailed", "Finalize", "Outcome", "Failed"]
