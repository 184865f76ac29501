"""Reconcile (on the schedule): make the world agree with the table when an event was missed.

- An instance tagged spotrelay:managed whose attempt is not live (or that no attempt knows) is
  terminated: it costs money and runs nothing we track.
- A live attempt whose instance is gone (terminated, stopped, or unknown to EC2) has its Run task failed
  as the state-change event would have, by the same rule (`spotrelay.control.ec2_events.state_change_action`):
  a spot instance gone before any interruption warning was noted is an interruption, not a loss (the
  attempt's `interrupted_at` set, so that Recover waits for its final checkpoint; the pool blocked for the
  job's `recovery.block_minutes`; the task failed with SpotInterrupted), an on-demand one is lost
  (InstanceLost).
- A running job whose spend reached `limits.max_total_cost` has its Run task failed with
  BudgetExhausted (the state machine finalizes it as FAILED and terminates the instance). The spend is
  the prices in effect integrated (spotrelay.models.billing): the attempts' settled bills, and the spot
  price history since the launch of each other one. Each pool's history is read at most once a run, over
  the one window all the budgeted jobs' unsettled attempts there need (`billing.price_windows`).
- A bill whose instance's state change was missed is settled here (`end_billing`): a live attempt's
  when its instance is found gone, an ended attempt's at its close once its instance is gone.
- An admitted job whose execution has ended (or never started) without reaching a terminal state is
  repaired: an ended execution fails the job with the reason; a missing one is started.
- A job running on on-demand whose progress is ahead of the uniform line again (Uniform Progress's rule
  3), or behind it with a spot pool where a run is expected to pay for the switch (judged from the job's
  own interrupted runs there: `spotrelay.policy.placement.spot_run_pays_off`), with a feasible spot
  pool, is moved back to spot, make-before-break: a spot instance is launched first, as a standby
  attempt with no task token (a refused launch changes nothing for the job: the pool is blocked as at
  any refusal; a throttled one, LaunchThrottled, is reported in `move_errors` and tried again at the next
  run, nothing blocked). A job cancelled or ended while the standby's RunInstances ran has the standby
  terminated and closed at once, as Launch does (`spotrelay.control.lifecycle.stop_for_ended_job`). Once
  the standby runs (ec2_events, or here if that event was missed) the on-demand
  attempt's agent is asked to checkpoint and hand the job back; Launch adopts the standby. A standby
  that is not running within STANDBY_BOOT_SECONDS, or not adopted within STANDBY_HANDOVER_SECONDS of
  running, is terminated and closed; the next try for the same attempt waits STANDBY_RETRY_SECONDS,
  doubling with each failed standby. (Needs the deployment's placement context; the schedule's rate is
  how soon a job is noticed.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from spotrelay.config import ERROR_BUDGET_EXHAUSTED, ERROR_INSTANCE_LOST, ERROR_SPOT_INTERRUPTED
from spotrelay.control.accounting import account, close_attempt, close_standby
from spotrelay.control.decisions import (
    GONE_STATES,
    AskHandover,
    DropStandby,
    bill_overdue,
    billing_ends_by,
    budget_cause,
    end_job,
    execution_ended_reason,
    instance_gone,
    moves_back_considered,
    over_budget,
    rank_pools,
    runs_on_demand,
    standby_pools,
    standby_retry_at,
    supervise_standby,
    untracked_instance,
)
from spotrelay.control.ec2_events import (
    Interrupt,
    Lose,
    StateChangeDetail,
    end_billing,
    record_interruption,
    state_change_action,
)
from spotrelay.control.jobs import ask_handover, mark_running, update_attempt, update_job, withdraw_handover
from spotrelay.control.lifecycle import (
    PlacementContext,
    launch_in_pool,
    market_seen,
    stop_for_ended_job,
)
from spotrelay.control.ports import (
    Clock,
    Compute,
    ConflictError,
    InstanceRef,
    JobStore,
    LaunchRefused,
    NotFoundError,
    UnreadableRecordError,
    Workflow,
)
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, PriceQuote
from spotrelay.models.billing import PriceWindow, SeriesKey, cost_so_far, price_windows
from spotrelay.policy.placement import spot_run_hours

# A gone instance's state as its state-change event gives it
_AS_STATE_CHANGE: dict[str, Literal["stopping", "stopped", "shutting-down", "terminated"]] = {
    "stopping": "stopping",
    "stopped": "stopped",
    "shutting-down": "shutting-down",
    "terminated": "terminated",
}


class ReconcileReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    terminated_orphans: list[str] = []
    lost_attempts: list[str] = []  # job#attempt whose on-demand instance was found gone: InstanceLost
    # job#attempt whose spot instance was found gone before any interruption warning: SpotInterrupted
    interrupted_attempts: list[str] = []
    over_budget: list[str] = []  # jobs whose Run task was failed with BudgetExhausted
    repaired_jobs: list[str] = []
    restarted_executions: list[str] = []
    standbys: list[str] = []  # spot standbys launched ahead of a handover (job#attempt)
    migrating: list[str] = []  # on-demand attempts asked to hand their job back to a running standby
    dropped_standbys: list[str] = []  # standbys given up (gone, or not running/adopted in time)
    # "job#attempt: error" of a move back to spot that raised (an EC2 or DynamoDB error): the job is left
    # as it was, the other jobs are still reconciled, and the next run tries again
    move_errors: list[str] = []
    # "job_id: error" or "instance_id: error" of a record that does not read back: left as it is (an instance
    # is not terminated: whether it runs a live job cannot be told), the others reconciled, reported every run
    unreadable: list[str] = []


def reconcile(
    *,
    store: JobStore,
    compute: Compute,
    workflow: Workflow,
    clock: Clock,
    heartbeat_seconds: int,
    placement: PlacementContext | None = None,
) -> ReconcileReport:
    now = clock.now()
    orphans: list[str] = []
    kept: list[Attempt] = []  # attempts whose instance was kept to debug a failure, terminated now
    managed = compute.managed_instances()
    # The states of this run's one listing (every managed instance not terminated), read again only for an
    # instance it did not list: one DescribeInstances per run, not one per live attempt (see `_state`)
    listed = {instance.instance_id: instance.state for instance in managed}
    # The active jobs and their attempts, read once for both passes. An instance a live attempt of an active
    # job names is not an orphan: only the others are looked up (their ref, attempt and job), so a run over
    # healthy jobs costs two reads per job, not three more per instance.
    unreadable: list[str] = []
    active: list[Job] = []
    attempts_of: dict[str, list[Attempt]] = {}
    for listed_job in store.active_jobs():
        try:
            attempts_of[listed_job.job_id] = store.attempts(listed_job.job_id)
        except UnreadableRecordError as e:  # this job's trouble: the others are reconciled
            unreadable.append(f"{listed_job.job_id}: {e}")
            continue
        active.append(listed_job)
    tracked = {a.instance_id for attempts in attempts_of.values() for a in attempts if a.outcome is None}
    for instance in managed:
        if instance.instance_id in tracked:
            continue
        try:
            ref = store.get_instance_ref(instance.instance_id)
            attempt: Attempt | None = None
            job: Job | None = None
            if ref is not None:
                try:
                    attempt = store.get_attempt(ref.job_id, ref.attempt)
                    job, _ = store.get_job(ref.job_id)
                except NotFoundError:  # its records are gone (deleted): it runs for nobody, as with no ref
                    attempt = job = None
            verdict = untracked_instance(instance.launched_at, now, attempt, job)
            if verdict.terminate:
                orphans.append(instance.instance_id)  # before the close: terminated even if that fails
                if attempt is not None and attempt.kept_end is not None:
                    kept.append(attempt)  # its bill runs until now: settled below, whatever its event does
            if verdict.close_attempt and attempt is not None and job is not None:
                _close_left_open(job, attempt, store, now)
        except UnreadableRecordError as e:  # left running: whether it runs a live job cannot be told
            unreadable.append(f"{instance.instance_id}: {e}")
    if orphans:
        compute.terminate(orphans)
        for attempt in kept:
            end_billing(store, compute, attempt, now)
        for instance_id in orphans:
            listed.pop(instance_id, None)  # terminating now: asked again if anything still needs it

    budgeted = (a for job in active if job.spec.limits.max_total_cost is not None for a in attempts_of[job.job_id])
    prices = _PriceHistories(compute, price_windows(budgeted, now))
    lost: list[str] = []
    interrupted: list[str] = []
    exhausted: list[str] = []
    repaired: list[str] = []
    restarted: list[str] = []
    moves = _Moves()
    for job in active:
        status = workflow.status(job.execution_name)
        if status is None:
            workflow.start(job.execution_name, {"job_id": job.job_id, "heartbeat_seconds": heartbeat_seconds})
            restarted.append(job.job_id)
            continue
        if status != "RUNNING":
            try:
                _repair(store, compute, job.job_id, status, now)
            except UnreadableRecordError as e:  # its checkpoint pointer, say: the others are reconciled
                unreadable.append(f"{job.job_id}: {e}")
                continue
            repaired.append(job.job_id)
            continue
        attempts = attempts_of[job.job_id]
        try:
            _drop_stray_standbys(job, attempts, store, compute, now, moves)
        except Exception as e:  # as below: one job's trouble must not stop the safety net for the others
            moves.errors.append(f"{job.job_id}: {type(e).__name__}: {e}")
        try:
            _settle_missed_bills(attempts, store, compute, listed, now)
        except Exception as e:  # as above
            moves.errors.append(f"{job.job_id}: {type(e).__name__}: {e}")
        live = [a for a in attempts if a.outcome is None and a.attempt == job.attempts]
        for attempt in live:
            if attempt.instance_id is None or attempt.task_token is None or attempt.interrupted_at is not None:
                continue
            # every attempt so far: the live one, its standby, and standbys closed since the last total
            spent = _spent(job, attempts, prices, now)
            if over_budget(job, spent):
                workflow.fail_task(attempt.task_token, ERROR_BUDGET_EXHAUSTED, budget_cause(job, spent))
                exhausted.append(job.job_id)
                continue
            state = _state(compute, listed, attempt.instance_id)
            if instance_gone(state, attempt.started_at, now):
                failed_with = _instance_gone(job, attempt, state, store, workflow, now)
                if failed_with is not None:
                    (interrupted if failed_with == ERROR_SPOT_INTERRUPTED else lost).append(
                        f"{job.job_id}#{attempt.attempt}"
                    )
                end_billing(store, compute, attempt, now)  # its state change was missed: gone by now at the latest
                continue
            if placement is not None:
                try:
                    _back_to_spot(job, attempt, attempts, store, compute, clock, listed, now, placement, moves)
                except Exception as e:  # one job's failed move must not stop the safety net for the others
                    moves.errors.append(f"{job.job_id}#{attempt.attempt}: {type(e).__name__}: {e}")
    return ReconcileReport(
        terminated_orphans=orphans,
        lost_attempts=lost,
        interrupted_attempts=interrupted,
        over_budget=exhausted,
        repaired_jobs=repaired,
        restarted_executions=restarted,
        standbys=moves.standbys,
        migrating=moves.migrating,
        dropped_standbys=moves.dropped,
        move_errors=moves.errors,
        unreadable=unreadable,
    )


def _instance_gone(
    job: Job, attempt: Attempt, state: str, store: JobStore, workflow: Workflow, now: datetime
) -> str | None:
    """Fail the Run task of a live attempt whose instance is gone (`state`; "unknown": EC2 no longer knows
    it, as it forgets a terminated instance) as the state-change event it missed would have, by the same
    rule (`state_change_action`, module docstring of spotrelay.control.ec2_events): a spot instance is
    interrupted, its `interrupted_at` set now, so that Recover waits for the final checkpoint its agent may
    have committed; an on-demand one is lost. The error the task was failed with (None: nothing to do)."""
    assert attempt.instance_id is not None
    assert attempt.task_token is not None
    gone = _AS_STATE_CHANGE.get(state, "terminated")  # EC2 forgets a terminated instance in about an hour
    action = state_change_action(
        StateChangeDetail.model_construct(instance_id=attempt.instance_id, state=gone), attempt, job
    )
    if isinstance(action, Interrupt):
        block_minutes = job.spec.recovery.block_minutes  # the block its recovery would put there
        record_interruption(attempt, now, first=action.first_notice, store=store, block_minutes=block_minutes)
        error = ERROR_SPOT_INTERRUPTED
    elif isinstance(action, Lose):
        error = ERROR_INSTANCE_LOST
    else:
        return None
    cause = json.dumps({"instance_id": attempt.instance_id, "state": state, "by": "reconcile"})
    workflow.fail_task(attempt.task_token, error, cause)
    return error


def _state(compute: Compute, listed: dict[str, str], instance_id: str) -> str:
    """An instance's state as this run's listing of managed instances saw it. One the listing left out
    (terminated, launched since, not ours, or not found: "unknown") is asked for, and remembered."""
    if instance_id not in listed:
        listed[instance_id] = compute.instance_states([instance_id]).get(instance_id, "unknown")
    return listed[instance_id]


@dataclass
class _Moves:
    standbys: list[str] = field(default_factory=list)
    migrating: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _back_to_spot(
    job: Job,
    attempt: Attempt,
    attempts: list[Attempt],
    store: JobStore,
    compute: Compute,
    clock: Clock,
    listed: dict[str, str],
    now: datetime,
    context: PlacementContext,
    moves: _Moves,
) -> None:
    """Move a job running on on-demand back to spot when the market choice says so (its progress is ahead
    of the uniform line by two restarts, Uniform Progress's rule 3, or a spot run pays for the switch)
    and a spot pool is feasible: launch a standby there, ask for the handover once it runs, give it up
    when it does not run or is not adopted in time."""
    if not runs_on_demand(attempt):
        return
    ours = [a for a in attempts if a.handover_from == attempt.attempt]
    standby = next((a for a in ours if a.is_standby), None)
    if standby is not None:
        _supervise(job, attempt, standby, store, compute, listed, now, moves)
        return
    if not moves_back_considered(job, attempt):
        return
    retry_at = standby_retry_at(ours)
    if retry_at is not None and now < retry_at:
        return
    assert attempt.running_at is not None  # runs_on_demand
    ran = max(0.0, (now - attempt.running_at).total_seconds() / 3600)
    progress = max(job.work_done_hours, attempt.work_done_hours_at_start + ran * attempt.relative_speed)
    decision = rank_pools(
        job,
        progress,
        market_seen(job, store=store, compute=compute, now=now, context=context),
        now,
        current_market=Market.ON_DEMAND,
        billing_usd=attempt.cost(now),
        spot_runs=spot_run_hours(attempts),
    )
    pools = standby_pools(decision, context.subnets)
    if not pools:
        return
    number = max([job.attempts, *(a.attempt for a in attempts)]) + 1
    for planned in pools:
        launched = launch_in_pool(job, number, planned, store=store, compute=compute, now=now, context=context)
        if isinstance(launched, LaunchRefused):
            continue
        standby = Attempt(
            job_id=job.job_id,
            attempt=number,
            pool=planned.pool,
            hourly_price=planned.hourly_price,
            instance_id=launched,
            started_at=now,
            relative_speed=planned.relative_speed,
            work_done_hours_at_start=progress,  # Launch sets the restored checkpoint's at the adoption
            handover_from=attempt.attempt,
        )
        try:
            store.put_attempt(standby, expected_version=0)  # created only: Launch may have taken the number
        except ConflictError:
            if store.get_attempt(job.job_id, number).instance_id != launched:  # the same token: Launch's own
                compute.terminate([launched])
            raise
        store.put_instance_ref(InstanceRef(instance_id=launched, job_id=job.job_id, attempt=number))
        # The decision was made from reads taken before the launch, which took seconds. A job cancelled or
        # ended meanwhile (cancel and Finalize may not have seen the standby): as Launch does, terminate
        # the standby first, close it CANCELLED now, and total the job again. A job that moved on another
        # way (its attempt ended, Recover relaunched it): drop the standby, unless Launch adopts it first.
        fresh_job, _ = store.get_job(job.job_id)
        if fresh_job.state.is_terminal or fresh_job.cancel_requested:
            stop_for_ended_job(store, compute, standby, None, clock.now())
            moves.dropped.append(f"{job.job_id}#{number}")
            return
        current = store.get_attempt(job.job_id, attempt.attempt)
        if fresh_job.attempts != attempt.attempt or current.outcome is not None:
            _drop(standby, store, compute, clock.now(), moves, outcome=AttemptOutcome.LAUNCH_FAILED)
            return
        moves.standbys.append(f"{job.job_id}#{number}")
        return


def _supervise(
    job: Job,
    attempt: Attempt,
    standby: Attempt,
    store: JobStore,
    compute: Compute,
    listed: dict[str, str],
    now: datetime,
    moves: _Moves,
) -> None:
    """A standby of the job's current on-demand attempt: ask for the handover once it runs (if the
    `running` event was missed), give it up if it is gone or late."""
    assert standby.instance_id is not None
    verdict = supervise_standby(job, standby, _state(compute, listed, standby.instance_id), now)
    if isinstance(verdict, DropStandby):
        _drop(standby, store, compute, now, moves, outcome=verdict.outcome)
        update_attempt(store, job.job_id, attempt.attempt, withdraw_handover)
        return
    if not isinstance(verdict, AskHandover):
        return
    if verdict.record_running:
        update_attempt(store, job.job_id, standby.attempt, mark_running(now))
    _, asked = update_attempt(store, job.job_id, attempt.attempt, ask_handover(now))
    if asked:
        moves.migrating.append(f"{job.job_id}#{attempt.attempt}")


def _drop_stray_standbys(
    job: Job, attempts: list[Attempt], store: JobStore, compute: Compute, now: datetime, moves: _Moves
) -> None:
    """A standby whose attempt is no longer the job's current one, and that Launch did not adopt (the job
    moved on another way), is of no use: terminate and close it. A standby waits for its adoption while
    its attempt has ended but Recover has not moved the job on yet (the attempt is still job.attempts)."""
    for standby in attempts:
        if standby.is_standby and standby.handover_from != job.attempts:
            _drop(standby, store, compute, now, moves, outcome=AttemptOutcome.LAUNCH_FAILED)


def _drop(
    standby: Attempt,
    store: JobStore,
    compute: Compute,
    now: datetime,
    moves: _Moves,
    *,
    outcome: AttemptOutcome,
) -> None:
    """Close a standby with `outcome` (LOST if its instance went away, LAUNCH_FAILED if it never took the
    job over), then terminate it. Closed first, by a conditional write: a standby Launch adopted meanwhile is no
    longer a standby and keeps its instance."""
    if close_standby(store, standby, outcome, now) is None:
        return
    if standby.instance_id is not None:
        compute.terminate([standby.instance_id])
    moves.dropped.append(f"{standby.job_id}#{standby.attempt}")


def _close_left_open(job: Job, attempt: Attempt, store: JobStore, now: datetime) -> None:
    """An attempt still open on a job that has ended (a standby recorded while Finalize or cancel closed
    the job's attempts): close it as CANCELLED and add its cost to the job's."""
    _, closed = update_attempt(
        store, job.job_id, attempt.attempt, lambda fresh: close_attempt(fresh, AttemptOutcome.CANCELLED, now, None)
    )
    if closed:
        _retotal(store, job.job_id, now)


def _retotal(store: JobStore, job_id: str, now: datetime) -> None:
    """The job's cost and lost work again from all its attempts (one closed after the job was totalled)."""
    attempts = store.attempts(job_id)
    update_job(store, job_id, lambda fresh: account(fresh, attempts, None, now))


class _PriceHistories:
    """This run's spot price histories: a pool's is read (DescribeSpotPriceHistory) the first time a job's
    spend needs it, once, over `planned` (`billing.price_windows` of every budgeted job's attempts), so that
    several attempts in one pool, of one job or of many, cost one call a run, not one each."""

    def __init__(self, compute: Compute, planned: dict[SeriesKey, PriceWindow]) -> None:
        self.compute = compute
        self.planned = planned
        self.read: dict[SeriesKey, tuple[PriceWindow, list[PriceQuote]]] = {}

    def for_attempts(self, attempts: Iterable[Attempt], now: datetime) -> dict[SeriesKey, Sequence[PriceQuote]]:
        """The histories of the pools of `attempts` that need prices, each over a window that covers them."""
        histories: dict[SeriesKey, Sequence[PriceQuote]] = {}
        for key, needed in price_windows(attempts, now).items():
            known = self.read.get(key)
            if known is None or not (known[0].start <= needed.start and needed.end <= known[0].end):
                # Not read yet, or wider than what was (an attempt the plan did not see): over both
                window = self.planned.get(key, needed) if known is None else known[0]
                window = PriceWindow(needed.pool, min(window.start, needed.start), max(window.end, needed.end))
                known = (window, self.compute.spot_price_history(window.pool, window.start, window.end))
                self.read[key] = known
            histories[key] = known[1]
        return histories


def _spent(job: Job, attempts: list[Attempt], prices: _PriceHistories, now: datetime) -> float:
    """What the job's attempts have cost up to `now` at the prices in effect (spotrelay.models.billing): the
    settled bills, and each other spot attempt's price series from its launch (DescribeSpotPriceHistory, read
    once a run per pool: `_PriceHistories`). 0 for a job without a budget: no price is asked for."""
    if job.spec.limits.max_total_cost is None:
        return 0.0
    histories = prices.for_attempts(attempts, now)
    return sum(cost_so_far(attempt, histories, now) for attempt in attempts)


def _settle_missed_bills(
    attempts: list[Attempt], store: JobStore, compute: Compute, listed: dict[str, str], now: datetime
) -> None:
    """An ended attempt whose bill is not settled ORPHAN_GRACE_SECONDS after its close, its instance gone
    (its state change missed): settle it at the close. The step that closed it terminated the instance then
    (each does), so EC2 billed it until then at the latest; an earlier report, late, still moves the end
    back. An instance still there is the orphan pass's to terminate, and its state change settles it."""
    for attempt in attempts:
        end = billing_ends_by(attempt)
        if not bill_overdue(attempt, now) or attempt.instance_id is None or end is None:
            continue
        state = _state(compute, listed, attempt.instance_id)
        if state in GONE_STATES or state == "unknown":  # "unknown" at once: it was closed minutes ago
            end_billing(store, compute, attempt, end)


def _repair(store: JobStore, compute: Compute, job_id: str, status: str, now: datetime) -> None:
    """The execution ended without finalizing the job: close its live attempts, terminate their
    instances and fail the job with the reason."""
    attempts = store.attempts(job_id)
    pointer = store.get_checkpoint(job_id)
    ended = []
    instance_ids = []
    for attempt in attempts:
        if attempt.outcome is None:
            if attempt.instance_id is not None:
                instance_ids.append(attempt.instance_id)
            attempt, _ = update_attempt(
                store, job_id, attempt.attempt, lambda fresh: close_attempt(fresh, AttemptOutcome.LOST, now, pointer)
            )
        ended.append(attempt)
    if instance_ids:
        compute.terminate(instance_ids)

    def change(job: Job) -> None:
        account(job, ended, pointer, now)
        end_job(job, JobState.FAILED, execution_ended_reason(status), now, keep_recorded_reason=False)

    update_job(store, job_id, change)
