"""`spotrelay submit / status / ls / logs / cost / cancel`: a user's jobs on a deployed stack (spotrelay.aws.stack).

The commands are plain functions; spotrelay.cli.app registers them. boto3 is imported when one runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich import box
from rich.table import Column, Table

from spotrelay.cli.console import err, fail, out, tables
from spotrelay.cli.costs import (
    JobCost,
    PriceHistories,
    ec2_price_history,
    job_cost,
    read_price_histories,
    spot_price_now,
)
from spotrelay.models import JobSpecError, JobState, Market, load_job_spec, parse_job_spec
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


def utc_now() -> datetime:
    """The time costs are counted to (tests put a virtual clock here)."""
    return datetime.now(UTC)


def connect(stack: str, region: str | None, endpoint_url: str | None) -> JobsClient:
    from spotrelay.aws.stack import JobsClient, StackError

    try:
        return JobsClient.connect(stack, region=region, endpoint_url=endpoint_url)
    except StackError as e:
        fail(str(e), e.code)


def on_stack(stack: str, region: str | None, endpoint_url: str | None, use: Callable[[JobsClient], T]) -> T:
    """`use` the stack's client; a StackError is the command's one-line error and exit status."""
    from spotrelay.aws.stack import StackError

    client = connect(stack, region, endpoint_url)
    try:
        return use(client)
    except StackError as e:
        fail(str(e), e.code)


def prices_in_effect(
    statuses: list[JobStatus], now: datetime, region: str | None, endpoint_url: str | None
) -> PriceHistories:
    """The spot price histories the jobs' unsettled attempts need, read from EC2 once per pool; a warning
    on stderr if they could not be read (those attempts then count at their launch prices)."""
    attempts = [a for s in statuses for a in s.attempts]
    if not any(needs_prices(a) for a in attempts):
        return PriceHistories()  # every bill settled, or on-demand: nothing to ask EC2
    prices = read_price_histories(attempts, now, ec2_price_history(region, endpoint_url))
    if prices.error is not None:
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
    as_json: JsonOption = False,
) -> None:
    """Check JOB.yaml, send it to the stack's job queue and print the job's id.

    \b
    The same as `aws sqs send-message --message-body "$(cat job.json)"`,
    except that a bad spec is refused here, with the field and what is
    allowed, rather than recorded FAILED by the dispatcher; and the
    dispatcher is woken at once (the queue-depth alarm would within minutes).
    """

    try:
        if str(job_file) == "-":  # `... | spotrelay submit -`
            spec = parse_job_spec(decode_document(read_stdin(), "stdin"), "stdin")
        else:
            spec = load_job_spec(job_file)
    except JobSpecError as e:
        fail(str(e))
    submitted = on_stack(stack, region, endpoint_url, lambda client: client.submit(spec, wake=wake))
    if as_json:
        answer = {
            "job_id": submitted.job_id,
            "message_id": submitted.message_id,
            "queue_url": submitted.queue_url,
            "dispatcher_woken": submitted.dispatcher_woken,
            "wake_error": submitted.wake_error,
        }
        sys.stdout.write(json.dumps(answer) + "\n")
    else:
        out.print(submitted.job_id, markup=False)
    if submitted.wake_error is not None:
        err.print(
            f"warning: could not wake the dispatcher ({submitted.wake_error}); the queue-depth alarm or the "
            "5-minute schedule admits the job",
            markup=False,
        )


def status_command(
    job_id: JobIdArgument,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Where a job stands: its state, pool, progress, cost so far (a live instance's at the spot prices in
    effect since its launch: an estimate until the instance is gone), and every attempt."""
    status = on_stack(stack, region, endpoint_url, lambda client: client.status(job_id))
    now = utc_now()
    prices = prices_in_effect([status], now, region, endpoint_url)
    if as_json:
        cost = job_cost(status, prices, now)
        answer = {
            "job": status.job.model_dump(mode="json"),
            "attempts": [a.model_dump(mode="json", exclude={"task_token"}) for a in status.attempts],
            "running_cost_usd": cost.live_usd,
            "cost_usd": cost.total_usd,
            "cost_is_estimate": cost.is_estimate,
        }
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        return
    for line in describe_status(status, now, prices):
        out.print(line, markup=False, soft_wrap=True)
    if status.attempts:
        tables().print(attempts_table(status))


