"""`spotrelay status --watch` against a scripted job table: the status shown at every read of `wait`'s polling,
until the job ends, then `wait`'s exit status. Time is the test's: the clock's sleep moves its monotonic time
and lets the table change (as in test_cli_wait)."""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from rich.console import Console
from test_cli_wait import JOB_ID, NOW, SPEC, THROTTLED, ScriptedClock
from typer.testing import CliRunner

from spotrelay.aws.deployed_stack import JobStatus, StackError
from spotrelay.cli import app, job_common, job_status, job_wait
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, Pool

ON_DEMAND = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND)


def status(state: JobState) -> JobStatus:
    """The job in `state`, on one on-demand attempt (no spot price to ask EC2 for)."""
    ended = state.is_terminal
    attempt = Attempt(
        job_id=JOB_ID,
        attempt=1,
        pool=ON_DEMAND,
        hourly_price=0.8048,  # g6.xlarge's on-demand price
        instance_id="i-0123456789abcdef0",
        started_at=NOW - timedelta(hours=1),
        running_at=NOW - timedelta(hours=1),
        ended_at=NOW if ended else None,
        outcome=AttemptOutcome(state.value) if ended else None,
    )
    job = Job(job_id=JOB_ID, spec=SPEC, state=state, submitted_at=NOW, updated_at=NOW, attempts=1)
    return JobStatus(job=job, attempts=[attempt])


class ScriptedStack:
    """Read k answers reads[k] (the last one from then on): the job in a state, or an error raised."""

    def __init__(self, *reads: JobState | BaseException) -> None:
        self.reads = list(reads)
        self.count = 0

    def status(self, job_id: str) -> JobStatus:
        assert job_id == JOB_ID
        answer = self.reads[min(self.count, len(self.reads) - 1)]
        self.count += 1
        if isinstance(answer, BaseException):
            raise answer
        return status(answer)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ScriptedClock:
    scripted = ScriptedClock()
    monkeypatch.setattr(job_status, "command_clock", lambda: scripted)  # the watch's polling
    monkeypatch.setattr(job_common, "command_clock", lambda: scripted)  # and `utc_now`'s
    return scripted


def watch(monkeypatch: pytest.MonkeyPatch, stack: ScriptedStack, *args: str) -> Any:
    monkeypatch.setattr(job_status, "connect", lambda *a: stack)
    return CliRunner().invoke(app, ["status", JOB_ID, "--watch", *args])


def shown_states(text: str) -> list[str]:
    """The state of each status shown: its first line is `<id>  <STATE>  (submitted ...)`."""
    return re.findall(rf"{JOB_ID}  (\w+)  \(submitted", text)


@pytest.mark.parametrize(("end", "code"), [(JobState.SUCCEEDED, 0), (JobState.FAILED, 1), (JobState.CANCELLED, 1)])
def test_watch_shows_the_status_at_every_read_until_the_job_ends_and_exits_as_wait_does(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock, end: JobState, code: int
) -> None:
    # Given a job that runs for two reads, then ends
    stack = ScriptedStack(JobState.RUNNING, JobState.RUNNING, end)
    # When the user watches it, stdout not a terminal
    result = watch(monkeypatch, stack)
    # Then its status is printed at each read, 5 s apart on the command's clock, the last one ended, and the exit
    # status is `wait`'s for that state
    assert shown_states(result.stdout) == ["RUNNING", "RUNNING", end.value]
    assert result.stdout.count("attempt 1 on g6.xlarge in us-east-1a, on-demand") == 2  # the live attempt's line
    assert clock.slept == [5.0, 5.0]
    assert result.exit_code == code, result.output
    assert stack.count == 3


def test_watch_reads_at_the_interval_given_and_outlives_a_throttle(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    # Given a job table that throttles twice before it answers the job succeeded
    stack = ScriptedStack(JobState.RUNNING, THROTTLED, THROTTLED, JobState.SUCCEEDED)
    # When the user watches every 30 s
    result = watch(monkeypatch, stack, "--interval", "30s")
    # Then the failed reads are retried at the next poll, as `wait` does, and only reads that answered are shown
    assert result.exit_code == 0, result.output
    assert shown_states(result.stdout) == ["RUNNING", "SUCCEEDED"]
    assert clock.slept == [30.0, 30.0, 30.0]


def test_watch_gives_up_as_wait_does_when_the_reads_keep_failing(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    stack = ScriptedStack(JobState.RUNNING, THROTTLED)
    result = watch(monkeypatch, stack)
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == f"error: {THROTTLED}"
    assert stack.count == 1 + job_wait.WAIT_MAX_FAILURES


def test_watch_of_a_job_the_stack_does_not_know_is_the_one_line_error(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    unknown = StackError(f"no job {JOB_ID} in stack SpotRelay", 2)
    result = watch(monkeypatch, ScriptedStack(unknown))
    assert result.exit_code == 2
    assert result.stderr == f"error: no job {JOB_ID} in stack SpotRelay\n"
    assert clock.slept == []


def test_ctrl_c_stops_watching_with_130_and_nothing_more_said(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    # Given a running job, and the user pressing Ctrl-C during the second read
    stack = ScriptedStack(JobState.RUNNING, KeyboardInterrupt())
    result = watch(monkeypatch, stack)
    # Then the watch ends quietly, exit 130: the status shown once, no traceback, no error line
    assert result.exit_code == 130
    assert shown_states(result.stdout) == ["RUNNING"]
    assert result.stderr == ""


def test_watch_json_is_a_json_line_a_read(monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock) -> None:
    stack = ScriptedStack(JobState.RUNNING, JobState.SUCCEEDED)
    result = watch(monkeypatch, stack, "--json")
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["job"]["state"] for a in answers] == ["RUNNING", "SUCCEEDED"]
    assert answers[-1]["attempts"][0]["outcome"] == "SUCCEEDED"


def test_on_a_terminal_the_status_is_redrawn_in_place_and_the_last_one_stays(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    # Given stdout a terminal
    screen = Console(file=io.StringIO(), force_terminal=True, width=100, record=True)
    monkeypatch.setattr(job_status, "out", screen)
    stack = ScriptedStack(JobState.RUNNING, JobState.SUCCEEDED)
    # When the user watches the job until it succeeds
    result = watch(monkeypatch, stack)
    # Then each read redrew the status (rich Live: the cursor moves back up over the previous one), with a
    # footer saying how it is read while it runs; nothing went to the runner's plain stdout
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    drawn = screen.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[1A" in drawn  # up a line: the redraw
    text = screen.export_text()
    assert shown_states(text)[:2] == ["RUNNING", "SUCCEEDED"]  # (Live draws its last frame again as it stops)
    assert set(shown_states(text)[2:]) <= {"SUCCEEDED"}
    assert text.count("read every 5 s until the job ends; Ctrl-C stops watching") == 1  # not under the last


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "5"], "error: --interval '5': give a unit, e.g. 5s"),
        (["--interval", "0.5s"], "error: --interval '0.5s': at least 1s"),
        (["--interval", "soon"], "error: --interval: 'soon' is not a duration"),
    ],
)
def test_a_bad_interval_is_the_one_line_error_and_nothing_is_read(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setattr(job_status, "connect", lambda *a: pytest.fail("nothing may be read"))
    result = CliRunner().invoke(app, ["status", JOB_ID, "--watch", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(message)


def test_an_interval_without_watch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_status, "connect", lambda *a: pytest.fail("nothing may be read"))
    result = CliRunner().invoke(app, ["status", JOB_ID, "--interval", "10s"])
    assert result.exit_code == 2
    assert result.stderr == "error: --interval: how often --watch reads the job; give --watch too\n"
