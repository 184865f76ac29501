"""`spotrelay local up`: the deployed stack behind moto's HTTP server, used the way the AWS CLI or boto3
in another process uses it (through the endpoint URL, not the in-process mock)."""

from __future__ import annotations

import json
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from typer.testing import CliRunner

from spotrelay.cli import app
from spotrelay.local.server import NO_WORKER_HEARTBEAT_SECONDS, describe, price_market, serve_local_stack

from .conftest import START


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("localhost", 0))
        return int(probe.getsockname()[1])


def test_a_client_of_the_endpoint_runs_a_job(
    synthesized_template: Path, events_dir: Path, resnet50_message: str, caplog: pytest.LogCaptureFixture
) -> None:
    # the example prices are stamped in the first hour of START: all of them hold an hour later
    market = price_market(events_dir / "prices" / "us-east-1-example.csv", START + timedelta(hours=1))
    with serve_local_stack(port=free_port(), template=synthesized_template, market=market, quiet=True) as served:
        stack = served.stack

        def client(service: str) -> Any:
            return boto3.client(  # type: ignore[call-overload]
                service,
                endpoint_url=served.endpoint_url,
                region_name=stack.region,
                config=Config(retries={"total_max_attempts": 1}),
            )

        # Every client is made before the job runs: the in-process Lambdas swap os.environ while they run
        # (on the executions' threads), and botocore reads os.environ while it makes a client
        sqs, lambda_, sfn, ec2 = (client(name) for name in ("sqs", "lambda", "stepfunctions", "ec2"))

        # When a client of the endpoint submits the job and invokes the dispatcher
        sqs.send_message(QueueUrl=stack.queue_url, MessageBody=resnet50_message)
        answer = lambda_.invoke(FunctionName=stack.functions["dispatcher"], Payload=b"{}")
        report = json.loads(answer["Payload"].read())
        # Then the job was admitted, its execution runs, and EC2 started an instance at the market's price
        assert len(report["admitted"]) == 1
        (execution,) = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        assert execution["name"] == report["admitted"][0]
        assert served.runtime.market is not None
        (launch,) = served.runtime.market.wait_for_launches(1, timeout=20)  # the execution runs on its own thread
        assert launch.pool.availability_zone in stack.subnets
        assert launch.spot_price == market.price(launch.pool, market.to_hours(launch.at))
        reservations = ec2.describe_instances(InstanceIds=[launch.instance_id])["Reservations"]
        assert reservations[0]["Instances"][0]["InstanceLifecycle"] == "spot"
        printed = "\n".join(describe(served))
        assert served.endpoint_url in printed
        assert stack.queue_url in printed
    # And the server did not print a line per request
    assert not [r for r in caplog.records if r.name == "werkzeug" and "HTTP/1.1" in r.getMessage()]


def test_local_up_is_a_command() -> None:
    result = CliRunner().invoke(app, ["local", "up", "--help"])
    assert result.exit_code == 0
    assert "--port" in result.output


def test_spotrelay_submit_and_status_reach_the_stack_through_the_endpoint(
    synthesized_template: Path, events_dir: Path
) -> None:
    market = price_market(events_dir / "prices" / "us-east-1-example.csv", START + timedelta(hours=1))
    with serve_local_stack(port=free_port(), template=synthesized_template, market=market, quiet=True) as served:
        # (the in-process Lambdas swap os.environ while they run: name the region rather than read it)
        endpoint = ["--endpoint-url", served.endpoint_url, "--region", served.stack.region]
        # When a user runs what `local up` prints: submit by the stack's name, through the endpoint
        submitted = CliRunner().invoke(app, ["submit", str(events_dir / "jobs" / "resnet50.yaml"), *endpoint])
        assert submitted.exit_code == 0, submitted.output
        job_id = submitted.stdout.strip()
        # Then the woken dispatcher admitted it and EC2 started its instance (on the execution's thread)
        assert served.runtime.market is not None
        (launch,) = served.runtime.market.wait_for_launches(1, timeout=20)
        # And status, through the endpoint, names that instance once Launch has recorded it (on the wall
        # clock nothing says when that is: ask until it is there, for at most 20 s)
        give_up = time.monotonic() + 20
        while True:
            status = CliRunner().invoke(app, ["status", job_id, "--json", *endpoint])
            assert status.exit_code == 0, status.output
            attempts = json.loads(status.stdout)["attempts"]
            if (attempts and attempts[0]["instance_id"]) or time.monotonic() > give_up:
                break
            time.sleep(0.2)  # a poll interval: leave the two cores to the Launch it waits for
        assert [a["instance_id"] for a in attempts] == [launch.instance_id]


def test_local_up_runs_the_schedule_and_keeps_a_workerless_launch_from_timing_out(
    synthesized_template: Path, events_dir: Path, resnet50_message: str
) -> None:
    market = price_market(events_dir / "prices" / "us-east-1-example.csv", START + timedelta(hours=1))
    # Given local up at 600x (its 5-minute schedule every half second of wall time)
    with serve_local_stack(
        port=free_port(), template=synthesized_template, market=market, quiet=True, speed=600
    ) as served:
        sqs = boto3.client(
            "sqs",
            endpoint_url=served.endpoint_url,
            region_name=served.stack.region,
            config=Config(retries={"total_max_attempts": 1}),
        )
        sfn = boto3.client("stepfunctions", endpoint_url=served.endpoint_url, region_name=served.stack.region)
        # When a job is sent as `aws sqs send-message` would, with no one invoking the dispatcher
        sqs.send_message(QueueUrl=served.stack.queue_url, MessageBody=resnet50_message)
        # Then the schedule's dispatcher admits it and it is launched
        assert served.runtime.market is not None
        (launch,) = served.runtime.market.wait_for_launches(1, timeout=30)
        assert launch.pool.availability_zone in served.stack.subnets
        # And its execution waits for a heartbeat no worker here sends for 30 days, not the stack's 15 minutes
        (execution,) = sfn.list_executions(stateMachineArn=served.stack.state_machine_arn)["executions"]
        started = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
        assert started["heartbeat_seconds"] == NO_WORKER_HEARTBEAT_SECONDS == 30 * 24 * 3600