def ls_command(
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    ended: Annotated[bool, typer.Option("--all", help="ended jobs too (a scan of the table)")] = False,
    as_json: JsonOption = False,
) -> None:
    """The stack's queued and live jobs (`--all`: ended ones too), oldest first."""
    jobs = on_stack(stack, region, endpoint_url, lambda client: client.jobs(ended=ended))
    if as_json:
        sys.stdout.write(json.dumps([job_row(job) for job in jobs], indent=2) + "\n")
        return
    if not jobs:
        err.print("no jobs" if ended else "no queued or live jobs (`--all` lists ended ones too)", markup=False)
        return
    # Fits 80 columns: no cost column (`cost` has each job's, with its live instance; --json has cost_usd,
    # the ended attempts'), and the submission time folds before the job, state or progress wrap
    table = Table(
        Column("job", no_wrap=True),
        Column("state", no_wrap=True),
        Column("done", no_wrap=True),
        Column("attempts", no_wrap=True),
        Column("submitted", overflow="fold"),
        box=box.SIMPLE_HEAD,
    )
    for job in jobs:
        table.add_row(
            job.job_id,
            job.state.value,
            progress(job),
            f"{job.attempts}" + (f", {job.interruptions} lost" if job.interruptions else ""),
            f"{job.submitted_at.astimezone(UTC):%m-%d %H:%M}",
        )
    tables().print(table)


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
                time.sleep(FOLLOW_POLL_SECONDS)  # a throttle or a network blip: a long follow goes on
                continue
            failures = 0
            if ended and was_live:
                # It ended while we followed: its agent sends its last batch as it exits, a few seconds on
                # ("agent done"), or never if its instance went first (a cancel): wait that long at most.
                ended_at = ended_at if ended_at is not None else time.monotonic()
                finished = latest in done or time.monotonic() - ended_at > FOLLOW_END_WAIT_SECONDS
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
            time.sleep(FOLLOW_POLL_SECONDS)
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
    job_id: JobIdArgument,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a job wherever it is: its instance is terminated, its checkpoints are kept."""
    answer = on_stack(stack, region, endpoint_url, lambda client: client.cancel(job_id))
    if as_json:
        sys.stdout.write(json.dumps(answer) + "\n")
        return
    if answer.get("already_ended"):
        out.print(f"{job_id} had already ended: {answer.get('state')}", markup=False)
        return
    if answer.get("before_admission"):
        out.print(
            f"{job_id} has no record yet: if its message is still in the queue, the dispatcher records it "
            "CANCELLED when it reads it (check the id if `spotrelay status` never shows it)",
            markup=False,
            soft_wrap=True,
        )
        return
    terminated = answer.get("terminated") or []
    gone = f"; terminated {', '.join(terminated)}" if terminated else ""
    out.print(f"{job_id} {answer.get('state')}{gone}", markup=False)


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


def job_row(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "name": job.spec.name,
        "state": job.state.value,
        "work_done_hours": job.work_done_hours,
        "work_hours": job.spec.work_hours,
        "attempts": job.attempts,
        "interruptions": job.interruptions,
        "cost_usd": job.cost_usd,  # of the ended attempts
        "submitted_at": job.submitted_at.isoformat().replace("+00:00", "Z"),  # as `status --json` writes it
        "failure_reason": job.failure_reason,
        "waiting_reason": job.waiting_reason,
    }


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
    live = status.live_attempt
    if live is not None:
        instance = live.instance_id or "no instance yet"
        since = live.running_at or live.started_at
        lines.append(
            f"  attempt {live.attempt} on {live.pool.instance_type} in {live.pool.availability_zone}, "
            f"{live.pool.market.value} at ${live.hourly_price:.3f}/h, {instance}, since {since:%Y-%m-%d %H:%M} UTC"
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
    NoCapacity (spotrelay.control.lifecycle.waiting_on_throttling); else by asking `place()` itself
    then (spotrelay.control.lifecycle.placement_now with `out_of_patience`), with no spot at all: the job's
    work done, its budget left (its cost so far: `costs`, else at launch prices) and the stack's GPU
    families (`status.allowed_families`; None: not known)."""
    from spotrelay.control.lifecycle import catalog_on_demand_prices, launchable_types, waiting_on_throttling
    from spotrelay.policy import place

    job = status.job
    if waiting_on_throttling(job):
        return (
            "it fails with NoCapacity if EC2 still throttles its launches then (throttling is per account and "
            "Region: on-demand launches are throttled alike)"
        )
    allowed_families = status.allowed_families
    spent = costs.total_usd if costs is not None else status.cost(now)
    spec, limits = job.spec, job.spec.limits
    assert job.waiting_since is not None
    types = launchable_types(spec, allowed_families)
    at = job.waiting_since + timedelta(hours=limits.max_wait_hours)
    zones = sorted({a.pool.availability_zone for a in status.attempts}) or ["us-east-1a"]  # names only
    decision = place(
        spec,
        [],
        work_done_hours=job.work_done_hours,
        elapsed_hours=job.elapsed_hours(max(at, now)),
        on_demand_prices=catalog_on_demand_prices(types),
        budget_left_usd=None if limits.max_total_cost is None else max(0.0, limits.max_total_cost - spent),
        zones=zones,
        migrates=True,
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
