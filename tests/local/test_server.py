"""`spotrelay local up`: the deployed stack behind moto's HTTP server, used the way the AWS CLI or boto3
in another process uses it (through the endpoint URL, not the in-process mock)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from typer.testing import CliRunner
from waiting import POLLING, Polls, eventually

from spotrelay.cli import app
from spotrelay.control.dispatcher import job_id_for
from spotrelay.local.lambdas import REPO_ROOT
from spotrelay.local.server import NO_WORKER_HEARTBEAT_SECONDS, describe, price_market, serve_local_stack
from spotrelay.market import from_scenario_market

from .conftest import START

# `spotrelay status` is a CLI run (a few tens of ms): asked every 0.1 s, at most 1,200 times
STATUS_POLLS = Polls(count=1_200, interval_seconds=0.1)


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
        # And a browser's request (it carries an Origin) is refused: a web page cannot send jobs here
        preflight = urllib.request.Request(
            served.endpoint_url + "/", method="OPTIONS", headers={"Origin": "http://evil.example"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(preflight, timeout=10)
        assert refused.value.code == 403
        # And without workers there is nothing to interrupt, and `local interrupt` says so
        nothing = CliRunner().invoke(app, ["local", "interrupt", "--job", "x", "--endpoint-url", served.endpoint_url])
        assert nothing.exit_code == 1
        assert "runs no workers" in nothing.output
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
        # clock nothing says when that is: ask until it is there)
        def recorded() -> list[dict[str, Any]] | None:
            status = CliRunner().invoke(app, ["status", job_id, "--json", *endpoint])
            assert status.exit_code == 0, status.output
            attempts: list[dict[str, Any]] = json.loads(status.stdout)["attempts"]
            return attempts if attempts and attempts[0]["instance_id"] else None

        attempts = eventually(recorded, "the attempt's instance", on=STATUS_POLLS)
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


TINY_TRAIN = REPO_ROOT / "events" / "jobs" / "tiny_train.py"


@dataclass(frozen=True)
class TinyTrain:
    """A tiny-train job submitted to a `local up` through its endpoint, as a user submits one."""

    job_id: str
    endpoint: list[str]
    instances: Path

    @classmethod
    def submit(cls, served: Any, tmp_path: Path, *, epochs: int, checkpoint: dict[str, Any]) -> TinyTrain:
        endpoint = ["--endpoint-url", served.endpoint_url, "--region", served.stack.region]
        spec = {
            "name": "tiny-train",
            "run": {"command": f"exec {sys.executable} {TINY_TRAIN} --epochs {epochs} --epoch-seconds 0.5"},
            "resources": {"gpus": 1, "gpu_models": ["T4"]},
            "checkpoint": {"dir": "/ckpt", **checkpoint},
            "limits": {"max_price_per_hour": 1.0},
        }
        job_file = tmp_path / "tiny-train.yaml"
        job_file.write_text(json.dumps(spec))
        submitted = CliRunner().invoke(app, ["submit", str(job_file), *endpoint])
        assert submitted.exit_code == 0, submitted.output
        return cls(submitted.stdout.strip(), endpoint, served.workers.root)

    def status(self) -> dict[str, Any]:
        shown = CliRunner().invoke(app, ["status", self.job_id, "--json", *self.endpoint])
        assert shown.exit_code == 0, shown.output
        return dict(json.loads(shown.stdout))

    def ended(self) -> dict[str, Any]:
        terminal = {"SUCCEEDED", "FAILED", "CANCELLED"}
        return eventually(
            lambda: s if (s := self.status())["job"]["state"] in terminal else None, "its end", on=STATUS_POLLS
        )

    def output_of(self, attempt: dict[str, Any]) -> str:
        """What the attempt's job printed (its log file in the instance's scratch directory)."""
        return "\n".join(p.read_text() for p in (self.instances / attempt["instance_id"]).glob("state/*.log"))


def test_local_up_runs_a_job_on_a_real_agent_resumes_it_elsewhere_after_an_interruption_and_after_a_cancel(
    synthesized_template: Path, events_dir: Path, tmp_path: Path
) -> None:
    market = price_market(events_dir / "prices" / "us-east-1-example.csv", START + timedelta(hours=1))
    instances = tmp_path / "instances"
    # Given local up with workers: each instance runs `spotrelay agent`, which runs the job's command here
    with serve_local_stack(
        port=free_port(), template=synthesized_template, market=market, quiet=True, workers=instances
    ) as served:
        job = TinyTrain.submit(served, tmp_path, epochs=40, checkpoint={"interval_minutes": 1, "grace_seconds": 10})
        job_id, status, output_of = job.job_id, job.status, job.output_of

        # When its first instance's job has trained an epoch (its output says so), the user interrupts it
        first = eventually(lambda: next(iter(status()["attempts"]), None), "the first attempt", on=STATUS_POLLS)
        eventually(lambda: "epoch 1/40" in output_of(first), "the job's first epoch", on=POLLING)
        interrupted = CliRunner().invoke(
            app, ["local", "interrupt", "--job", job_id, "--notice", "30s", "--endpoint-url", served.endpoint_url]
        )
        assert interrupted.exit_code == 0, interrupted.output
        assert first["instance_id"] in interrupted.stdout
        # (a second interruption of the same instance is refused: its warning and deadline stand)
        twice = CliRunner().invoke(
            app, ["local", "interrupt", first["instance_id"], "--endpoint-url", served.endpoint_url]
        )
        assert twice.exit_code == 1
        assert "already has its interruption warning: it ends at" in twice.output
        # Then the job goes on on a second instance in another pool, which resumed from the first's checkpoint
        two = eventually(lambda: a[1] if len(a := status()["attempts"]) > 1 else None, "attempt 2", on=STATUS_POLLS)
        eventually(lambda: "resumed from epoch" in output_of(two), "attempt 2 resuming", on=POLLING)
        # When the user cancels it there, and then resumes it (once the first run's execution has ended: until
        # then resume says to try again in a minute)
        cancelled = CliRunner().invoke(app, ["cancel", job_id, *job.endpoint])
        assert cancelled.exit_code == 0, cancelled.output

        def resumed() -> Any:
            result = CliRunner().invoke(app, ["resume", job_id, *job.endpoint])
            return None if result.exit_code == 1 and "is still ending" in result.stderr else result

        again = eventually(resumed, "the resume", on=STATUS_POLLS)
        assert again.exit_code == 0, again.output
        assert f"{job_id} QUEUED again as run 2: it starts from checkpoint attempt " in again.stdout
        # Then the same job runs a third attempt, from the newest checkpoint, and succeeds
        done = job.ended()
        assert (done["job"]["state"], done["job"]["run"]) == ("SUCCEEDED", 2), done
        one, two, three = done["attempts"]
        assert (one["outcome"], two["outcome"], three["outcome"]) == ("INTERRUPTED", "CANCELLED", "SUCCEEDED")
        assert two["pool"] != one["pool"]
        assert "resumed from epoch" in output_of(three)
        assert "epoch 40/40" in output_of(three)
        # And every instance is terminated in moto, their agents gone
        ec2 = served.runtime.ec2
        ids = [a["instance_id"] for a in (one, two, three)]
        states = {
            i["InstanceId"]: i["State"]["Name"]
            for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
            for i in r["Instances"]
        }
        assert set(states.values()) == {"terminated"}
        workers = served.workers
        assert workers is not None
        eventually(lambda: all(i.agent is None for i in workers.instances.values()), "the agents' exit", on=POLLING)
        # And an interruption of the ended job is refused, saying why
        again = CliRunner().invoke(app, ["local", "interrupt", "--job", job_id, "--endpoint-url", served.endpoint_url])
        assert again.exit_code == 1
        assert f"job {job_id} has no running instance" in again.output


def test_a_job_sent_with_the_aws_cli_runs_to_success_and_status_follows_it(
    synthesized_template: Path, events_dir: Path, tmp_path: Path
) -> None:
    # Given local up with workers, and the AWS CLI (v1, the `awscli` package) as the README uses it
    aws = Path(sys.executable).parent / "aws"
    assert aws.exists(), "the awscli package is in the dev extra (pyproject.toml)"
    market = price_market(events_dir / "prices" / "us-east-1-example.csv", START + timedelta(hours=1))
    with serve_local_stack(
        port=free_port(), template=synthesized_template, market=market, quiet=True, workers=tmp_path / "instances"
    ) as served:
        spec = {
            "name": "tiny-train",
            "run": {"command": f"exec {sys.executable} {TINY_TRAIN} --epochs 3 --epoch-seconds 0.2"},
            "resources": {"gpus": 1, "gpu_models": ["T4"]},
            "limits": {"max_price_per_hour": 1.0},
        }
        job_file = tmp_path / "job.json"
        job_file.write_text(json.dumps(spec))
        region = served.stack.region
        environment = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": region,
        }

        def cli(*arguments: str) -> dict[str, Any]:
            ran = subprocess.run(
                [str(aws), "--endpoint-url", served.endpoint_url, "--output", "json", *arguments],
                capture_output=True,
                text=True,
                env=environment,
                timeout=120,
                check=False,
            )
            assert ran.returncode == 0, ran.stderr
            return dict(json.loads(ran.stdout or "{}"))

        # When the job is sent with `aws sqs send-message`, and the dispatcher woken with `aws lambda invoke`
        # (what `spotrelay submit` does; else the 5-minute schedule admits it)
        sent = cli("sqs", "send-message", "--queue-url", served.stack.queue_url, "--message-body", f"file://{job_file}")
        cli("lambda", "invoke", "--function-name", served.stack.functions["dispatcher"], str(tmp_path / "out.json"))
        # Then `spotrelay status --json` follows the job, named from the message id, to SUCCEEDED
        job = TinyTrain(
            job_id_for("tiny-train", sent["MessageId"]),
            ["--endpoint-url", served.endpoint_url, "--region", region],
            tmp_path / "instances",
        )
        done = job.ended()
        assert done["job"]["state"] == "SUCCEEDED", done
        (attempt,) = done["attempts"]
        assert "epoch 3/3" in job.output_of(attempt)


@pytest.mark.parametrize(
    ("arguments", "code", "says"),
    [
        ([], 2, "give an INSTANCE_ID or --job JOB_ID"),
        (["i-0abc", "--job", "train-1"], 2, "give an INSTANCE_ID or --job JOB_ID"),
        (["--job", "train-1", "--notice", "soon"], 2, "--notice: 'soon' is not a duration"),
        (["--job", "train-1", "--notice", "2h"], 2, "--notice: '2h' is not between 1s and 1h"),
        (["--job", "train-1", "--notice", "0s"], 2, "--notice: '0s' is not between 1s and 1h"),
        (["--job", "train-1"], 1, "cannot reach `spotrelay local up` at http://localhost:"),
    ],
)
def test_local_interrupt_says_what_is_wrong(arguments: list[str], code: int, says: str) -> None:
    # (nothing listens on the port of the last case)
    result = CliRunner().invoke(
        app, ["local", "interrupt", *arguments, "--endpoint-url", f"http://localhost:{free_port()}"]
    )
    assert result.exit_code == code, result.output
    assert says in result.output


def test_local_up_with_a_scenarios_market_interrupts_an_instance_whose_capacity_goes(
    synthesized_template: Path, tmp_path: Path
) -> None:
    # Given local up at 10x with a market whose first T4 pool loses its capacity 6 minutes in (36 s of wall time:
    # its warning comes 24 s in, while the job launched after the deploy still trains)
    market = from_scenario_market(
        {
            "prices": [
                {"instance_type": "g4dn.xlarge", "availability_zone": "us-east-1a", "spot_price_usd_per_hour": 0.2},
                {"instance_type": "g4dn.xlarge", "availability_zone": "us-east-1b", "spot_price_usd_per_hour": 0.3},
            ],
            "outages": [
                {"instance_type": "g4dn.xlarge", "availability_zone": "us-east-1a", "from": "2.5m", "to": "3h"}
            ],
        },
        tmp_path,
        datetime.now(UTC),
    )
    instances = tmp_path / "instances"
    with serve_local_stack(
        port=free_port(), template=synthesized_template, market=market, quiet=True, workers=instances, speed=10
    ) as served:
        job = TinyTrain.submit(served, tmp_path, epochs=80, checkpoint={"interval_minutes": 60, "grace_seconds": 30})

        # When the market takes the first pool's capacity back, with no one interrupting by hand
        done = job.ended()
        # Then the instance got its warning two minutes before (at 10x: 12 s), the job moved to the other pool,
        # resumed from its final checkpoint there, and succeeded
        assert done["job"]["state"] == "SUCCEEDED", done
        one, two = done["attempts"]
        assert (one["pool"]["availability_zone"], one["outcome"]) == ("us-east-1a", "INTERRUPTED")
        assert two["pool"]["availability_zone"] == "us-east-1b"

        assert "epoch 80/80" in job.output_of(two)
        if "epoch 1/80" in job.output_of(one):  # (a machine slow enough to launch after the warning: it started afresh)
            assert "resumed from epoch" in job.output_of(two)
