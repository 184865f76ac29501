"""`spotrelay ls`: the stack's jobs (queued and live; `--all`, or an ended --state: ended ones too), filtered
by --state and --tag, as a table or as JSON rows.

Siblings: spotrelay.cli.job_status (`progress`, as `status` shows it), spotrelay.cli.job_cost_report (the
estimate's note, as `cost` prints it), spotrelay.cli.job_common (the options, the stack's client, the clock);
spotrelay.cli.job_commands has the overview.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Column, Table

from spotrelay.cli.console import err, fail, out, tables
from spotrelay.cli.costs import JobCost, job_cost
from spotrelay.cli.job_common import (
    EndpointOption,
    JsonOption,
    RegionOption,
    StackOption,
    iso_time,
    on_stack,
    prices_in_effect,
    utc_now,
)
from spotrelay.cli.job_cost_report import ESTIMATE_NOTE
from spotrelay.cli.job_status import progress
from spotrelay.models import JobState, Market, Pool

if TYPE_CHECKING:
    from spotrelay.aws.deployed_stack import JobStatus
    from spotrelay.models import Job


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
