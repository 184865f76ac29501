"""The agent's log stream on the deployed stack: vend makes the attempt's stream when it hands the
instance its job's credentials, and those credentials are what the agent ships its lines with
(the instance role writes no stream: tests/infrastructure/test_job_isolation.py proves the policies)."""

from __future__ import annotations

from spotrelay.aws.deployed_stack import AGENT_LOG_GROUP
from spotrelay.config import TAG_JOB_ID
from spotrelay.control.vend import attempt_log_stream
from spotrelay.local import LocalRuntime, VirtualClock
from spotrelay.local.job_credentials import instance_credentials

from .conftest import START
from .test_lifecycle import RecordedEvent, deployed, submit_and_dispatch


def test_vend_makes_the_attempts_stream_and_its_credentials_write_to_it(
    runtime: LocalRuntime, clock: VirtualClock, resnet50_message: str, recorded_event: RecordedEvent
) -> None:
    # Given a job launched on an instance, and the agents' log group of the deployed stack
    launch = submit_and_dispatch(runtime, clock, resnet50_message, recorded_event)
    job_id = launch.tags[TAG_JOB_ID]
    stack = deployed(runtime)
    group = stack.outputs[AGENT_LOG_GROUP]
    logs = runtime.client("logs")
    assert logs.describe_log_streams(logGroupName=group)["logStreams"] == []
    # When the instance's agent asks vend for its job's credentials (twice: a refresh)
    credentials = instance_credentials(runtime, stack)
    vend = credentials.vend_client(launch.instance_id)
    with clock.exclusive():
        first = vend.fetch()
        vend.fetch()
    # Then the attempt's stream is there, once
    stream = attempt_log_stream(job_id, 1)
    streams = logs.describe_log_streams(logGroupName=group)["logStreams"]
    assert [s["logStreamName"] for s in streams] == [stream]
    # And the job's credentials put the agent's lines in it
    job_logs = credentials.job_session(first, vend).client("logs", endpoint_url=stack.endpoint_url)
    at = int(START.timestamp() * 1000)
    with clock.exclusive():
        job_logs.put_log_events(
            logGroupName=group, logStreamName=stream, logEvents=[{"timestamp": at, "message": "epoch 1"}]
        )
    events = logs.get_log_events(logGroupName=group, logStreamName=stream)["events"]
    assert [e["message"] for e in events] == ["epoch 1"]
