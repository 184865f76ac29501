"""`spotrelay submit / status / ls / logs / cost / wait / cancel` against the deployed stack (in moto, the
handlers in-process, on the virtual clock), found by the stack's name alone, as a user runs them after
`cdk deploy`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from spotrelay.agent.logs import JobLogger, ship_to_cloudwatch
from spotrelay.aws.store import DynamoJobStore
from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.cli import app, job_cost_report, job_list, job_logs, job_status, job_wait
from spotrelay.clock import ClockEvent, ClockThread
from spotrelay.config import TAG_JOB_ID
from spotrelay.control.vend import attempt_log_stream
from spotrelay.local import LocalRuntime, LocalStack, VirtualClock
from spotrelay.market import MarketBuilder
from spotrelay.models import JobState

from .conftest import EXAMPLE_PRICES, SEED, START


def deployed(runtime: LocalRuntime) -> LocalStack:
    assert runtime.stack is not None
    return runtime.stack


def run(clock: VirtualClock, *args: str, stdin: str | None = None) -> Any:
    """The command as a user runs it, then the clock runs whatever it set off (the dispatcher it woke)."""
    with clock.exclusive():
        result = CliRunner().invoke(app, list(args), input=stdin)
    clock.wait_quiescent()
    return result


def count_to(monkeypatch: pytest.MonkeyPatch, clock: VirtualClock) -> None:
    """The commands' `utc_now` (the time costs count to, and `logs --since` from) the virtual clock's now."""
    for module in (job_status, job_list, job_cost_report, job_logs):
        monkeypatch.setattr(module, "utc_now", clock.now)


def submit(clock: VirtualClock, job_file: Path) -> str:
    result = run(clock, "submit", str(job_file), "--stack", "SpotRelay")
    assert result.exit_code == 0, result.output
    return str(result.stdout.strip())


def test_submit_admits_and_launches_the_job_and_status_shows_where_it_runs(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path
) -> None:
    # When a user submits the example job by the stack's name (no alarm event: submit wakes the dispatcher)
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    # Then the job was admitted and launched on the cheapest pool, under the id submit printed
    (launch,) = runtime.market_launches()
    assert launch.tags[TAG_JOB_ID] == job_id
    assert (launch.pool.offering, launch.at) == ("g6.xlarge:us-east-1a", START)
    # And status says so: the state, the attempt's pool and instance, from the job table
    status = run(clock, "status", job_id, "--json")
    assert status.exit_code == 0, status.output
    answer = json.loads(status.stdout)
    assert answer["job"]["state"] == "LAUNCHING"
    (attempt,) = answer["attempts"]
    assert (attempt["pool"]["instance_type"], attempt["pool"]["availability_zone"]) == ("g6.xlarge", "us-east-1a")
    assert attempt["instance_id"] == launch.instance_id
    assert "task_token" not in attempt
    text = run(clock, "status", job_id).stdout
    assert f"attempt 1 on g6.xlarge in us-east-1a, spot at $0.350/h, {launch.instance_id}" in text
    # And ls lists it
    listed = json.loads(run(clock, "ls", "--json").stdout)
    assert [(j["job_id"], j["state"]) for j in listed] == [(job_id, "LAUNCHING")]
    assert listed[0]["submitted_at"] == answer["job"]["submitted_at"]  # one way to write a time in every --json


def test_cancel_terminates_the_instance_and_ls_keeps_the_job_under_all(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path
) -> None:
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    (launch,) = runtime.market_launches()
    # When the user cancels it
    result = run(clock, "cancel", job_id)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{job_id} CANCELLED; terminated {launch.instance_id}"
    # Then its instance is terminated and its record CANCELLED
    described = runtime.ec2.describe_instances(InstanceIds=[launch.instance_id])
    assert described["Reservations"][0]["Instances"][0]["State"]["Name"] == "terminated"
    job, _ = DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb).get_job(job_id)
    assert job.state is JobState.CANCELLED
    # And cancelling again changes nothing and says so
    again = run(clock, "cancel", job_id)
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == f"{job_id} had already ended: CANCELLED"
    # And ls shows live jobs only; --all the ended one too
    assert json.loads(run(clock, "ls", "--json").stdout) == []
    listed = json.loads(run(clock, "ls", "--all", "--json").stdout)
    assert [(j["job_id"], j["state"]) for j in listed] == [(job_id, "CANCELLED")]


def test_resume_starts_a_cancelled_job_again_under_its_id_as_a_new_run(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, recorded_event: Callable[..., dict[str, Any]]
) -> None:
    # Given a job the user cancelled on its first instance
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    (first,) = runtime.market_launches()
    assert run(clock, "cancel", job_id).exit_code == 0
    # While its instance's end is not reported, its bill is not settled, and its limits.max_total_cost needs it
    early = run(clock, "resume", job_id)
    assert early.exit_code == 1
    assert "the bill of its attempt 1 is not settled yet" in early.stderr
    # Then EC2 reports the instance terminated (the runtime plays no instance here: the test is EC2)
    with clock.exclusive():
        runtime.put_event(recorded_event("instance-state-change-terminated", instance_id=first.instance_id))
    clock.wait_quiescent()
    # When the user resumes it
    clock.advance_by(600)
    result = run(clock, "resume", job_id)
    # Then it is queued again as run 2 (from the start: it never checkpointed), and the dispatcher it woke
    # admitted it under a new execution, which launched a new instance for attempt 2
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().startswith(f"{job_id} QUEUED again as run 2: it starts from the start")
    first_launch, second = runtime.market_launches()
    assert first_launch.instance_id == first.instance_id
    assert second.tags[TAG_JOB_ID] == job_id
    status = json.loads(run(clock, "status", job_id, "--json").stdout)
    assert (status["job"]["state"], status["job"]["run"]) == ("LAUNCHING", 2)
    assert [(a["attempt"], a["outcome"]) for a in status["attempts"]] == [(1, "CANCELLED"), (2, None)]
    assert status["attempts"][1]["instance_id"] == second.instance_id
    executions = runtime.sfn.list_executions(stateMachineArn=deployed(runtime).state_machine_arn)["executions"]
    assert {e["name"]: e["status"] for e in executions}[f"{job_id}-run2"] == "RUNNING"
    assert (
        f"run 2: resumed at {START + timedelta(seconds=600):%Y-%m-%d %H:%M} UTC" in run(clock, "status", job_id).stdout
    )
    # And resuming it again changes nothing and says so; a live job that was never resumed is refused
    again = run(clock, "resume", job_id)
    assert again.exit_code == 0, again.output
    assert again.stdout.strip().startswith(f"{job_id} was resumed already: run 2, LAUNCHING")
    other = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    refused = run(clock, "resume", other)
    assert refused.exit_code == 1
    assert f"error: {other} not resumed: it is LAUNCHING: only a FAILED or CANCELLED job resumes" in refused.stderr
    # And a job id that cannot be one is a usage error
    wrong = run(clock, "resume", "not-a-job")
    assert wrong.exit_code == 2
    assert "a job id ends in - and 12 hex digits" in wrong.stderr


def test_status_of_a_waiting_job_says_why_and_until_when(
    runtime: LocalRuntime, clock: VirtualClock, tmp_path: Path
) -> None:
    # Given a job whose price cap no pool meets (the cheapest pool that fits is $0.35/h)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "name: cheap\nrun: {command: python train.py}\nresources: {gpus: 1}\nwork_hours: 1\n"
        "limits: {max_price_per_hour: 0.05, max_wait_hours: 6}\n"
    )
    # When it is submitted and a user asks for its status
    job_id = submit(clock, job_file)
    text = run(clock, "status", job_id).stdout
    # Then it is WAITING, and says why (the cap, and what the cheapest pool costs) and when it gives up
    assert f"{job_id}  WAITING" in text
    assert "waiting since" in text
    assert "price-cap (cheapest: g6.xlarge in us-east-1a (spot): $0.3500/h is above max_price_per_hour $0.05)" in text
    until = START + timedelta(hours=6)
    assert f"at {until:%Y-%m-%d %H:%M} UTC (limits.max_wait_hours 6)" in text
    assert json.loads(run(clock, "status", job_id, "--json").stdout)["job"]["waiting_reason"].startswith("no pool")


def test_an_invalid_job_is_refused_before_anything_is_sent(
    runtime: LocalRuntime, clock: VirtualClock, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: train\nrun: {command: python train.py}\nresources: {gpus: 9}\n")
    result = run(clock, "submit", str(job_file))
    # Then the error names the file, the field and what is allowed, and the queue stayed empty
    assert result.exit_code == 2
    assert f"{job_file}: resources.gpus: no EC2 GPU instance type has 9 GPUs; allowed 1..8" in result.stderr
    queue = runtime.sqs.get_queue_attributes(
        QueueUrl=deployed(runtime).queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    assert queue["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert runtime.market_launches() == []


def test_submit_reads_the_spec_from_stdin_with_a_dash(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path
) -> None:
    # A bad spec piped in is refused, named as stdin
    refused = run(clock, "submit", "-", stdin="name: train\nrun: {command: python train.py}\nresources: {gpus: 9}\n")
    assert refused.exit_code == 2
    assert "stdin: resources.gpus: no EC2 GPU instance type has 9 GPUs" in refused.stderr
    # A good one is submitted and launched, as from a file
    spec = (events_dir / "jobs" / "resnet50.yaml").read_text()
    job_id = run(clock, "submit", "-", "--stack", "SpotRelay", stdin=spec).stdout.strip()
    (launch,) = runtime.market_launches()
    assert launch.tags[TAG_JOB_ID] == job_id


def test_an_unknown_job_or_stack_is_a_one_line_error(runtime: LocalRuntime, clock: VirtualClock) -> None:
    unknown_job = run(clock, "status", "nope-0123456789ab")
    assert unknown_job.exit_code == 2
    assert unknown_job.stderr.startswith("error: no job nope-0123456789ab in stack SpotRelay: not submitted there, or")
    # a job's name is not its id: say what an id looks like
    by_name = run(clock, "status", "resnet50")
    assert by_name.exit_code == 2
    assert "a job id ends in - and 12 hex digits, as `spotrelay submit` printed it" in by_name.stderr
    unknown_stack = run(clock, "ls", "--stack", "Elsewhere")
    assert unknown_stack.exit_code == 2
    assert unknown_stack.stderr.startswith("error: cannot read stack Elsewhere in us-east-1: ")
    assert "(another stack name: --stack NAME or SPOTRELAY_STACK; another region: --region)" in unknown_stack.stderr


def test_a_job_cancelled_while_its_message_is_in_the_queue_never_runs(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path
) -> None:
    # Given a job submitted without waking the dispatcher: its message waits in the queue, it has no record
    job_file = str(events_dir / "jobs" / "resnet50.yaml")
    queued = run(clock, "submit", job_file, "--stack", "SpotRelay", "--no-wake").stdout.strip()
    assert run(clock, "status", queued).exit_code == 2
    # When the user cancels it by the id submit printed
    cancelled = run(clock, "cancel", queued)
    # Then the cancel is taken, and says it applies when the message is read
    assert cancelled.exit_code == 0, cancelled.output
    assert f"{queued} has no record yet" in cancelled.stdout
    # And when the dispatcher reads it (woken by the next submission), the job is recorded CANCELLED and
    # never launched; the other job runs
    other = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    status = json.loads(run(clock, "status", queued, "--json").stdout)
    assert status["job"]["state"] == "CANCELLED"
    assert status["job"]["failure_reason"] == "JobCancelled: cancelled by the user before it was admitted"
    assert status["attempts"] == []
    assert [launch.tags[TAG_JOB_ID] for launch in runtime.market_launches()] == [other]
    # And cancelling it again says it had ended
    again = run(clock, "cancel", queued)
    assert again.stdout.strip() == f"{queued} had already ended: CANCELLED"


def test_logs_prints_the_jobs_output_as_written_and_the_agents_lines_across_attempts(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    agent_logger = logging.getLogger("test_cli_jobs.agent")  # the agent's lines, as its logger makes them
    monkeypatch.setattr(agent_logger, "level", logging.INFO)
    monkeypatch.setattr(agent_logger, "propagate", False)
    # Given two attempts' agents that shipped their lines to the stack's log group (the agent's own code)
    group = deployed(runtime).outputs["AgentLogGroupName"]
    shipped = ((job_id, 1, ["epoch 1 loss 0.91"]), (job_id, 2, ["resumed at epoch 2", "epoch 2 loss 0.55"]))
    another_job = (f"{job_id}0", 1, ["another job's line"])  # its id starts with this one's
    for job, attempt, lines in (*shipped, another_job):
        stream = attempt_log_stream(job, attempt)
        handler = ship_to_cloudwatch(runtime.client("logs"), group, stream, logger=agent_logger)
        log = JobLogger(job, attempt, agent_logger)
        try:
            log.info("job started", extra={"pid": 100 + attempt})
            for line in lines:
                log.info("job output", extra={"line": line})
        finally:
            handler.close()
            agent_logger.removeHandler(handler)
    # When the user asks for the job's logs
    result = run(clock, "logs", job_id)
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    # Then the job's lines are as it printed them, the agents' lines are marked, attempt by attempt
    assert [line for line in printed if not line.startswith("[spotrelay ")] == [
        "epoch 1 loss 0.91",
        "resumed at epoch 2",
        "epoch 2 loss 0.55",
    ]
    started = [line for line in printed if line.startswith("[spotrelay ")]
    assert len(started) == 2
    assert started[0].endswith("#1] job started (pid=101)")
    assert started[1].endswith("#2] job started (pid=102)")
    # And --job-output keeps the job's lines only, --attempt one attempt's
    only_output = run(clock, "logs", job_id, "--job-output", "--attempt", "2")
    assert only_output.stdout.splitlines() == ["resumed at epoch 2", "epoch 2 loss 0.55"]
    # And following a job that has ended prints its lines once and returns
    assert run(clock, "cancel", job_id).exit_code == 0
    followed = run(clock, "logs", job_id, "--follow", "--job-output")
    assert followed.exit_code == 0, followed.output
    assert followed.stdout.splitlines() == ["epoch 1 loss 0.91", "resumed at epoch 2", "epoch 2 loss 0.55"]


def test_cost_counts_the_live_instance_to_now_against_the_same_hours_on_on_demand(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_to(monkeypatch, clock)  # costs count to the virtual clock's now
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    (launch,) = runtime.market_launches()
    # Given the job's instance has run for an hour (its agent heartbeating)
    token = DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb).attempts(job_id)[-1].task_token
    assert token is not None
    while clock.now() < START + timedelta(hours=1):
        clock.advance_to(min(START + timedelta(hours=1), clock.now() + timedelta(minutes=5)))
        with clock.exclusive():
            runtime.sfn.send_task_heartbeat(taskToken=token)
        clock.wait_quiescent()
    # When the user asks what it cost
    answer = json.loads(run(clock, "cost", "--json").stdout)
    # Then it is the hour at the spot price, against the hour at g6.xlarge's on-demand price
    on_demand, spot = INSTANCE_TYPES["g6.xlarge"].on_demand_usd_per_hour, launch.spot_price
    assert on_demand is not None
    assert spot is not None
    (job,) = answer["jobs"]
    assert job["job_id"] == job_id
    assert job["cost_usd"] == pytest.approx(spot)
    assert job["on_demand_cost_usd"] == pytest.approx(on_demand)
    assert answer["total"]["saved_usd"] == pytest.approx(on_demand - spot)
    # And the table says the same, with the totals at the foot
    table = run(clock, "cost")
    assert table.exit_code == 0, table.output
    saved = f"{(on_demand - spot) / on_demand:.0%}"
    totals = [row for row in table.stdout.splitlines() if "1 job(s)" in row]
    assert len(totals) == 1
    assert [cell.strip() for cell in totals[0].strip("│ ").split("│")] == [
        "1 job(s)",
        "",
        f"{spot:.2f}",
        f"{on_demand:.2f}",
        f"{on_demand - spot:.2f}",
        saved,
    ]
    # And status says the same in words
    text = run(clock, "status", job_id).stdout
    assert f"cost ${spot:.2f} (${spot:.2f} of it on the live instance), " in text
    assert f"${on_demand:.2f} on on-demand ({saved} saved)" in text


@pytest.fixture
def rising_runtime(synthesized_template: Path, clock: VirtualClock) -> Iterator[LocalRuntime]:
    """The stack on the example market, where g6.xlarge in us-east-1a (the cheapest pool) goes from $0.35/h to
    $0.70/h a quarter of an hour in."""
    market = MarketBuilder(START)
    for instance_type, zone, price in EXAMPLE_PRICES:
        market.add_price(instance_type, zone, price)
    market.add_price("g6.xlarge", "us-east-1a", 0.70, at=START + timedelta(minutes=15))
    with LocalRuntime(clock=clock, market=market.build(), seed=SEED) as local:
        local.deploy(synthesized_template)
        yield local


def test_cost_and_status_count_a_live_instance_at_the_spot_prices_in_effect_and_say_it_is_an_estimate(
    rising_runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_to(monkeypatch, clock)
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    (launch,) = rising_runtime.market_launches()
    assert (launch.pool.offering, launch.spot_price) == ("g6.xlarge:us-east-1a", 0.35)
    # Given the job's instance has run for an hour, its pool's spot price doubled 15 minutes in
    token = DynamoJobStore(deployed(rising_runtime).table_name, rising_runtime.dynamodb).attempts(job_id)[-1].task_token
    assert token is not None
    while clock.now() < START + timedelta(hours=1):
        clock.advance_to(min(START + timedelta(hours=1), clock.now() + timedelta(minutes=5)))
        with clock.exclusive():
            rising_runtime.sfn.send_task_heartbeat(taskToken=token)
        clock.wait_quiescent()
    # When the user asks what it cost
    result = run(clock, "cost", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    # Then the live instance counts a quarter hour at $0.35 and three at $0.70, not the hour at its launch price,
    # and the figure says it is an estimate
    spent = 0.25 * 0.35 + 0.75 * 0.70
    (job,) = answer["jobs"]
    assert job["cost_usd"] == pytest.approx(spent)
    assert job["cost_is_estimate"] is True
    assert answer["total"]["cost_usd"] == pytest.approx(spent)
    assert answer["total"]["cost_is_estimate"] is True
    # And the table marks the job's cost and says why
    table = run(clock, "cost").stdout
    (row,) = [line for line in table.splitlines() if job_id in line]
    assert f"{spent:.2f}*" in row
    assert "* an estimate: a live instance, counted at the spot prices in effect from its launch to now" in table
    # And status says the same, with the price now
    text = run(clock, "status", job_id).stdout
    assert f"cost ${spent:.2f} (${spent:.2f} of it on the live instance), " in text
    assert (
        "the live instance's cost is an estimate, the spot prices in effect from its launch to now ($0.700/h now): "
        "final once the instance is gone"
    ) in text
    status = json.loads(run(clock, "status", job_id, "--json").stdout)
    assert status["running_cost_usd"] == pytest.approx(spent)
    assert status["cost_usd"] == pytest.approx(spent)
    assert status["cost_is_estimate"] is True


class DrivenClock:
    """The clock `wait` counts on, driven by the test: each sleep first plays the next of `steps` (the agent
    reporting, the dispatcher's schedule) as the driver, then moves the virtual clock on by the sleep. No
    step left: the time passes and nothing happens."""

    def __init__(self, clock: VirtualClock, *steps: Callable[[], None]) -> None:
        self.clock = clock
        self.steps = list(steps)
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self.clock.now()

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.steps:
            self.steps.pop(0)()
        self.clock.advance_by(seconds)

    def event(self) -> ClockEvent:
        return self.clock.event()

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockThread:
        return self.clock.start_thread(name, target)


def waited(clock: VirtualClock, *args: str) -> Any:
    """A command that waits (`wait`, `submit --wait`), its clock driving the system as it polls: the driver
    holds the baton only in each step (a `run` holds it throughout)."""
    clock.wait_quiescent()
    result = CliRunner().invoke(app, list(args))
    clock.wait_quiescent()
    return result


def task_token(runtime: LocalRuntime, job_id: str) -> str:
    """What the job's agent reads: the task token of its latest attempt."""
    token = DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb).attempts(job_id)[-1].task_token
    assert token is not None
    return token


