"""What a job's attempts cost and lost, derived from their records: the steps, reconcile, ec2_events and
cancel close attempts and total jobs through these, so that a retried step or a late event derives the
same figures again instead of adding to them; `on_demand_cost` is the baseline a job's savings are
measured against (`spotrelay status`, `cost`, the replay's report).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.control.decisions import SPOT_NOTICE
from spotrelay.control.jobs import update_attempt
from spotrelay.control.ports import CheckpointPointer, JobStore
from spotrelay.models import Attempt, AttemptOutcome, Job, Market


def account(job: Job, attempts: Sequence[Attempt], pointer: CheckpointPointer | None, now: datetime) -> None:
    """Derive the job's cost, lost work and progress from its ended attempts and checkpoint pointer
    (derived, not accumulated, so that a retried step cannot count anything twice). An attempt's cost is its
    settled bill once its instance's end was reported (`Attempt.cost`, spotrelay.models.billing), which may
    come after its close: ec2_events derives the total again then."""
    ended = [a for a in attempts if a.outcome is not None]
    job.cost_usd = sum(a.cost(now) for a in ended)
    job.lost_work_hours = sum(a.lost_work_hours for a in ended)
    if pointer is not None:
        job.work_done_hours = max(job.work_done_hours, pointer.work_done_hours)


def close_attempt(
    attempt: Attempt, outcome: AttemptOutcome, now: datetime, pointer: CheckpointPointer | None
) -> Attempt:
    """The attempt, ended at `now` (or as it already was), with its lost work accounted: progress
    made since the instance was running, less what the checkpoints of this attempt preserved. An instance
    never seen `running` made none (lost before it booted), unless something says it ran (a notice, a
    checkpoint of this attempt): then its `running` event was lost or late, and it ran from its launch.
    It ran until `now` at the latest, but no longer than its instance: a Recover that comes late (the
    control plane was down, its events were dead-lettered and redriven) does not count the time since as
    work lost. The instance's end is its reported billing end if one came, and for an interrupted spot
    instance at most the notice's two minutes after the warning."""
    if attempt.outcome is not None:
        return attempt
    until = now
    if attempt.billed_until is not None:
        until = min(until, attempt.billed_until)
    if attempt.interrupted_at is not None and attempt.pool.market is Market.SPOT:
        until = min(until, attempt.interrupted_at + SPOT_NOTICE)
    own = pointer if pointer is not None and pointer.attempt == attempt.attempt else None  # its checkpoint
    ran_from = attempt.running_at
    if ran_from is None and (
        attempt.interrupted_at is not None
        or attempt.rebalance_at is not None
        or attempt.migrate_requested_at is not None
        or own is not None
    ):
        ran_from = attempt.started_at
    ran = 0.0 if ran_from is None else max(0.0, (until - ran_from).total_seconds() / 3600)
    progress = ran * attempt.relative_speed
    saved = 0.0 if own is None else max(0.0, own.work_done_hours - attempt.work_done_hours_at_start)
    # Nothing of it is lost when it succeeded; when it is a standby, which never ran the job (no token); or
    # when its own final checkpoint (taken once the job stopped, at a notice or a handover) is the newest:
    # everything it did is what the next attempt restores, whether or not the job reports its progress.
    kept_all = own is not None and own.final
    nothing_lost = outcome is AttemptOutcome.SUCCEEDED or attempt.is_standby or kept_all
    lost = 0.0 if nothing_lost else max(0.0, progress - saved)
    return attempt.model_copy(update={"outcome": outcome, "ended_at": now, "lost_work_hours": lost})


def close_standby(store: JobStore, standby: Attempt, outcome: AttemptOutcome, at: datetime) -> Attempt | None:
    """Close a standby (a conditional write: one Launch adopted meanwhile is no longer a standby and stays
    open) and put its hours into its pool's record. The closed attempt, or None if this call did not close it."""
    closed, changed = update_attempt(
        store,
        standby.job_id,
        standby.attempt,
        lambda fresh: close_attempt(fresh, outcome, at, None) if fresh.is_standby else None,
    )
    if not changed:
        return None
    if closed.pool.market is Market.SPOT and closed.running_at is not None:
        store.record_pool_usage(closed.pool, closed.runtime_hours(at), 0)
    return closed


def on_demand_cost(attempts: Sequence[Attempt], now: datetime) -> float:
    """What the attempts' billed instance hours would have cost on on-demand (the catalog's prices): the
    baseline a job's savings are measured against."""
    total = 0.0
    for attempt in attempts:
        facts = INSTANCE_TYPES.get(attempt.pool.instance_type)
        if facts is not None and facts.on_demand_usd_per_hour is not None:
            total += facts.on_demand_usd_per_hour * attempt.billed_hours(now)
    return total
