"""The replay's invariants (spotrelay.local.invariants): the checks, one pure function of a `Snapshot`.

`check_invariants(snapshot) -> [Violation]` runs each check in turn: outcomes, instances, resumes, one
runner, readable records, bills (the invariants themselves are listed in spotrelay.local.invariants).
Siblings: spotrelay.local.invariants_snapshot (what a check looks at and reports),
spotrelay.local.invariants_reads (reading moto), spotrelay.local.invariants (the monitor).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from spotrelay.local.invariants_snapshot import (
    RUNNING_STATES,
    WORK_EPSILON,
    CommittedCheckpoint,
    Snapshot,
    Violation,
    _iso,
)
from spotrelay.models import Attempt, JobState, Market
from spotrelay.models.billing import billed_usd

if TYPE_CHECKING:
    from spotrelay.market import SpotMarket


def check_invariants(snapshot: Snapshot) -> list[Violation]:
    return [
        *check_outcomes(snapshot),
        *check_instances(snapshot),
        *check_resumes(snapshot),
        *check_one_runner(snapshot),
        *check_readable(snapshot),
        *check_bills(snapshot),
    ]


def check_outcomes(s: Snapshot) -> list[Violation]:
    found: list[Violation] = []
    if s.final:  # an accepted message is a job: admitted, or FAILED with its reason, never lost
        for job_id, at in sorted(s.submitted.items()):
            if job_id not in s.jobs:
                found.append(
                    Violation("never-recorded", job_id, f"submitted at {_iso(at)}, no record at the end", s.now)
                )
    for job_id, job in sorted(s.jobs.items()):
        first = s.first_terminal.get(job_id)
        if first is not None and (job.run < first[0] or (job.run == first[0] and job.state is not first[1])):
            ended = f"run {first[0]} ended {first[1]}, now run {job.run} {job.state}"
            found.append(Violation("terminal-state-changed", job_id, ended, s.now))
        if job.state.is_terminal:
            if job.state is not JobState.SUCCEEDED and not job.failure_reason:
                found.append(Violation("no-failure-reason", job_id, f"{job.state} without a failure_reason", s.now))
        elif s.finished:
            found.append(Violation("unfinished", job_id, f"{job.state} at the end of the replay", s.now))
        elif job.state is not JobState.QUEUED and (status := s.executions.get(job.execution_name)) != "RUNNING":
            found.append(
                Violation("not-progressing", job_id, f"{job.state}, its execution {status or 'missing'}", s.now)
            )
    return found


def check_instances(s: Snapshot) -> list[Violation]:
    named: dict[str, list[Attempt]] = {}
    for attempts in s.attempts.values():
        for record in attempts:
            if record.instance_id is not None:
                named.setdefault(record.instance_id, []).append(record)
    found: list[Violation] = []
    for instance_id, owners in sorted(named.items()):
        if len(owners) > 1:
            which = ", ".join(f"{a.job_id} attempt {a.attempt}" for a in owners)
            found.append(
                Violation("billed-twice", owners[0].job_id, f"{instance_id} is named by {which}", s.now, instance_id)
            )
    limit = s.reconcile_period + s.orphan_grace
    for instance in s.instances:
        if instance.state not in RUNNING_STATES:
            continue
        owners = named.get(instance.instance_id, [])
        job_id = owners[0].job_id if owners else instance.job_id
        attempt = owners[0].attempt if owners else instance.attempt
        tagged = s.jobs.get(instance.job_id) if instance.job_id is not None else None
        # Launch records its attempt a moment after RunInstances returns, and again when a throttled or
        # crashed Launch is retried (the same client token: the same instance): an instance its tags give to
        # a live job is that job's for reconcile's grace (ORPHAN_GRACE_SECONDS), as reconcile itself holds
        being_recorded = (
            tagged is not None and not tagged.state.is_terminal and s.now - instance.launched_at <= s.orphan_grace
        )
        if not owners and not being_recorded:
            found.append(
                Violation(
                    "unattributed-instance",
                    job_id,
                    f"{instance.instance_id} ({instance.state}, launched {_iso(instance.launched_at)}) is named "
                    "by no attempt record: its hours are billed to no job",
                    s.now,
                    instance.instance_id,
                )
            )
        job = s.jobs.get(job_id) if job_id is not None else None
        live = [a for a in owners if a.outcome is None]
        ended_job = job is not None and job.state.is_terminal
        if live and not ended_job:
            continue
        # orphaned since its launch, the end of its last attempt, or (its attempt left open) its job's end
        # (an instance kept to debug its job's failure: since it stopped being kept)
        ends = [a.ended_at for a in owners if a.ended_at is not None]
        since = max([instance.launched_at, *ends, *(a.kept_end for a in owners if a.kept_end is not None)])
        if live and job is not None and job.ended_at is not None:
            since = max(since, job.ended_at)
        if s.now - since <= limit:
            continue
        minutes = (s.now - since).total_seconds() / 60
        if ended_job and job is not None:
            kind, why = "instance-of-ended-job", f"runs {minutes:.0f} min after its job ended {job.state}"
        else:
            kind, why = "orphan-instance", f"runs {minutes:.0f} min without a live attempt"
        found.append(
            Violation(
                kind,
                job_id,
                f"{instance.instance_id} ({instance.state}) {why} (allowed: {limit.total_seconds() / 60:g} min)",
                s.now,
                instance.instance_id,
                attempt,
            )
        )
    return found


def _newest_before(commits: Sequence[CommittedCheckpoint], when: datetime) -> CommittedCheckpoint | None:
    before = [c for c in commits if c.at < when]
    return max(before, key=lambda c: c.order) if before else None


def _order(order: tuple[int, int] | None) -> str:
    return f"{order[0]}-{order[1]}" if order is not None else "none"


def check_resumes(s: Snapshot) -> list[Violation]:
    by_job: dict[str, list[CommittedCheckpoint]] = {}
    for commit in s.commits:
        by_job.setdefault(commit.job_id, []).append(commit)
    found: list[Violation] = []
    for start in s.starts:
        newest = _newest_before(by_job.get(start.job_id, []), start.at)
        if newest is not None and (start.restored is None or start.restored < newest.order):
            found.append(
                Violation(
                    "stale-resume",
                    start.job_id,
                    f"attempt {start.attempt} started the job at {_iso(start.at)} from checkpoint "
                    f"{_order(start.restored)}; {_order(newest.order)} was committed at {_iso(newest.at)}",
                    s.now,
                    attempt=start.attempt,
                    subject=_iso(start.at),
                )
            )
    for job_id, attempts in sorted(s.attempts.items()):
        for attempt in attempts:
            newest = _newest_before(by_job.get(job_id, []), attempt.started_at)
            if newest is None or newest.work_done_hours is None:
                continue
            if attempt.work_done_hours_at_start + WORK_EPSILON < newest.work_done_hours:
                found.append(
                    Violation(
                        "stale-start-record",
                        job_id,
                        f"attempt {attempt.attempt} (started {_iso(attempt.started_at)}) records "
                        f"{attempt.work_done_hours_at_start:.4f} h done at its start; checkpoint "
                        f"{_order(newest.order)} held {newest.work_done_hours:.4f} h",
                        s.now,
                        attempt.instance_id,
                        attempt.attempt,
                    )
                )
    return found


def check_one_runner(s: Snapshot) -> list[Violation]:
    found: list[Violation] = []
    for job_id, attempts in sorted(s.attempts.items()):
        running = [a for a in attempts if a.outcome is None and not a.is_standby]
        if len(running) > 1:
            which = ", ".join(f"attempt {a.attempt} on {a.instance_id or 'no instance'}" for a in running)
            last = running[-1]
            found.append(
                Violation("runs-twice", job_id, f"live at once: {which}", s.now, last.instance_id, last.attempt)
            )
    return found


# A settled bill against the scenario's prices: DescribeSpotPriceHistory gives prices to 6 decimals and
# times to the second (spotrelay.local.ec2_market)
BILL_TOLERANCE_USD = 1e-4


def scenario_bill(market: SpotMarket, attempt: Attempt) -> float | None:
    """What EC2 bills `attempt`'s spot instance from its launch to its `billed_until` at the scenario's prices
    (the launch price where the market has none). None if its bill is not ended, or it is not spot."""
    end = attempt.billed_until
    if end is None or attempt.pool.market is not Market.SPOT:
        return None
    changes = market.price_changes(attempt.pool, market.to_hours(attempt.started_at), market.to_hours(end))
    return billed_usd(
        attempt.hourly_price, [(market.to_datetime(t), usd) for t, usd in changes], attempt.started_at, end
    )


def check_bills(s: Snapshot) -> list[Violation]:
    states = {i.instance_id: i.state for i in s.instances}
    found: list[Violation] = []
    for job_id, attempts in sorted(s.attempts.items()):
        for a in attempts:
            state = states.get(a.instance_id or "")
            if a.billed_until is not None and state in RUNNING_STATES:
                found.append(
                    Violation(
                        "bill-ended-early",
                        job_id,
                        f"{a.instance_id} ({state}) is billed to attempt {a.attempt} only until {_iso(a.billed_until)}",
                        s.now,
                        a.instance_id,
                        a.attempt,
                    )
                )
            expected = scenario_bill(s.market, a) if s.market is not None and a.cost_usd is not None else None
            if expected is not None and a.cost_usd is not None and abs(a.cost_usd - expected) > BILL_TOLERANCE_USD:
                found.append(
                    Violation(
                        "billed-off-price",
                        job_id,
                        f"attempt {a.attempt} on {a.pool.offering} is billed ${a.cost_usd:.4f} from "
                        f"{_iso(a.started_at)} to {_iso(a.billed_until or s.now)}; at the prices in effect "
                        f"it is ${expected:.4f}",
                        s.now,
                        a.instance_id,
                        a.attempt,
                    )
                )
    return found


def check_readable(s: Snapshot) -> list[Violation]:
    return [
        Violation(
            "unreadable-record",
            r.pk.removeprefix("JOB#") if r.pk.startswith("JOB#") else None,
            f"{r.pk} {r.sk}: {r.error}",
            s.now,
            subject=f"{r.pk} {r.sk}",
        )
        for r in s.unreadable
    ]


__all__ = [
    "BILL_TOLERANCE_USD",
    "check_bills",
    "check_instances",
    "check_invariants",
    "check_one_runner",
    "check_outcomes",
    "check_readable",
    "check_resumes",
    "scenario_bill",
]
