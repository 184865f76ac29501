"""`spotrelay submit / status / ls / logs / cost / wait / cancel`: a user's jobs on a deployed stack
(spotrelay.aws.stack).

The commands are plain functions; spotrelay.cli.app registers them. boto3 is imported when one runs.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from spotrelay.cli.console import err, fail, option_seconds, out, tables
from spotrelay.cli.costs import (
    JobCost,
    PriceHistories,
    PriceHistoryReader,
    ec2_price_history,
    job_cost,
    read_price_histories,
    spot_price_now,
)
from spotrelay.clock import SYSTEM_CLOCK, WaitingClock
from spotrelay.models import JobSpecError, JobState, Market, Pool, PriceQuote, load_job_spec, parse_job_spec
from spotrelay.models.billing import needs_prices
from spotrelay.models.job_spec import JOB_SPEC_LIMITS, decode_document, document_text

if TYPE_CHECKING:
    from spotrelay.aws.stack import JobsClient, JobStatus, LogLine
    from spotrelay.models import Job

T = TypeVar("T")

# How often `logs --follow` asks for new lines (the agent sends a batch every 5 s, spotrelay.agent.logs).
FOLLOW_POLL_SECONDS = 2.0
FOLLOW_LOOKBACK_MS = 60_000
FOLLOW_END_WAIT_SECONDS = 30.0  # watchtower's own limit on the flush at the agent's exit
FOLLOW_MAX_FAILURES = 5
# How often `wait` reads its jobs' records (a GetItem each): a job's state changes over minutes, and a few
# seconds late is soon enough to learn it ended
WAIT_POLL_SECONDS = 5.0
WAIT_MAX_FAILURES = 5  # failed reads in a row (a throttle, a network blip) before a wait gives up
# How often `status --watch` reads the job (a GetItem and a Query): the figures on screen move by the second,
# the job's state over minutes
WATCH_INTERVAL = "5s"
WATCH_MIN_SECONDS = 1.0  # as `wait --poll-seconds`
_LOG_FIELDS = {"time", "level", "message", "job_id", "attempt"}

JobIdArgument = Annotated[str, typer.Argument(metavar="JOB_ID", help="what `spotrelay submit` printed")]
StackOption = Annotated[
    str, typer.Option("--stack", envvar="SPOTRELAY_STACK", help="the CloudFormation stack `cdk deploy` made")
]
# botocore reads AWS_DEFAULT_REGION and the config file, not AWS_REGION (the other SDKs' and Lambda's name)
RegionOption = Annotated[
    str | None,
    typer.Option("--region", envvar="AWS_REGION", help="default: AWS_REGION, else the AWS configuration's"),
]
EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        envvar="AWS_ENDPOINT_URL",
        help="another endpoint for every AWS service, e.g. `spotrelay local up`'s http://localhost:5055",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
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


def command_clock() -> WaitingClock:
    """The clock the commands count on: every now, poll and timeout (tests put a fake one here)."""
    return SYSTEM_CLOCK


def utc_now() -> datetime:
    """The time costs are counted to (tests put a virtual clock here)."""
    return command_clock().now()


def connect(stack: str, region: str | None, endpoint_url: str | None) -> JobsClient:
    from spotrelay.aws.stack import JobsClient, StackError

    try:
        return JobsClient.connect(stack, region=region, endpoint_url=endpoint_url)
    except StackError as e:
        fail(str(e), e.code)


def on_stack(stack: str, region: str | None, endpoint_url: str | None, use: Callable[[JobsClient], T]) -> T:
    """`use` the stack's client; a StackError is the command's one-line error and exit status."""
    return on_client(connect(stack, region, endpoint_url), use)


def on_client(client: JobsClient, use: Callable[[JobsClient], T]) -> T:
    """`use` the client; a StackError is the command's one-line error and exit status."""
    from spotrelay.aws.stack import StackError

    try:
        return use(client)
    except StackError as e:
        fail(str(e), e.code)


