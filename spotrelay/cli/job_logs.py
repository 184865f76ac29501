"""`spotrelay logs` (and `--follow`): a job's output and its agents' lines from CloudWatch Logs, in time order
across its attempts, followed until the job ends and its agent's last batch is in.

Siblings: spotrelay.cli.job_common (the options, the stack's client, the clock); spotrelay.cli.job_commands has the
overview.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from spotrelay.cli.console import err, fail, out
from spotrelay.cli.job_common import (
    EndpointOption,
    JobIdArgument,
    RegionOption,
    StackOption,
    command_clock,
    connect,
    utc_now,
)

if TYPE_CHECKING:
    from spotrelay.aws.deployed_stack import LogLine

# How often `logs --follow` asks for new lines (the agent sends a batch every 5 s, spotrelay.agent.logs).
FOLLOW_POLL_SECONDS = 2.0
FOLLOW_LOOKBACK_MS = 60_000
FOLLOW_END_WAIT_SECONDS = 30.0  # watchtower's own limit on the flush at the agent's exit
FOLLOW_MAX_FAILURES = 5
_LOG_FIELDS = {"time", "level", "message", "job_id", "attempt"}


def logs_command(
    job_id: JobIdArgument,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="one attempt's lines only")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines until the job ends")] = False,
    job_output: Annotated[bool, typer.Option("--job-output", help="the job's own output only")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the agent's JSON lines as they are")] = False,
    since_text: Annotated[
        str | None, typer.Option("--since", metavar="DURATION", help="only the last 90m, 6h, 2d ... of lines")
    ] = None,
) -> None:
    """The job's output and its agents' lines (checkpoints, notices, outcome), from CloudWatch Logs, in
    time order across its attempts; the job's own lines are printed as it wrote them."""
    from spotrelay.agent.logs import AGENT_DONE
    from spotrelay.aws.deployed_stack import USAGE, StackError
    from spotrelay.market import parse_duration

    try:
        window = None if since_text is None else parse_duration(since_text, "--since")
    except ValueError as e:
        fail(str(e))

    client = connect(stack, region, endpoint_url)
    clock = command_clock()  # every poll and the wait for the last batch (tests drive it)
    seen: dict[str, int] = {}  # event id -> its time: the lines printed that a later answer may repeat
    lines_seen = 0
    done: set[str] = set()  # the streams (attempts) whose agent said "agent done", its last line
    latest = ""  # the latest attempt's stream seen (zero-padded: the greatest name)
    since = None if window is None else int((utc_now().timestamp() - window * 3600) * 1000)
    was_live = False  # the job was seen running: once it ends, its agent's last batch is still to come
    ended_at: float | None = None
    failures = 0

    def show(line: LogLine) -> None:
        nonlocal lines_seen, latest, since
        if line.event_id in seen:
            return
        seen[line.event_id] = line.timestamp_ms
        lines_seen += 1
        latest = max(latest, line.stream)
        if line.record.get("message") == AGENT_DONE and line.record.get("outcome") != "detached":
            done.add(line.stream)  # (a detached agent was stopped and left the job to the next one)
        # Ask again from a minute before the latest line: another attempt's agent (a standby's, at a
        # handover) may send older lines in a later batch. The seen ids drop the repeats.
        since = max(since or 0, line.timestamp_ms - FOLLOW_LOOKBACK_MS)
        if job_output and not line.is_job_output:
            return
        if as_json:
            sys.stdout.write(json.dumps(line.record) + "\n")
        else:
            out.print(log_text(line), markup=False, highlight=False, soft_wrap=True)

    try:
        while True:
            try:
                # The state is read before the lines: no line written before the end is missed. The lines
                # print as their pages arrive; a failure part way is retried from `since`, the seen ids
                # dropping what was printed.
                state = client.status(job_id).job.state
                ended = state.is_terminal
                for line in client.log_lines(job_id, attempt=attempt, since_ms=since):
                    show(line)
            except StackError as e:
                failures += 1
                if not follow or e.code == USAGE or failures >= FOLLOW_MAX_FAILURES:
                    fail(str(e), e.code)
                clock.sleep(FOLLOW_POLL_SECONDS)  # a throttle or a network blip: a long follow goes on
                continue
            failures = 0
            if ended and was_live:
                # It ended while we followed: its agent sends its last batch as it exits, a few seconds on
                # ("agent done"), or never if its instance went first (a cancel): wait that long at most.
                ended_at = ended_at if ended_at is not None else clock.monotonic()
                finished = latest in done or clock.monotonic() - ended_at > FOLLOW_END_WAIT_SECONDS
            else:
                finished = ended
            if not follow or finished:
                if not lines_seen:
                    note = (
                        f"no log lines for {job_id}: it ended {state.value} before an agent shipped any"
                        if ended
                        else f"no log lines for {job_id} yet: its agent ships them once an instance runs it"
                    )
                    err.print(note, markup=False, soft_wrap=True)
                elif follow:
                    err.print(f"{job_id} ended {state.value}", markup=False, soft_wrap=True)
                return
            if not lines_seen and not was_live and not ended:  # following from the start: say what it waits for
                err.print(
                    f"waiting for the first lines of {job_id} ({state.value}): its agent ships them once an "
                    "instance runs it; Ctrl-C stops",
                    markup=False,
                    soft_wrap=True,
                )
            was_live = was_live or not ended
            if since is not None:  # no answer goes back before `since`: forget what came before it
                seen = {event: at for event, at in seen.items() if at >= since}
            clock.sleep(FOLLOW_POLL_SECONDS)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def log_text(line: LogLine) -> str:
    """The job's output as it printed it; an agent line as `[spotrelay 12:00:05 #2] message (key=value ...)`."""
    record = line.record
    if line.is_job_output:
        return str(record.get("line", ""))
    details = ", ".join(f"{key}={value}" for key, value in record.items() if key not in _LOG_FIELDS)
    when = str(record.get("time", ""))[11:19]
    return f"[spotrelay {when} #{record.get('attempt', '?')}] {record.get('message', '')}" + (
        f" ({details})" if details else ""
    )