def agent_reports(runtime: LocalRuntime, clock: VirtualClock, job_id: str, exit_code: int) -> Callable[[], None]:
    """A step: the job's agent reports that the job exited with `exit_code`, as the agent does."""

    def report() -> None:
        token = task_token(runtime, job_id)
        with clock.exclusive():
            if exit_code == 0:
                runtime.sfn.send_task_success(taskToken=token, output=json.dumps({"exit_code": 0}))
            else:
                cause = json.dumps({"exit_code": exit_code, "log_tail": "CUDA out of memory"})
                runtime.sfn.send_task_failure(taskToken=token, error="JobFailed", cause=cause)
        clock.wait_quiescent()

    return report


def state_of(runtime: LocalRuntime, job_id: str) -> JobState:
    job, _ = DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb).get_job(job_id)
    return job.state


@pytest.fixture
def no_restart_job(tmp_path: Path) -> Path:
    """A job whose code failing fails it (no restarts)."""
    job_file = tmp_path / "fragile.yaml"
    job_file.write_text(
        "name: fragile\nrun: {command: python train.py}\nresources: {gpus: 1}\nlimits: {max_restarts: 0}\n"
        "tags: {team: speech}\n"
    )
    return job_file


def test_wait_prints_each_job_as_it_ends_and_exits_1_when_one_failed(
    runtime: LocalRuntime,
    clock: VirtualClock,
    events_dir: Path,
    no_restart_job: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given two running jobs: the first succeeds at the second poll, the other's code fails at the third
    first = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    second = submit(clock, no_restart_job)
    driven = DrivenClock(
        clock, lambda: None, agent_reports(runtime, clock, first, 0), agent_reports(runtime, clock, second, 3)
    )
    monkeypatch.setattr(job_wait, "command_clock", lambda: driven)
    # When the user waits for both (the first given twice)
    result = waited(clock, "wait", first, second, first)
    # Then each job's line came as it ended: its state, and why the failed one failed; exit 1
    assert result.exit_code == 1, result.output
    # (the reason as Recover wrote it, from the cause the agent's SendTaskFailure carried: its exit code)
    failed, _ = DynamoJobStore(deployed(runtime).table_name, runtime.dynamodb).get_job(second)
    assert failed.failure_reason is not None
    assert failed.failure_reason.startswith("JobFailed: the job exited with code 3 on attempt 1")
    assert result.stdout.splitlines() == [f"{first} SUCCEEDED", f"{second} FAILED: {failed.failure_reason}"]
    assert "waiting for 2 job(s) to end, reading their records every 5 s" in result.stderr
    # polled every 5 s, on the clock it was given: the records read after each step
    assert driven.slept == [5.0, 5.0, 5.0]
    assert (state_of(runtime, first), state_of(runtime, second)) == (JobState.SUCCEEDED, JobState.FAILED)
    # And waiting again for the one that succeeded answers at once, exit 0, with the JSON line when asked
    again = waited(clock, "wait", first, "--json")
    assert again.exit_code == 0, again.output
    (answer,) = [json.loads(line) for line in again.stdout.splitlines()]
    assert answer == {
        "job_id": first,
        "state": "SUCCEEDED",
        "failure_reason": None,
        "ended_at": (START + timedelta(seconds=5)).isoformat().replace("+00:00", "Z"),  # at the second sleep
        "timed_out": False,
    }
    assert driven.slept == [5.0, 5.0, 5.0]


def test_wait_gives_up_at_its_timeout_and_says_which_job_is_still_running(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    driven = DrivenClock(clock)
    monkeypatch.setattr(job_wait, "command_clock", lambda: driven)
    # When the user waits at most 12 s, polling every 5 s, for a job that goes on running
    result = waited(clock, "wait", job_id, "--timeout", "12s")
    # Then the wait stops at 12 s (the last sleep cut to the deadline), exit 1, and says where the job is
    assert result.exit_code == 1, result.output
    assert driven.slept == [5.0, 5.0, 2.0]
    assert result.stdout.splitlines() == [f"{job_id} still LAUNCHING: not ended within --timeout 12s"]
    assert state_of(runtime, job_id) is JobState.LAUNCHING
    # And as JSON, the same in a line
    as_json = waited(clock, "wait", job_id, "--timeout", "0", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout) == {
        "job_id": job_id,
        "state": "LAUNCHING",
        "failure_reason": None,
        "ended_at": None,
        "timed_out": True,
    }


def test_submit_wait_waits_for_the_dispatcher_to_record_the_job_then_for_its_end(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a submission that does not wake the dispatcher: the job has no record until its schedule runs
    def schedule() -> None:
        with clock.exclusive():
            for rule in deployed(runtime).schedule_rules:
                runtime.fire_schedule(rule)
        clock.wait_quiescent()

    driven = DrivenClock(clock, schedule)
    monkeypatch.setattr(job_wait, "command_clock", lambda: driven)

    def job_succeeds() -> None:  # once launched, the job's agent reports success
        (launch,) = runtime.market_launches()
        agent_reports(runtime, clock, launch.tags[TAG_JOB_ID], 0)()

    driven.steps.append(job_succeeds)
    # When the user submits it with --wait
    result = waited(clock, "submit", str(events_dir / "jobs" / "resnet50.yaml"), "--no-wake", "--wait")
    # Then it printed the job id, waited through its time in the queue, and its end: exit 0
    assert result.exit_code == 0, result.output
    job_id, ended = result.stdout.splitlines()
    assert ended == f"{job_id} SUCCEEDED"
    assert state_of(runtime, job_id) is JobState.SUCCEEDED
    assert driven.slept == [5.0, 5.0]


def test_cancel_of_many_jobs_cancels_each_and_says_which_it_could_not(
    runtime: LocalRuntime, clock: VirtualClock, events_dir: Path, no_restart_job: Path
) -> None:
    first = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    second = submit(clock, no_restart_job)
    first_launch, second_launch = runtime.market_launches()
    # When the user cancels both, with a mistyped id between them
    result = run(clock, "cancel", first, "fragile-0123", second)
    # Then both are cancelled, each on its line, and the mistyped id is the error line: exit 2
    assert result.exit_code == 2, result.output
    assert result.stdout.splitlines() == [
        f"{first} CANCELLED; terminated {first_launch.instance_id}",
        f"{second} CANCELLED; terminated {second_launch.instance_id}",
    ]
    assert result.stderr.splitlines() == [
        "error: fragile-0123 not cancelled: no job fragile-0123: a job id ends in - and 12 hex digits, as "
        "`spotrelay submit` printed it"
    ]
    assert (state_of(runtime, first), state_of(runtime, second)) == (JobState.CANCELLED, JobState.CANCELLED)
    # And cancelling them again changes nothing: a JSON line each, exit 0
    again = run(clock, "cancel", first, second, "--json")
    assert again.exit_code == 0, again.output
    answers = [json.loads(line) for line in again.stdout.splitlines()]
    assert [(a["job_id"], a["already_ended"], a["state"]) for a in answers] == [
        (first, True, "CANCELLED"),
        (second, True, "CANCELLED"),
    ]


def test_ls_filters_by_state_and_tag_and_shows_name_pool_and_cost_so_far(
    runtime: LocalRuntime,
    clock: VirtualClock,
    events_dir: Path,
    no_restart_job: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count_to(monkeypatch, clock)  # costs count to the virtual clock's now
    # Given a vision job an hour on its spot instance, and a speech job cancelled at once
    vision = submit(clock, events_dir / "jobs" / "resnet50.yaml")
    speech = submit(clock, no_restart_job)
    assert run(clock, "cancel", speech).exit_code == 0
    token = task_token(runtime, vision)
    while clock.now() < START + timedelta(hours=1):
        clock.advance_to(min(START + timedelta(hours=1), clock.now() + timedelta(minutes=5)))
        with clock.exclusive():
            runtime.sfn.send_task_heartbeat(taskToken=token)
        clock.wait_quiescent()
    # When the user lists the vision team's jobs
    listed = run(clock, "ls", "--tag", "team=vision", "--json")
    # Then it is the live one, with its name, pool and cost so far (an estimate: the instance runs)
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert (row["job_id"], row["name"], row["state"], row["tags"]) == (
        vision,
        "resnet50",
        "LAUNCHING",
        {"team": "vision"},
    )
    assert row["pool"] == {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "market": "spot"}
    assert row["cost_usd"] == pytest.approx(0.35)
    assert row["cost_is_estimate"] is True
    # And the table shows the same
    table = run(clock, "ls", "--tag", "team=vision", "--state", "launching").stdout
    (id_line,) = [line for line in table.splitlines() if vision in line]
    assert id_line.split() == [vision, "LAUNCHING", "g6.xlarge", "0.35*", "11-30"]
    assert "resnet50" in table
    assert "us-east-1a" in table
    # And --state of an ended state finds the cancelled job without --all, where it ran, at what it cost
    ended = json.loads(run(clock, "ls", "--state", "CANCELLED", "--state", "FAILED", "--json").stdout)
    assert [(r["job_id"], r["state"], r["pool"]["instance_type"]) for r in ended] == [
        (speech, "CANCELLED", "g6.xlarge")
    ]
    assert ended[0]["cost_is_estimate"] is False
    # And a filter nothing matches says so
    none = run(clock, "ls", "--tag", "team=vision", "--state", "RUNNING")
    assert none.exit_code == 0
    assert none.stdout == ""
    assert none.stderr.strip() == (
        "no jobs match --state RUNNING --tag team=vision among the queued and live ones (`--all`: ended ones too)"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ls", "--state", "DONE"], "error: --state 'DONE': not a job state; allowed: QUEUED, PLACING, WAITING, "),
        (["ls", "--tag", "team"], "error: --tag 'team': expected KEY=VALUE, a tag of the job spec's `tags`"),
        (["wait", "nope-0123456789ab"], "error: no job nope-0123456789ab in stack SpotRelay: not submitted there"),
        (["wait", "resnet50"], "error: no job resnet50: a job id ends in - and 12 hex digits"),
        (["wait", "nope-0123456789ab", "--timeout", "soon"], "error: --timeout: 'soon' is not a duration ("),
    ],
)
def test_a_bad_filter_timeout_or_job_id_is_a_one_line_error(
    runtime: LocalRuntime, clock: VirtualClock, args: list[str], says: str
) -> None:
    result = run(clock, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(says)
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""