def prices_in_effect(
    statuses: list[JobStatus],
    now: datetime,
    region: str | None,
    endpoint_url: str | None,
    *,
    read: PriceHistoryReader | None = None,
    warn: bool = True,
) -> PriceHistories:
    """The spot price histories the jobs' unsettled attempts need, read from EC2 once per pool (with `read`,
    else a new EC2 client); a warning on stderr if they could not be read (those attempts then count at
    their launch prices), unless not `warn`."""
    attempts = [a for s in statuses for a in s.attempts]
    if not any(needs_prices(a) for a in attempts):
        return PriceHistories()  # every bill settled, or on-demand: nothing to ask EC2
    prices = read_price_histories(attempts, now, read or ec2_price_history(region, endpoint_url))
    if prices.error is not None and warn:
        err.print(
            f"warning: could not read the spot price history ({prices.error}); instances not yet billed in full "
            "are counted at their launch prices",
            markup=False,
            soft_wrap=True,
        )
    return prices


def read_stdin() -> str:
    """A job spec piped in, read no further than a job file would be (`load_job_spec`), and refused if it
    is not UTF-8 text."""
    limit = JOB_SPEC_LIMITS.max_bytes + 1
    stream = getattr(sys.stdin, "buffer", None)  # bytes, so a binary stream is refused, not mis-decoded
    data = stream.read(limit) if stream is not None else sys.stdin.read(limit).encode()
    return document_text(data, "stdin")


def submit_command(
    job_file: Annotated[
        Path, typer.Argument(metavar="JOB.yaml", help="a job spec, YAML or JSON (README); - reads it from stdin")
    ],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    wake: Annotated[
        bool, typer.Option("--wake/--no-wake", help="invoke the dispatcher now, rather than wait for its alarm")
    ] = True,
    wait: Annotated[
        bool, typer.Option("--wait", help="then wait until the job ends, as `spotrelay wait` does (its exit status)")
    ] = False,
    timeout_text: TimeoutOption = None,
    poll_seconds: PollOption = WAIT_POLL_SECONDS,
    as_json: JsonOption = False,
) -> None:
    """Check JOB.yaml, send it to the stack's job queue and print the job's id.

    \b
    The same as `aws sqs send-message --message-body "$(cat job.json)"`,
    except that a bad spec is refused here, with the field and what is
    allowed, rather than recorded FAILED by the dispatcher; and the
    dispatcher is woken at once (the queue-depth alarm would within minutes).
    With --wait, it then waits for the job to end: exit 0 if it SUCCEEDED.
    """

    if timeout_text is not None and not wait:
        fail("--timeout: a limit on --wait; give --wait too")
    timeout = wait_timeout(timeout_text)  # a bad --timeout sends nothing
    try:
        if str(job_file) == "-":  # `... | spotrelay submit -`
            spec = parse_job_spec(decode_document(read_stdin(), "stdin"), "stdin")
        else:
            spec = load_job_spec(job_file)
    except JobSpecError as e:
        fail(str(e))
    client = connect(stack, region, endpoint_url)
    submitted = on_client(client, lambda c: c.submit(spec, wake=wake))
    if as_json:
        answer = {
            "job_id": submitted.job_id,
            "message_id": submitted.message_id,
            "queue_url": submitted.queue_url,
            "dispatcher_woken": submitted.dispatcher_woken,
            "wake_error": submitted.wake_error,
        }
        json_line(answer)
    else:
        out.print(submitted.job_id, markup=False)
    if submitted.wake_error is not None:
        err.print(
            f"warning: could not wake the dispatcher ({submitted.wake_error}); the queue-depth alarm or the "
            "5-minute schedule admits the job",
            markup=False,
        )
    if wait:
        # The job has no record until the dispatcher reads its message: this one is known to be sent
        waited = wait_and_report(
            client,
            [submitted.job_id],
            timeout=timeout,
            poll_seconds=poll_seconds,
            as_json=as_json,
            unrecorded=frozenset({submitted.job_id}),
        )
        raise typer.Exit(waited)


