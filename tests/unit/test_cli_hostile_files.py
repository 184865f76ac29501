"""Hostile or huge files given to `spotrelay submit`, `place` and `replay`: what a user sees is one error
line and exit status 2 (their input to fix), never a traceback, a hang or a message SQS refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_aws_stack import Queue
from typer.testing import CliRunner, Result

from spotrelay.aws.deployed_stack import SQS_MESSAGE_MAX_BYTES, JobsClient, deployed_stack
from spotrelay.cli import app, job_submit

MINIMAL = "name: train\nrun: {command: python train.py}\nresources: {gpus: 1}\n"
BILLION_LAUGHS = (
    MINIMAL
    + "defaults:\n"
    + '  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    + "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
)
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"

HOSTILE_JOB_FILES: list[Any] = [
    pytest.param("bomb.yaml", BILLION_LAUGHS.encode(), "more than 10,000 keys and values", id="billion-laughs"),
    pytest.param("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested more than 32 levels deep", id="deep-json"),
    pytest.param("deep.yaml", b"name: " + b"[" * 5_000 + b"]" * 5_000, "nested more than 32 levels", id="deep-yaml"),
    pytest.param("key.yaml", (MINIMAL + "tags: {? [a, b] : c}\n").encode(), "a key is one word", id="complex-key"),
    pytest.param("wide.json", json.dumps({f"k{i}": i for i in range(30_000)}).encode(), "more than", id="wide"),
    pytest.param("job.yaml", PNG, "a binary file", id="binary"),
    pytest.param("job.yaml", b"name: caf\xe9\n", "not UTF-8 text", id="latin-1"),
    pytest.param("huge.yaml", MINIMAL.encode() + b"#" * (10 * 1024 * 1024), "larger than 1 MiB", id="10-MB"),
    pytest.param(
        "inf.yaml", (MINIMAL + "work_hours: .inf\n").encode(), "work_hours: Input should be a finite", id="inf"
    ),
]


def assert_one_line_error(result: Result, starts: str, says: str) -> None:
    """The command refused its input: exit 2, one `error:` line on stderr, nothing on stdout."""
    assert result.exit_code == 2, (result.exception, result.stderr)
    assert isinstance(result.exception, SystemExit)  # not an exception the command let through
    assert result.stderr.startswith(f"error: {starts}")
    assert result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr
    assert result.stdout == ""


class CloudFormation:
    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": "QueueUrl", "OutputValue": "https://queue"}]
        return {"Stacks": [{"StackStatus": "CREATE_COMPLETE", "Outputs": outputs}]}


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Queue:
    """The stack `submit` reaches: its queue records what is sent."""
    sent = Queue()
    stack = deployed_stack(CloudFormation(), "SpotRelay")
    client = JobsClient(stack, sqs=sent, lambda_=None, logs=None, dynamodb=None)  # type: ignore[arg-type]
    monkeypatch.setattr(job_submit, "connect", lambda *a: client)
    return sent


@pytest.mark.parametrize(("name", "data", "says"), HOSTILE_JOB_FILES)
def test_place_refuses_a_hostile_job_file_in_one_line(
    tmp_path: Path, events_dir: Path, name: str, data: bytes, says: str
) -> None:
    # Given a hostile job file
    job_file = tmp_path / name
    job_file.write_bytes(data)

    # When `place` ranks pools for it
    result = CliRunner().invoke(
        app, ["place", str(job_file), "--prices", str(events_dir / "prices" / "us-east-1-example.csv")]
    )

    # Then it is the one-line error naming the file, exit 2
    assert_one_line_error(result, f"{job_file}: ", says)


@pytest.mark.parametrize(("name", "data", "says"), HOSTILE_JOB_FILES)
def test_submit_refuses_a_hostile_job_file_and_sends_nothing(
    tmp_path: Path, queue: Queue, name: str, data: bytes, says: str
) -> None:
    job_file = tmp_path / name
    job_file.write_bytes(data)
    result = CliRunner().invoke(app, ["submit", str(job_file), "--no-wake"])
    assert_one_line_error(result, f"{job_file}: ", says)
    assert queue.sent == []


def test_submit_refuses_a_binary_spec_on_stdin(queue: Queue) -> None:
    result = CliRunner().invoke(app, ["submit", "-", "--no-wake"], input=PNG)
    assert_one_line_error(result, "stdin: ", "a binary file")
    assert queue.sent == []


def test_submit_refuses_a_spec_sqs_would_refuse_and_sends_nothing(tmp_path: Path, queue: Queue) -> None:
    # Given a valid spec, smaller than the 1 MiB a job file may be, whose queue message is larger than SQS takes
    job_file = tmp_path / "job.yaml"
    big = "x" * (SQS_MESSAGE_MAX_BYTES + 1)
    job_file.write_text(MINIMAL.replace("run: {command: python train.py}", f'run: {{command: "{big}"}}'))

    # When it is submitted
    result = CliRunner().invoke(app, ["submit", str(job_file), "--no-wake"])

    # Then it is refused before it is sent, saying why, as a spec error is (exit 2)
    assert_one_line_error(
        result, "job train is ", f"bytes as a queue message, more than SQS takes ({SQS_MESSAGE_MAX_BYTES:,})"
    )
    assert queue.sent == []
    # while a spec of a few hundred bytes is sent
    job_file.write_text(MINIMAL)
    assert CliRunner().invoke(app, ["submit", str(job_file), "--no-wake"]).exit_code == 0
    assert len(queue.sent) == 1


def test_place_refuses_a_binary_price_file_naming_it(tmp_path: Path, events_dir: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_bytes(b"instance_type,availability_zone\n\xff\xfe\x00")
    result = CliRunner().invoke(app, ["place", str(events_dir / "jobs" / "resnet50.yaml"), "--prices", str(prices)])
    assert_one_line_error(result, f"{prices}: not UTF-8 text", "a CSV file is text")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(PNG, "a binary file, not a scenario", id="binary"),
        pytest.param(b"name: caf\xe9\n", "not UTF-8 text", id="latin-1"),
        pytest.param(BILLION_LAUGHS.encode(), "more than 50,000 keys and values", id="billion-laughs"),
        pytest.param(b"name: " + b"[" * 5_000, "nested more than 32 levels deep", id="deep"),
    ],
)
def test_replay_refuses_a_hostile_scenario_file_in_one_line(tmp_path: Path, data: bytes, says: str) -> None:
    pytest.importorskip("moto")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_bytes(data)
    result = CliRunner().invoke(app, ["replay", str(scenario)])
    assert_one_line_error(result, f"{scenario}: ", says)


def test_replay_refuses_a_binary_job_or_events_file_a_scenario_names(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    (tmp_path / "job.yaml").write_bytes(PNG)
    (tmp_path / "events.jsonl").write_bytes(PNG)
    scenario = tmp_path / "scenario.yaml"
    body = "name: s\nstart: 2026-11-30T00:00:00Z\nmarket: {}\njobs:\n  - {at: 0m, spec: {file: job.yaml}}\n"
    scenario.write_text(body)
    result = CliRunner().invoke(app, ["replay", str(scenario)])
    assert_one_line_error(result, f"jobs[0].spec.file: {tmp_path / 'job.yaml'}: ", "a binary file")

    scenario.write_text(
        body.replace("spec: {file: job.yaml}", "spec: {name: a, run: {command: x}, resources: {gpus: 1}}")
        + "events:\n  - {file: events.jsonl}\n"
    )
    result = CliRunner().invoke(app, ["replay", str(scenario)])
    assert_one_line_error(result, f"events[0].file: {tmp_path / 'events.jsonl'}: ", "a binary file")
