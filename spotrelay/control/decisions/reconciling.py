"""Reconcile's decisions (spotrelay.control.reconcile reads EC2 and the table, asks these, carries them out).

- `untracked_instance`: a managed instance that no live attempt of an active job names is terminated
  once it is past ORPHAN_GRACE_SECONDS with no attempt recorded for it (Launch records one just after
  RunInstances returns), or at once when its attempt has ended or its job has (an instance kept to debug a
  failed job: once its `kept_until` has passed); an attempt still open on an ended job is closed first.
- `instance_gone`: an attempt's instance counts as gone when EC2 says it is stopping, stopped, shutting
  down or terminated, or no longer knows it past ORPHAN_GRACE_SECONDS from the launch (EC2 forgets a
  terminated instance in about an hour; a new one may not be listed yet).
- `over_budget` / `budget_cause`: a running job whose spend reached `limits.max_total_cost`;
  `bill_overdue`: an ended attempt whose instance's state change (its bill's end) was missed;
  `billing_ends_by`: when its instance was terminated at the latest.
- `runs_on_demand`, `moves_back_considered`, `standby_retry_at`: whether a job on on-demand is one
  reconcile may move back to spot (its attempt runs, no handover asked, a deadline to keep) and, after
  failed standbys, when the next may be tried (STANDBY_RETRY_SECONDS, doubling with each one).
- `supervise_standby`: a standby that is gone, or not running within STANDBY_BOOT_SECONDS, or not adopted
  within its handover time of running, is dropped (LOST if its instance went away in time, else
  LAUNCH_FAILED); one that runs has the handover asked for (and its `running` recorded, if the event was
  missed); else it is waited for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from spotrelay.config import ORPHAN_GRACE_SECONDS
from spotrelay.models import Attempt, AttemptOutcome, Job, Market

GONE_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
STANDBY_BOOT_SECONDS = 600
STANDBY_HANDOVER_SECONDS = 1800  # the agent reads its record every minute; a final checkpoint takes minutes
# (+ the checkpoint interval for a job that saves only on its own schedule: it hands over after its next save)
STANDBY_RETRY_SECONDS = 1800


@dataclass(frozen=True)
class Untracked:
    """What to do with a managed instance no live attempt of an active job names."""

    terminate: bool
    close_attempt: bool = False  # its attempt is still open on an ended job: close it (CANCELLED) first


def untracked_instance(
    launched_at: datetime | None, now: datetime, attempt: Attempt | None = None, job: Job | None = None
) -> Untracked:
    """`attempt` and `job`: what the instance's ref names (None: no ref is recorded for it)."""
    if attempt is None or job is None:
        return Untracked(terminate=launched_at is None or (now - launched_at).total_seconds() > ORPHAN_GRACE_SECONDS)
    if attempt.kept_at(now):
        return Untracked(terminate=False)  # kept to debug the job's failure, until `kept_until`
    if attempt.outcome is not None or job.state.is_terminal:
        return Untracked(terminate=True, close_attempt=attempt.outcome is None)
    return Untracked(terminate=False)


def instance_gone(state: str, launched_at: datetime, now: datetime) -> bool:
    """`state`: the instance's as EC2 lists it ("unknown": EC2 does not know it)."""
    young = (now - launched_at).total_seconds() < ORPHAN_GRACE_SECONDS
    return state in GONE_STATES or (state == "unknown" and not young)


def bill_overdue(attempt: Attempt, now: datetime) -> bool:
    """An ended attempt of an instance whose bill is still not settled ORPHAN_GRACE_SECONDS after its close:
    its state change was missed (once its instance is gone, reconcile settles it at the close)."""
    end = billing_ends_by(attempt)
    if attempt.cost_usd is not None or end is None or attempt.instance_id is None:
        return False
    return (now - end).total_seconds() >= ORPHAN_GRACE_SECONDS


def billing_ends_by(attempt: Attempt) -> datetime | None:
    """When the step that ended an attempt had its instance terminated: at its close, or, for an instance
    kept to debug the job's failure, when it stopped being kept (reconcile terminates it then)."""
    if attempt.ended_at is None:
        return None
    return max(attempt.ended_at, attempt.kept_end or attempt.ended_at)


def over_budget(job: Job, spent: float) -> bool:
    cap = job.spec.limits.max_total_cost
    return cap is not None and spent >= cap


def budget_cause(job: Job, spent: float) -> str:
    return json.dumps({"spent_usd": round(spent, 4), "max_total_cost": job.spec.limits.max_total_cost})


def runs_on_demand(attempt: Attempt) -> bool:
    """An attempt whose standbys reconcile supervises: it runs on on-demand."""
    return attempt.pool.market is Market.ON_DEMAND and attempt.running_at is not None


def moves_back_considered(job: Job, attempt: Attempt) -> bool:
    """A job whose current attempt runs on on-demand, with no handover asked yet and a deadline to keep
    (the market choice that may send it back to spot is made against the deadline)."""
    asked = attempt.migrate_requested_at is not None
    return runs_on_demand(attempt) and not asked and job.spec.limits.deadline_hours is not None


def standby_retry_at(standbys: Sequence[Attempt]) -> datetime | None:
    """When the next standby of an attempt may be launched, after the ended ones of `standbys` (its
    standbys so far); None: now."""
    failed = [a.ended_at for a in standbys if a.outcome is not None and a.ended_at is not None]
    if not failed:
        return None
    return max(failed) + timedelta(seconds=STANDBY_RETRY_SECONDS * 2 ** (len(failed) - 1))


def handover_seconds(job: Job) -> float:
    """How long a running standby waits for the handover."""
    checkpoint = job.spec.checkpoint
    return STANDBY_HANDOVER_SECONDS + (checkpoint.interval_minutes * 60 if checkpoint.grace_seconds == 0 else 0)


@dataclass(frozen=True)
class DropStandby:
    outcome: AttemptOutcome  # LOST: its instance went away; LAUNCH_FAILED: it never took the job over in time


@dataclass(frozen=True)
class AskHandover:
    running_at: datetime  # when the standby was (first seen) running
    record_running: bool  # its `running` event was missed: record it now


def supervise_standby(job: Job, standby: Attempt, state: str, now: datetime) -> DropStandby | AskHandover | None:
    """A standby of the job's current on-demand attempt, its instance in `state`; None: wait for it."""
    running_at = standby.running_at or (now if state == "running" else None)
    late = (
        (now - standby.started_at).total_seconds() > STANDBY_BOOT_SECONDS
        if running_at is None
        else (now - running_at).total_seconds() > handover_seconds(job)
    )
    if late:
        return DropStandby(AttemptOutcome.LAUNCH_FAILED)
    if instance_gone(state, standby.started_at, now):
        return DropStandby(AttemptOutcome.LOST)
    if running_at is None:
        return None
    return AskHandover(running_at=running_at, record_running=standby.running_at is None)