def status_command(
    job_id: JobIdArgument,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", help="show it again every --interval until the job ends, then exit as `spotrelay wait` does"
        ),
    ] = False,
    interval_text: Annotated[
        str | None,
        typer.Option(
            "--interval",
            metavar="DURATION",
            help=f"how often --watch reads the job: 30s, 2m (default {WATCH_INTERVAL})",
        ),
    ] = None,
) -> None:
    """Where a job stands: its state, pool, progress, cost so far (a live instance's at the spot prices in
    effect since its launch: an estimate until the instance is gone), and every attempt.

    \b
    With --watch it reads the job again every --interval (a DynamoDB GetItem
    and a Query) and redraws it in place (printed again when stdout is not a
    terminal; with --json, a JSON line a read) until the job ends, then exits
    as `spotrelay wait` does: 0 if it SUCCEEDED, 1 if it FAILED or was
    CANCELLED. Ctrl-C stops watching (exit 130); the job goes on.
    """
    if interval_text is not None and not watch:
        fail("--interval: how often --watch reads the job; give --watch too")
    if watch:
        interval = watch_interval(interval_text or WATCH_INTERVAL)
        client = connect(stack, region, endpoint_url)
        raise typer.Exit(
            watch_status(client, job_id, interval=interval, as_json=as_json, region=region, endpoint_url=endpoint_url)
        )
    status = on_stack(stack, region, endpoint_url, lambda client: client.status(job_id))
    now = utc_now()
    prices = prices_in_effect([status], now, region, endpoint_url)
    if as_json:
        sys.stdout.write(json.dumps(status_answer(status, now, prices), indent=2) + "\n")
        return
    print_status(status, now, prices)


def status_answer(status: JobStatus, now: datetime, prices: PriceHistories) -> dict[str, Any]:
    """`status --json`: the records and the cost at the prices in effect."""
    cost = job_cost(status, prices, now)
    return {
        "job": status.job.model_dump(mode="json"),
        "attempts": [a.model_dump(mode="json", exclude={"task_token"}) for a in status.attempts],
        "running_cost_usd": cost.live_usd,
        "cost_usd": cost.total_usd,
        "cost_is_estimate": cost.is_estimate,
    }


def print_status(status: JobStatus, now: datetime, prices: PriceHistories) -> None:
    for line in describe_status(status, now, prices):
        out.print(line, markup=False, soft_wrap=True)
    if status.attempts:
        tables().print(attempts_table(status))


def watch_interval(text: str) -> float:
    """Seconds of `--interval`: a duration with its unit (a bare number would be hours, as --timeout reads it)."""
    if text.strip().replace(".", "", 1).isdigit():
        fail(f"--interval {text!r}: give a unit, e.g. {text.strip()}s")
    seconds = option_seconds(text, "--interval")
    if seconds < WATCH_MIN_SECONDS:
        fail(f"--interval {text!r}: at least {WATCH_MIN_SECONDS:g}s")
    return seconds


def watch_status(
    client: JobsClient, job_id: str, *, interval: float, as_json: bool, region: str | None, endpoint_url: str | None
) -> int:
    """`status` shown at every read of `wait_for_jobs` on the one job, until it ends: `wait`'s polling (its
    clock, its retries of a failed read) and `wait`'s exit status. Redrawn in place on a terminal (rich
    Live), printed again otherwise, a JSON line a read with `as_json`."""
    from spotrelay.aws.stack import StackError

    readers: list[PriceHistoryReader] = []  # one EC2 client for the watch, made when a price is needed

    def read_prices(pool: Pool, start: datetime, end: datetime) -> list[PriceQuote]:
        if not readers:
            readers.append(ec2_price_history(region, endpoint_url))
        return readers[0](pool, start, end)

    live = None if as_json or not out.is_terminal else Live(console=out, auto_refresh=False)
    footer = Text(f"read every {interval:g} s until the job ends; Ctrl-C stops watching (the job goes on)", style="dim")
    reads = 0
    priced = True  # a failed price read is warned of once, until they are read again

    def read_and_show(read_id: str) -> Job:
        nonlocal reads, priced
        status = client.status(read_id)
        now = utc_now()
        prices = prices_in_effect([status], now, region, endpoint_url, read=read_prices, warn=priced)
        priced = prices.error is None
        reads += 1
        if as_json:
            json_line(status_answer(status, now, prices))
        elif live is not None:
            view = status_view(status, now, prices)
            live.update(view if status.job.state.is_terminal else Group(view, footer), refresh=True)
        else:
            if reads > 1:
                out.print()
            print_status(status, now, prices)
        return status.job

    try:
        with live if live is not None else contextlib.nullcontext():
            result = wait_for_jobs(
                read_and_show,
                [job_id],
                clock=command_clock(),
                poll_seconds=interval,
                timeout_seconds=None,
                on_end=lambda job: None,  # the last read showed it ended
            )
    except StackError as e:
        fail(str(e), e.code)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    return result.exit_status


