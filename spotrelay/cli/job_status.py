"""`spotrelay status`: where a job stands, in words (`describe_status`, with what Place does once a waiting
job's patience is spent: `after_patience`) over its attempts table, or as JSON; with --watch, shown again at
every read of `wait`'s polling (spotrelay.cli.job_wait) until the job ends.

Siblings: spotrelay.cli.job_list (`ls`, which shows `progress` as here), spotrelay.cli.job_cost_report (`cost`,
whose share saved the cost line shows), spotrelay.cli.job_common (the options, the stack's client, the clock);
spotrelay.cli.job_commands has the overview.
"""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from spotrelay.cli.console import fail, option_seconds, out, tables
from spotrelay.cli.costs import (
    JobCost,
    PriceHistories,
    PriceHistoryReader,
    ec2_price_history,
    job_cost,
    spot_price_now,
)
from spotrelay.cli.job_common import (
    EndpointOption,
    JobIdArgument,
    JsonOption,
    RegionOption,
    StackOption,
    command_clock,
    connect,
    json_line,
    on_stack,
    prices_in_effect,
    utc_now,
)
from spotrelay.cli.job_cost_report import _share
from spotrelay.cli.job_wait import wait_for_jobs
from spotrelay.models import JobState, Market, Pool, PriceQuote

if TYPE_CHECKING:
    from spotrelay.aws.deployed_stack import JobsClient, JobStatus
    from spotrelay.models import Job

# How often `status --watch` reads the job (a GetItem and a Query): the figures on screen move by the second,
# the job's state over minutes
WATCH_INTERVAL = "5s"
WATCH_MIN_SECONDS = 1.0  # as `wait --poll-seconds`


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
    from spotrelay.aws.deployed_stack import StackError

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
    for kept in (a for a in status.attempts if a.instance_id is not None and a.kept_at(now)):
        region = kept.pool.availability_zone[:-1]  # us-east-1a -> us-east-1
        lines.append(
            f"  instance {kept.instance_id} of attempt {kept.attempt} is kept to debug the failure until "
            f"{kept.kept_until:%Y-%m-%d %H:%M} UTC (recovery.keep_failed_instance_minutes; billed to the job): "
            f"aws ssm start-session --target {kept.instance_id} --region {region}"
        )
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
