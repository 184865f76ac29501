"""`spotrelay wait`: poll the jobs' records until each has ended or --timeout passed, a line per job as it
ends; the polling (`wait_for_jobs`) is `submit --wait`'s (spotrelay.cli.job_submit) and `status --watch`'s
(spotrelay.cli.job_status) too.

Siblings: spotrelay.cli.job_common (the options, the stack's client, the clock); spotrelay.cli.job_commands has the
overview.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from spotrelay.cli.console import err, fail, option_seconds, out
from spotrelay.cli.job_common import (
    EndpointOption,
    RegionOption,
    StackOption,
    command_clock,
    connect,
    iso_time,
    json_line,
)
from spotrelay.clock import WaitingClock
from spotrelay.models import JobState

if TYPE_CHECKING:
    from spotrelay.aws.deployed_stack import JobsClient
    from spotrelay.models import Job

# How often `wait` reads its jobs' records (a GetItem each): a job's state changes over minutes, and a few
# seconds late is soon enough to learn it ended
WAIT_POLL_SECONDS = 5.0
WAIT_MAX_FAILURES = 5  # failed reads in a row (a throttle, a network blip) before a wait gives up

TimeoutOption = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        metavar="DURATION",
        help="give up after 30m, 6h, 2d ... (a bare number is hours), exit 1; default: no limit",
    ),
]
PollOption = Annotated[
    float, typer.Option("--poll-seconds", min=1, help="how often the jobs' records are read while waiting")
]


def wait_command(
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB_ID", help="what `spotrelay submit` printed")],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    timeout_text: TimeoutOption = None,
    poll_seconds: PollOption = WAIT_POLL_SECONDS,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON line per job as it ends")] = False,
) -> None:
    """Wait until every job has ended, printing a line for each as it ends: its state, and why when it did
    not succeed. Exit 0 when all SUCCEEDED; 1 when one FAILED or was CANCELLED, or --timeout passed first
    (a line for each job still running says so); 2 for a job the stack does not know.

    \b
    The jobs' records are read every --poll-seconds (one DynamoDB GetItem
    a job); the jobs go on when the wait stops (Ctrl-C: exit 130).
    """
    timeout = wait_timeout(timeout_text)
    client = connect(stack, region, endpoint_url)
    raise typer.Exit(wait_and_report(client, job_ids, timeout=timeout, poll_seconds=poll_seconds, as_json=as_json))


@dataclass(frozen=True, slots=True)
class Timeout:
    seconds: float
    text: str  # as the user wrote it


def wait_timeout(text: str | None) -> Timeout | None:
    if text is None:
        return None
    return Timeout(option_seconds(text, "--timeout"), text)


@dataclass(frozen=True, slots=True)
class WaitResult:
    ended: list[Job]  # in the order they were seen ended
    unfinished: dict[str, Job | None]  # at the timeout: each job's record as last read (None: not recorded)

    @property
    def all_succeeded(self) -> bool:
        return not self.unfinished and all(job.state is JobState.SUCCEEDED for job in self.ended)

    @property
    def exit_status(self) -> int:
        """`wait`'s (and `status --watch`'s): 0 when every job SUCCEEDED; 1 when one FAILED, was CANCELLED,
        or was still going at the timeout."""
        return 0 if self.all_succeeded else 1


def wait_for_jobs(
    read_job: Callable[[str], Job | None],
    job_ids: Sequence[str],
    *,
    clock: WaitingClock,
    poll_seconds: float,
    timeout_seconds: float | None,
    on_end: Callable[[Job], None],
    on_waiting: Callable[[int], None] = lambda pending: None,
) -> WaitResult:
    """Read the jobs' records every `poll_seconds` on `clock` until every one has ended (`on_end` as each
    does) or `timeout_seconds` have passed; `on_waiting(n)` once, when the first read leaves n jobs to wait
    for. `read_job` answers None for a job not recorded yet. A StackError of the user's input (USAGE) ends
    the wait at once; one of AWS's, after WAIT_MAX_FAILURES polls in a row failed (a long wait outlives a
    throttle)."""
    from spotrelay.aws.deployed_stack import USAGE, StackError

    deadline = None if timeout_seconds is None else clock.monotonic() + timeout_seconds
    last: dict[str, Job | None] = dict.fromkeys(job_ids)  # each once, in the order given
    ended: list[Job] = []
    failures = 0
    waiting = False
    while True:
        try:
            # Every job is read before any line is printed: a wrong id is the error, alone
            read = {job_id: read_job(job_id) for job_id in last}
        except StackError as e:
            failures += 1
            if e.code == USAGE or failures >= WAIT_MAX_FAILURES:
                raise
        else:
            failures = 0
            last.update(read)
            for job_id, job in read.items():
                if job is not None and job.state.is_terminal:
                    del last[job_id]
                    ended.append(job)
                    on_end(job)
        if not last:
            return WaitResult(ended, {})
        left = None if deadline is None else deadline - clock.monotonic()
        if left is not None and left <= 0:
            return WaitResult(ended, last)
        if not waiting:
            waiting = True
            on_waiting(len(last))
        clock.sleep(poll_seconds if left is None else min(poll_seconds, left))


def wait_and_report(
    client: JobsClient,
    job_ids: Sequence[str],
    *,
    timeout: Timeout | None,
    poll_seconds: float,
    as_json: bool,
    unrecorded: Collection[str] = (),
) -> int:
    """`wait_for_jobs` on the stack, a line per job as it ends and one per job the timeout left: the exit
    status (0: all SUCCEEDED). The jobs of `unrecorded` were just sent: no record yet is the queue's delay."""
    from spotrelay.aws.deployed_stack import JobNotFound, StackError

    def read_job(job_id: str) -> Job | None:
        try:
            return client.job(job_id)
        except JobNotFound:
            if job_id in unrecorded:
                return None
            raise

    def on_end(job: Job) -> None:
        if as_json:
            json_line(wait_row(job.job_id, job, timed_out=False))
        else:
            out.print(ended_line(job), markup=False, soft_wrap=True)

    def on_waiting(pending: int) -> None:
        if not as_json:
            err.print(
                f"waiting for {pending} job(s) to end, reading their records every {poll_seconds:g} s; Ctrl-C "
                "stops waiting (the jobs go on)",
                markup=False,
                soft_wrap=True,
            )

    try:
        result = wait_for_jobs(
            read_job,
            job_ids,
            clock=command_clock(),
            poll_seconds=poll_seconds,
            timeout_seconds=None if timeout is None else timeout.seconds,
            on_end=on_end,
            on_waiting=on_waiting,
        )
    except StackError as e:
        fail(str(e), e.code)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    for job_id, job in result.unfinished.items():
        assert timeout is not None  # only a timeout leaves jobs unfinished
        if as_json:
            json_line(wait_row(job_id, job, timed_out=True))
        else:
            where = "not recorded yet" if job is None else f"still {job.state.value}"
            out.print(f"{job_id} {where}: not ended within --timeout {timeout.text}", markup=False, soft_wrap=True)
    return result.exit_status


def ended_line(job: Job) -> str:
    """`<id> SUCCEEDED`, or `<id> FAILED: <why>`."""
    why = f": {job.failure_reason}" if job.failure_reason and job.state is not JobState.SUCCEEDED else ""
    return f"{job.job_id} {job.state.value}{why}"


def wait_row(job_id: str, job: Job | None, *, timed_out: bool) -> dict[str, Any]:
    """A line of `wait --json`: the job as it ended, or as the timeout found it."""
    return {
        "job_id": job_id,
        "state": None if job is None else job.state.value,
        "failure_reason": None if job is None else job.failure_reason,
        "ended_at": None if job is None or job.ended_at is None else iso_time(job.ended_at),
        "timed_out": timed_out,
    }