def status_view(status: JobStatus, now: datetime, prices: PriceHistories) -> Group:
    """What `print_status` prints, as one renderable (for rich Live)."""
    lines: list[Text | Table] = [Text(line) for line in describe_status(status, now, prices)]
    if status.attempts:
        lines.append(attempts_table(status))
    return Group(*lines)


def ls_command(
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    ended: Annotated[bool, typer.Option("--all", help="ended jobs too (a scan of the table)")] = False,
    state_names: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            metavar="STATE",
            help=f"only jobs in this state, one of {', '.join(JobState)} (repeatable: any of them)",
        ),
    ] = None,
    tag_texts: Annotated[
        list[str] | None,
        typer.Option("--tag", metavar="KEY=VALUE", help="only jobs with this tag in their spec (repeatable: all)"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """The stack's queued and live jobs (`--all`: ended ones too), oldest first: each job's state and
    progress, its pool (where it runs, or ended), and its cost so far (* an estimate: a live instance at
    the spot prices in effect). A --state of an ended state lists ended jobs without --all."""
    states = parse_states(state_names or [])
    tags = parse_tags(tag_texts or [])
    scan = ended or any(state.is_terminal for state in states)
    statuses = on_stack(
        stack,
        region,
        endpoint_url,
        lambda client: client.with_attempts([job for job in client.jobs(ended=scan) if listed(job, states, tags)]),
    )
    now = utc_now()
    prices = prices_in_effect(statuses, now, region, endpoint_url)
    rows = [(status, job_cost(status, prices, now)) for status in statuses]
    if as_json:
        sys.stdout.write(json.dumps([job_row(status, cost) for status, cost in rows], indent=2) + "\n")
        return
    if not rows:
        err.print(no_jobs_note(state_names or [], tag_texts or [], scan), markup=False, soft_wrap=True)
        return
    # Two or three lines a row (id over name, state over progress, type over zone): the five columns fit
    # an 80-column terminal whole, a long job id included
    table = Table(
        Column("job", no_wrap=True),
        Column("state", no_wrap=True),
        Column("pool", no_wrap=True),
        Column("cost $", no_wrap=True, justify="right"),
        Column("submitted", no_wrap=True),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for status, cost in rows:
        job = status.job
        pool = shown_pool(status)
        submitted = job.submitted_at.astimezone(UTC)
        table.add_row(
            f"{job.job_id}\n{job.spec.name}",
            "\n".join([job.state.value, progress(job), *([f"{job.interruptions} lost"] if job.interruptions else [])]),
            "-" if pool is None else pool_lines(pool),
            f"{cost.total_usd:.2f}" + ("*" if cost.is_estimate else ""),
            f"{submitted:%m-%d}\n{submitted:%H:%M}",
        )
    tables().print(table)
    if any(cost.is_estimate for _, cost in rows):
        out.print(ESTIMATE_NOTE, markup=False, soft_wrap=True)


def parse_states(values: Sequence[str]) -> frozenset[JobState]:
    """`--state` values, in any case; an unknown one is the one-line error saying which are."""
    states = set()
    for value in values:
        try:
            states.add(JobState(value.strip().upper()))
        except ValueError:
            fail(f"--state {value!r}: not a job state; allowed: {', '.join(JobState)}")
    return frozenset(states)


def parse_tags(values: Sequence[str]) -> dict[str, frozenset[str]]:
    """`--tag KEY=VALUE` values: each key to the values it may have (a key given twice: either value)."""
    tags: dict[str, frozenset[str]] = {}
    for value in values:
        key, sep, tag_value = value.partition("=")
        if not sep or not key:
            fail(f"--tag {value!r}: expected KEY=VALUE, a tag of the job spec's `tags`, e.g. team=vision")
        tags[key] = tags.get(key, frozenset()) | {tag_value}
    return tags


def listed(job: Job, states: Collection[JobState], tags: Mapping[str, Collection[str]]) -> bool:
    """Whether `ls` shows the job: in one of `states` (none given: any), with every tag of `tags`."""
    in_state = not states or job.state in states
    return in_state and all(job.spec.tags.get(key) in allowed for key, allowed in tags.items())


def no_jobs_note(state_names: Sequence[str], tag_texts: Sequence[str], scan: bool) -> str:
    filters = " ".join([*(f"--state {name}" for name in state_names), *(f"--tag {tag}" for tag in tag_texts)])
    if not filters:
        return "no jobs" if scan else "no queued or live jobs (`--all` lists ended ones too)"
    return f"no jobs match {filters}" + ("" if scan else " among the queued and live ones (`--all`: ended ones too)")


def shown_pool(status: JobStatus) -> Pool | None:
    """Where the job runs (its live attempt), or, once ended, where it ran last; None between pools or
    before its first launch."""
    if status.live_attempt is not None:
        return status.live_attempt.pool
    if status.job.state.is_terminal and status.attempts:
        return status.attempts[-1].pool
    return None


def pool_lines(pool: Pool) -> str:
    """The type over the zone, and `on-demand` under them for an on-demand pool (spot is the rule)."""
    market = "\non-demand" if pool.market is Market.ON_DEMAND else ""
    return f"{pool.instance_type}\n{pool.availability_zone}{market}"


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
    from spotrelay.aws.stack import USAGE, StackError
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


def cost_command(
    job_ids: Annotated[
        list[str] | None, typer.Argument(metavar="JOB_ID", help="default: every job of the stack")
    ] = None,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """What jobs cost, against the same instance hours on on-demand: per job and in all. Each instance is
    billed at the spot price in effect until its end: a live one up to now, an estimate until it is gone
    (marked *); on-demand prices are the catalog's (us-east-1)."""
    statuses = on_stack(stack, region, endpoint_url, lambda client: client.statuses(job_ids or []))
    now = utc_now()
    prices = prices_in_effect(statuses, now, region, endpoint_url)
    rows = [(s.job, job_cost(s, prices, now)) for s in statuses]
    total, on_demand = sum(c.total_usd for _, c in rows), sum(c.on_demand_usd for _, c in rows)
    estimated = any(c.is_estimate for _, c in rows)
    if as_json:
        answer = {
            "jobs": [
                {
                    "job_id": job.job_id,
                    "state": job.state.value,
                    "cost_usd": float(cost.total_usd),
                    "on_demand_cost_usd": float(cost.on_demand_usd),
                    "cost_is_estimate": cost.is_estimate,
                }
                for job, cost in rows
            ],
            "total": {
                "cost_usd": float(total),
                "on_demand_cost_usd": float(on_demand),
                "saved_usd": float(on_demand - total),
                "cost_is_estimate": estimated,
            },
        }
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        return
    table = Table(
        Column("job", no_wrap=True),
        "state",
        "cost $",
        "on-demand $",
        "saved $",
        "saved",
        show_footer=True,
    )
    for job, cost in rows:
        spent, od = cost.total_usd, cost.on_demand_usd
        mark = "*" if cost.is_estimate else ""
        table.add_row(
            job.job_id, job.state.value, f"{spent:.2f}{mark}", f"{od:.2f}", f"{od - spent:.2f}", _share(spent, od)
        )
    table.columns[0].footer = f"{len(rows)} job(s)"
    for column, figure in zip(table.columns[2:5], (total, on_demand, on_demand - total), strict=True):
        column.footer = f"{figure:.2f}"
    table.columns[5].footer = _share(total, on_demand)
    tables().print(table)
    if estimated:
        out.print(ESTIMATE_NOTE, markup=False, soft_wrap=True)


ESTIMATE_NOTE = (
    "* an estimate: a live instance, counted at the spot prices in effect from its launch to now; final once "
    "the instance is gone"
)


def _share(cost: float, on_demand: float) -> str:
    """The share saved; "-" under a cent of on-demand, where a percentage of nothing says nothing."""
    return f"{(on_demand - cost) / on_demand:.0%}" if on_demand >= 0.005 else "-"


def cancel_command(
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB_ID", help="what `spotrelay submit` printed")],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON line per job")] = False,
) -> None:
    """Cancel jobs wherever they are: their instances are terminated, their checkpoints are kept. A line
    per job; one that cannot be cancelled (an error line says why) does not stop the others: exit 2 if a
    job id is wrong, else 1 if AWS failed or refused for one, 0 once each is cancelled or had ended."""
    client = connect(stack, region, endpoint_url)
    code = for_each_job(job_ids, client.cancel, "cancelled", cancelled_line, as_json=as_json)
    if code:
        raise typer.Exit(code)


def resume_command(
    job_ids: Annotated[list[str], typer.Argument(metavar="JOB_ID", help="a FAILED or CANCELLED job")],
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON line per job")] = False,
) -> None:
    """Start FAILED or CANCELLED jobs again under the same ids, each from its newest committed checkpoint:
    a new run of the job, admitted like a new submission (quota, budget, priority), its earlier attempts
    and cost kept (`limits.max_total_cost` counts them; `max_interruptions` and `max_restarts` count the
    new run's). A line per job; exit 2 if a job id is wrong, else 1 if one could not be resumed (the line
    says why: it SUCCEEDED, is still running, or has spent its max_total_cost), 0 once each is queued."""
    client = connect(stack, region, endpoint_url)
    code = for_each_job(job_ids, client.resume, "resumed", resumed_line, as_json=as_json)
    if code:
        raise typer.Exit(code)


def for_each_job(
    job_ids: Sequence[str],
    act: Callable[[str], Mapping[str, Any]],
    done: str,
    line: Callable[[str, Mapping[str, Any]], str],
    *,
    as_json: bool,
) -> int:
    """`act` on each job once, in the order given, a line per job (a JSON line with --json); one that fails
    does not stop the others. An answer with `refused` (resume's) is an error line with the reason. The exit
    status: 2 if a job id is wrong (or no such job), else 1 if AWS failed or refused for one, else 0."""
    from spotrelay.aws.stack import USAGE, StackError

    code = 0
    for job_id in dict.fromkeys(job_ids):
        try:
            answer = act(job_id)
        except StackError as e:
            code = max(code, e.code)  # a wrong id (USAGE, 2) says more than a failure retrying may mend (1)
            if as_json:
                json_line({"job_id": job_id, "error": str(e)})
            else:
                err.print(f"error: {job_id} not {done}: {e}", markup=False, soft_wrap=True)
            continue
        refused = answer.get("refused")
        if refused:
            code = max(code, USAGE if answer.get("state") is None else 1)
        if as_json:
            json_line(answer)
        elif refused:
            err.print(f"error: {job_id} not {done}: {refused}", markup=False, soft_wrap=True)
        else:
            out.print(line(job_id, answer), markup=False, soft_wrap=True)
    return code


def resumed_line(job_id: str, answer: Mapping[str, Any]) -> str:
    """What the resume function did to the job, in words."""
    checkpoint = answer.get("checkpoint")
    start = (
        f"from checkpoint {checkpoint} ({float(answer.get('work_done_hours') or 0):.2f} h of work done)"
        if checkpoint
        else "from the start (it has no checkpoint)"
    )
    cost = f"${float(answer.get('cost_usd') or 0):.2f} spent so far"
    if answer.get("already"):
        return f"{job_id} was resumed already: run {answer.get('run')}, {answer.get('state')}; {cost}"
    notes = "".join(f"\n  note: {note}" for note in answer.get("notes") or [])
    return f"{job_id} QUEUED again as run {answer.get('run')}: it starts {start}; {cost}{notes}"


def cancelled_line(job_id: str, answer: Mapping[str, Any]) -> str:
    """What the cancel function did to the job, in words."""
    if answer.get("already_ended"):
        return f"{job_id} had already ended: {answer.get('state')}"
    if answer.get("before_admission"):
        return (
            f"{job_id} has no record yet: if its message is still in the queue, the dispatcher records it "
            "CANCELLED when it reads it (check the id if `spotrelay status` never shows it)"
        )
    terminated = answer.get("terminated") or []
    gone = f"; terminated {', '.join(terminated)}" if terminated else ""
    return f"{job_id} {answer.get('state')}{gone}"


def json_line(answer: Mapping[str, Any]) -> None:
    """One JSON object on a line of its own, written at once: a reader of a long wait sees each as it comes."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


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
    from spotrelay.aws.stack import USAGE, StackError

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
    from spotrelay.aws.stack import JobNotFound, StackError

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


def job_row(status: JobStatus, cost: JobCost) -> dict[str, Any]:
    """A row of `ls --json`: what the table shows, and more."""
    job, pool = status.job, shown_pool(status)
    return {
        "job_id": job.job_id,
        "name": job.spec.name,
        "state": job.state.value,
        "pool": None if pool is None else pool.model_dump(mode="json"),  # as `status --json` writes a pool
        "cost_usd": cost.total_usd,  # as `cost --json` counts it
        "cost_is_estimate": cost.is_estimate,
        "work_done_hours": job.work_done_hours,
        "work_hours": job.spec.work_hours,
        "attempts": job.attempts,
        "interruptions": job.interruptions,  # this run's
        "run": job.run,  # 1, and one more per `spotrelay resume`
        "submitted_at": iso_time(job.submitted_at),
        "tags": job.spec.tags,
        "failure_reason": job.failure_reason,
        "waiting_reason": job.waiting_reason,
    }


def iso_time(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")  # as `status --json` writes a time


def progress(job: Job) -> str:
    if job.spec.work_hours:
        return f"{job.work_done_hours:.2f}/{job.spec.work_hours:g} h"
    return f"{job.work_done_hours:.2f} h"


def describe_status(status: JobStatus, now: datetime, prices: PriceHistories | None = None) -> list[str]:
    """The status in words; costs at the spot prices in effect of `prices` (none given: at launch prices)."""
    prices = prices or PriceHistories()
    costs = job_cost(status, prices, now)
    job = status.job
    age = job.elapsed_hours(now)
    lines = [f"{job.job_id}  {job.state.value}  (submitted {job.submitted_at:%Y-%m-%d %H:%M} UTC, {age:.1f} h ago)"]
    if job.run > 1 and job.resumed_at is not None:
        before = f" after {job.previous_failure_reason}" if job.previous_failure_reason else ""
        lines.append(
            f"  run {job.run}: resumed at {job.resumed_at:%Y-%m-%d %H:%M} UTC{before}; the attempts, cost and lost "
            "work below count every run, the interruptions this run's"
        )
    live = status.live_attempt
    if live is not None:
        instance = live.instance_id or "no instance yet"
        since = live.running_at or live.started_at
        lines.append(
            f"  attempt {live.attempt} on {live.pool.instance_type} in {live.pool.availability_zone}, "
            f"{live.pool.market.value} at ${live.hourly_price:.3f}/h, {instance}, since {since:%Y-%m-%d %H:%M} UTC"
        )
        if live.interrupted_at is not None:
            from spotrelay.control.decisions import SPOT_NOTICE

            ends = live.interrupted_at + SPOT_NOTICE
            lines.append(
                f"  interruption notice at {live.interrupted_at:%H:%M:%S} UTC: EC2 takes the instance back by "
                f"{ends:%H:%M:%S} UTC; waiting for the final checkpoint, then the job moves to another pool"
            )
    work = f"  work {progress(job)} in the last checkpoint"
    if job.spec.work_hours:
        work += f" ({100 * min(1.0, job.work_done_hours / job.spec.work_hours):.0f}%)"
    deadline = job.spec.limits.deadline_hours
    if deadline is not None and not job.state.is_terminal:
        left = deadline - age
        work += f"; deadline in {left:.1f} h" if left >= 0 else f"; deadline passed {-left:.1f} h ago"
    lines.append(work)
    running, total, on_demand = costs.live_usd, costs.total_usd, costs.on_demand_usd
    cost = f"  cost ${total:.2f}" + (f" (${running:.2f} of it on the live instance)" if running else "")
    if on_demand >= 0.005:
        cost += f", ${on_demand:.2f} on on-demand ({_share(total, on_demand)} saved)"
    lines.append(f"{cost}; {job.interruptions} interruption(s), {job.lost_work_hours:.2f} h of work lost")
    if costs.is_estimate:
        lines.append(f"  {_estimate_note(status, prices, now)}")
    if job.state is JobState.QUEUED and job.waiting_reason:
        lines.append(f"  {job.waiting_reason}")
    recovered = (job.last_recovery or {}).get("cause")
    if recovered and not job.state.is_terminal:  # why it is on this attempt (a terminal job says `why:`)
        lines.append(f"  last recovery, after attempt {job.last_recovered_attempt}: {recovered}")
    if job.state is JobState.WAITING and job.waiting_since is not None:
        patience = job.spec.limits.max_wait_hours
        until = job.waiting_since + timedelta(hours=patience)
        then = after_patience(status, now, costs)
        lines.append(
            f"  waiting since {job.waiting_since:%Y-%m-%d %H:%M} UTC: {job.waiting_reason or 'no pool found'}; at "
            f"{until:%Y-%m-%d %H:%M} UTC (limits.max_wait_hours {patience:g}) {then}"
        )
    if job.failure_reason:
        lines.append(f"  why: {job.failure_reason}")
    return lines


def _estimate_note(status: JobStatus, prices: PriceHistories, now: datetime) -> str:
    """What the live instance's figure counts, and that it is not its bill yet."""
    live = status.live_attempt
    if live is None or live.pool.market is Market.ON_DEMAND:
        counted = "its hours so far"
    elif prices.error is not None:
        counted = "its hours so far at its launch price (the spot price history could not be read)"
    else:
        price_now = spot_price_now(live, prices, now)
        counted = "the spot prices in effect from its launch to now" + (
            f" (${price_now:.3f}/h now)" if price_now is not None else ""
        )
    return f"the live instance's cost is an estimate, {counted}: final once the instance is gone"


def after_patience(status: JobStatus, now: datetime, costs: JobCost | None = None) -> str:
    """What Place does with the waiting job once its `max_wait_hours` are spent: for a job EC2 throttles,
    NoCapacity (spotrelay.control.decisions.waiting_on_throttling); else by asking Place's ranking
    (spotrelay.control.decisions.rank_pools) then, with `out_of_patience` and no spot at all: the job's work
    done, its budget left (its cost so far: `costs`, else at launch prices) and the stack's GPU families
    (`status.allowed_families`; None: not known)."""
    from spotrelay.control.decisions import (
        MarketSeen,
        catalog_on_demand_prices,
        launchable_types,
        rank_pools,
        waiting_on_throttling,
    )

    job = status.job
    if waiting_on_throttling(job):
        return (
            "it fails with NoCapacity if EC2 still throttles its launches then (throttling is per account and "
            "Region: on-demand launches are throttled alike)"
        )
    allowed_families = status.allowed_families
    spent = costs.total_usd if costs is not None else status.cost(now)
    limits = job.spec.limits
    assert job.waiting_since is not None
    types = launchable_types(job.spec, allowed_families)
    at = job.waiting_since + timedelta(hours=limits.max_wait_hours)
    zones = sorted({a.pool.availability_zone for a in status.attempts}) or ["us-east-1a"]  # names only
    # Place's own ranking then (spotrelay.control.decisions.rank_pools), with no spot at all
    decision = rank_pools(
        job,
        job.work_done_hours,
        MarketSeen(quotes=[], zones=zones, on_demand_prices=catalog_on_demand_prices(types)),
        max(at, now),
        migrates=True,
        billing_usd=max(0.0, spent - job.cost_usd),
        out_of_patience=True,
    )
    families = "" if allowed_families is not None else " (if the stack allows its family)"
    if decision.ranked:
        best = decision.ranked[0]
        return (
            f"it goes on-demand ({best.pool.instance_type} at ${best.hourly_price:.3f}/h){families}; NoCapacity "
            "as long again later if on-demand is refused too"
        )
    if not limits.on_demand_fallback:
        return "it fails with NoCapacity (limits.on_demand_fallback is off)"
    if any(r.pool.market is Market.ON_DEMAND for r in decision.rejected):
        why = decision.why_none(market=False).replace("now", "then", 1)
    else:  # the market choice never looks at on-demand: no deadline, or none within the cap
        why = decision.market.reason.split(";")[0]
    return f"it fails with NoCapacity: {why}"


def attempts_table(status: JobStatus) -> Table:
    # Two lines a row (type over zone, start over end): an 80-column terminal shows every column whole
    table = Table(
        Column("#", no_wrap=True),
        Column("pool", no_wrap=True),
        Column("market", no_wrap=True),
        Column("$/h", no_wrap=True),
        Column("instance", overflow="fold"),
        Column("from / to", no_wrap=True),
        Column("outcome", no_wrap=True),
        box=box.SIMPLE_HEAD,
    )
    for a in status.attempts:
        table.add_row(
            str(a.attempt),
            f"{a.pool.instance_type}\n{a.pool.availability_zone}",
            a.pool.market.value,
            f"{a.hourly_price:.3f}",
            a.instance_id or "-",
            f"{a.started_at:%m-%d %H:%M}\n{a.ended_at:%m-%d %H:%M}" if a.ended_at else f"{a.started_at:%m-%d %H:%M}\n-",
            a.outcome.value if a.outcome else ("standby" if a.is_standby else "live"),
        )
    return table
