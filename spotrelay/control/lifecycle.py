"""The JobLifecycle steps: Place, Launch (the Run task), Recover and Finalize.

Each step is called by one Lambda with the state machine's payload, reads the job fresh, and is
idempotent: Step Functions retries a step after a timeout or a throttled invocation, and the second
run must not launch a second instance, count an interruption twice or charge an attempt twice.
Step results are small dicts the state machine's Choice states read (`action`, `wait_seconds`, ...).

What each step decides is spotrelay.control.decisions (pure functions, which the benchmark runs too);
how attempts are closed and jobs totalled, spotrelay.control.accounting; what an error's Cause says,
spotrelay.control.causes. The four steps stay together here (about 600 lines): they are one state
machine's, and read in its order.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotrelay.config import (
    ERROR_CANCELLED,
    LAUNCH_THROTTLED_RETRY_ATTEMPTS,
    LAUNCH_THROTTLED_RETRY_BACKOFF,
    LAUNCH_THROTTLED_RETRY_FIRST_SECONDS,
    LAUNCH_THROTTLED_RETRY_MAX_SECONDS,
)
from spotrelay.control.accounting import account, close_attempt, on_demand_cost
from spotrelay.control.causes import (
    MAX_ERROR_NAME_CHARS,
    end_kind,
    error_cause,
    exit_code,
    failure_reason,
    lambda_error_message,
)
from spotrelay.control.decisions import (
    MAX_FAILURE_REASON_CHARS,
    THROTTLED_NOTE,
    THROTTLED_WAIT_MAX_SECONDS,
    MarketSeen,
    Recovery,
    StepResult,
    catalog_on_demand_prices,
    closing_outcome,
    count_attempt,
    end_job,
    final_outcome,
    forget_preference,
    instances_to_terminate,
    keep_failed_until,
    launch_order,
    launchable_types,
    one_line,
    patience_spent,
    plan_place,
    plan_reclaim_wait,
    plan_recovery,
    plan_standby,
    rank_pools,
    reclaim_ends,
    refusal_block,
)
from spotrelay.control.dispatcher import printable
from spotrelay.control.jobs import update_attempt, update_job
from spotrelay.control.ports import (
    CheckpointPointer,
    Clock,
    Compute,
    ConflictError,
    InstanceRef,
    JobStore,
    LaunchRefused,
    NotFoundError,
    UnreadableRecordError,
    Wakeup,
)
from spotrelay.control.ports import LaunchRequest as LaunchRequestModel
from spotrelay.models import (
    Attempt,
    AttemptOutcome,
    Job,
    JobState,
    Market,
    PlannedPool,
)
from spotrelay.policy import (
    AttemptEnded,
    EndKind,
    InterruptionModel,
)


def launch_throttled_retry_waits() -> list[int]:
    """The waits before each of the Run task's retries of LaunchThrottled (spotrelay.config's
    LAUNCH_THROTTLED_RETRY_*), in seconds, as Step Functions computes them (no jitter)."""
    first, rate, cap = (
        LAUNCH_THROTTLED_RETRY_FIRST_SECONDS,
        LAUNCH_THROTTLED_RETRY_BACKOFF,
        LAUNCH_THROTTLED_RETRY_MAX_SECONDS,
    )
    return [min(first * rate**n, cap) for n in range(LAUNCH_THROTTLED_RETRY_ATTEMPTS)]


LAUNCH_CALLS_PER_THROTTLED_ROUND = 1 + LAUNCH_THROTTLED_RETRY_ATTEMPTS  # the Run task's first call and its retries
THROTTLED_ROUND_RETRY_SECONDS = sum(launch_throttled_retry_waits())  # 90
THROTTLED_LAUNCHES_PER_HOUR = math.ceil(
    LAUNCH_CALLS_PER_THROTTLED_ROUND * 3600 / (THROTTLED_ROUND_RETRY_SECONDS + THROTTLED_WAIT_MAX_SECONDS)
)

# After an interruption warning, Recover waits for the attempt's final checkpoint this long at most:
# the notice gives two minutes, the agent commits within them, plus slack for the upload's tail.
FINAL_CHECKPOINT_WAIT_SECONDS = 150
FINAL_CHECKPOINT_POLL_SECONDS = 15


class JobCancelled(Exception):  # the class name is the error name the state machine catches
    """The job was cancelled: the Run task fails with this name and the state machine finalizes."""


class InsufficientInstanceCapacity(Exception):  # as above
    """Every ranked pool refused the launch: the state machine goes back to Place."""


class LaunchThrottled(Exception):  # as above (spotrelay.config.ERROR_LAUNCH_THROTTLED)
    """EC2 throttled RunInstances (RequestLimitExceeded). EC2 meters API calls per account and Region, not
    per pool, so this says nothing of the pool's capacity: no pool is blocked, no other pool is tried (the
    call would be throttled too), the job keeps its plan. The Run task retries on this error with backoff,
    then goes back to Place (stacks/lifecycle_construct.py). Raised by `Compute.launch`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


class PlacementContext(BaseModel):
    """What Place and Launch know of the deployment: the subnets per AZ and the allowed families."""

    model_config = ConfigDict(frozen=True)

    subnets: Mapping[str, str]  # AZ -> subnet id
    allowed_families: tuple[str, ...]


# --------------------------------------------------------------------------------------------- Place


def place_step(
    job_id: str, *, store: JobStore, compute: Compute, clock: Clock, context: PlacementContext
) -> StepResult:
    """Rank the pools for the job now; hand the best few to Launch, or wait, or give up."""
    now = clock.now()
    job, _ = store.get_job(job_id)
    if job.cancel_requested or job.state is JobState.CANCELLED:
        return StepResult(action="fail", error=ERROR_CANCELLED, cause="cancelled by the user")
    if job.state.is_terminal:
        return StepResult(action="fail", error="JobEnded", cause=f"job is already {job.state}")

    pointer = store.get_checkpoint(job_id)
    work_done = pointer.work_done_hours if pointer is not None else job.work_done_hours
    # A standby only ever waits for a job that Recover has just taken off its attempt (RECOVERING): a job
    # waiting for capacity costs no query here (one read of its latest attempt if it prefers a pool).
    latest: Attempt | None = None
    if job.state is JobState.RECOVERING:
        attempts = store.attempts(job_id)
        latest = next((a for a in attempts if a.attempt == job.attempts), None)
        standby = next((a for a in attempts if a.is_standby and a.handover_from == job.attempts), None)
        if standby is not None:
            # The job was handed back to move onto the standby launched ahead of it (make-before-break):
            # no new decision, Launch adopts the standby (or launches as usual if it has ended meanwhile).
            _, planned = update_job(store, job_id, lambda fresh: plan_standby(fresh, standby, work_done, now))
            return planned
    elif job.preferred_pool is not None and job.attempts > 0:
        try:
            latest = store.get_attempt(job_id, job.attempts)
        except (NotFoundError, UnreadableRecordError):  # as before this read: nothing said it is reclaimed
            latest = None
    ends = reclaim_ends(latest, now)
    reclaiming = latest.pool if latest is not None and ends is not None else None
    if ends is not None and reclaiming is not None and reclaiming == job.preferred_pool:
        _, waited = update_job(store, job_id, lambda fresh: plan_reclaim_wait(fresh, reclaiming, ends, now))
        return waited
    # `migrates`: reconcile moves a job running on on-demand back to spot once it is ahead of the uniform
    # line again (Uniform Progress's rule 3), so an idle job behind schedule with no spot catches up on
    # on-demand (rule 1) once it is behind by more than rule 1's band (spotrelay.policy.market_choice). The
    # Wait below is capped at the time the net is due. A job whose patience (`max_wait_hours`) ran out goes
    # on-demand if it may, wherever it is against the line, rather than fail with NoCapacity.
    decision = rank_pools(
        job,
        work_done,
        market_seen(job, store=store, compute=compute, now=now, context=context),
        now,
        migrates=True,
        out_of_patience=patience_spent(job.waiting_since, job.spec.limits.max_wait_hours, now),
        reclaiming=reclaiming,
    )
    _, result = update_job(store, job_id, lambda fresh: plan_place(fresh, decision, work_done, now))
    return result


def market_seen(job: Job, *, store: JobStore, compute: Compute, now: datetime, context: PlacementContext) -> MarketSeen:
    """What the deployment knows of the market for the job now (what `rank_pools` decides from): the spot
    prices of its launchable types (the stack's families) in the zones with a subnet, their on-demand
    prices, the pools' blocks and interruption record."""
    types = launchable_types(job.spec, context.allowed_families)
    zones = sorted(context.subnets)
    quotes = compute.spot_prices(types, zones, now) if types else []
    return MarketSeen(
        quotes=[q for q in quotes if q.pool.availability_zone in context.subnets],
        zones=zones,
        on_demand_prices=catalog_on_demand_prices(types),
        blocks=store.blocked_pools(now),
        interruptions=InterruptionModel(observed=store.pool_observations()),
    )


# -------------------------------------------------------------------------------------------- Launch


def client_token(job_id: str, attempt: int, planned: PlannedPool) -> str:
    """EC2 idempotency token (<= 64 ASCII characters): the same launch twice gets the same instance."""
    key = f"{job_id}:{attempt}:{planned.pool.offering}:{planned.pool.market}"
    return hashlib.sha256(key.encode()).hexdigest()[:64]


def launch_step(
    job_id: str,
    task_token: str,
    *,
    store: JobStore,
    compute: Compute,
    clock: Clock,
    context: PlacementContext,
    heartbeat_timeout_seconds: int | None = None,
) -> dict[str, Any]:
    """Start an instance in the first ranked pool that has capacity; record the attempt with the
    Run task's token (and its heartbeat timeout, which the agent paces its heartbeats by). Raises
    InsufficientInstanceCapacity when every pool refuses, LaunchThrottled as soon as EC2 throttles a launch
    (not a refusal: nothing is blocked, the Run task retries), and JobCancelled when the job is cancelled or
    has ended, before the launch or while it ran (`_handed_over`)."""
    now = clock.now()
    job, _ = store.get_job(job_id)
    if job.cancel_requested or job.state.is_terminal:
        raise JobCancelled(f"job {job_id} is {job.state}")
    pointer = store.get_checkpoint(job_id)
    attempts = store.attempts(job_id)
    for attempt in attempts:
        if attempt.task_token == task_token:  # this Run task already launched (a retried invocation)
            if attempt.instance_id is not None:
                # Again (idempotent): the first invocation may have stopped between the attempt and its ref,
                # and without the ref every EC2 event of the instance (its interruption warning too) is
                # ignored as not ours.
                store.put_instance_ref(
                    InstanceRef(instance_id=attempt.instance_id, job_id=job_id, attempt=attempt.attempt)
                )
            return _handed_over(store, compute, clock, attempt, pointer, now)
    standby = next((a for a in attempts if a.is_standby and a.handover_from == job.attempts), None)
    if standby is not None:
        restored = pointer.work_done_hours if pointer is not None else None
        adopted = _adopt(store, standby, task_token, heartbeat_timeout_seconds, restored, now)
        if adopted is not None:
            return _handed_over(store, compute, clock, adopted, pointer, now)
    # A new Run task means every earlier one is over: an attempt still open belongs to a Run that
    # Step Functions retried with a new token. Close it and stop paying for its instance.
    stale = [a for a in attempts if a.outcome is None and not (standby is not None and a.attempt == standby.attempt)]
    for attempt in stale:
        update_attempt(
            store, job_id, attempt.attempt, lambda fresh: close_attempt(fresh, AttemptOutcome.LOST, now, pointer)
        )
    stale_instances = [a.instance_id for a in stale if a.instance_id is not None]
    if stale_instances:
        compute.terminate(stale_instances)
    number = max([job.attempts, *(a.attempt for a in attempts)]) + 1
    refusals: list[str] = []
    for planned in launch_order(job, store.blocked_pools(now), context.subnets, now):
        pool = planned.pool
        try:
            instance_id = launch_in_pool(job, number, planned, store=store, compute=compute, now=now, context=context)
        except LaunchThrottled as throttled:
            # the Run task retries it; past its retries Place waits (`launch_throttled`) and counts the patience
            update_job(store, job_id, _note_throttled(throttled, now))
            raise
        if isinstance(instance_id, LaunchRefused):
            refusals.append(f"{pool}: {instance_id.code}")
            if pool == job.preferred_pool:
                update_job(store, job_id, functools.partial(forget_preference, pool=pool, now=now))
            continue
        attempt = Attempt(
            job_id=job_id,
            attempt=number,
            pool=pool,
            hourly_price=planned.hourly_price,
            instance_id=instance_id,
            started_at=now,
            task_token=task_token,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
            relative_speed=planned.relative_speed,
            work_done_hours_at_start=pointer.work_done_hours if pointer is not None else job.work_done_hours,
        )
        try:
            store.put_attempt(attempt, expected_version=0)  # created only: never over a standby's record
        except ConflictError:
            # Reconcile recorded a standby under this number meanwhile (it decided while the previous
            # attempt still ran). Keep the instance if it is that standby's (the same client token gives
            # the same instance), and let Place plan the standby, which Launch then adopts.
            if store.get_attempt(job_id, number).instance_id != instance_id:
                compute.terminate([instance_id])
            _forget_throttling(store, job, now)
            raise InsufficientInstanceCapacity(f"attempt {number} was recorded concurrently: placing again") from None
        store.put_instance_ref(InstanceRef(instance_id=instance_id, job_id=job_id, attempt=number))
        return _handed_over(store, compute, clock, attempt, pointer, now)
    tried = "; ".join(refusals) or "no ranked pool is usable now (blocked, or no subnet in its zone)"
    _forget_throttling(store, job, now)
    raise InsufficientInstanceCapacity(f"every ranked pool refused: {tried}")


def _note_throttled(throttled: LaunchThrottled, now: datetime) -> Callable[[Job], None]:
    """A change for `update_job`: the LAUNCHING job waits because EC2 throttled its launch (`launch_throttled`),
    since now unless it waited already. Written once a round: the retries find it noted."""
    reason = printable(
        f"{THROTTLED_NOTE} ({throttled}): throttling is per account and Region, no pool is blocked",
        MAX_FAILURE_REASON_CHARS // 2,
    )

    def change(job: Job) -> None:
        if job.state is not JobState.LAUNCHING or job.cancel_requested:
            return
        if job.waiting_since is None or job.waiting_reason != reason:
            job.waiting_since = job.waiting_since or now
            job.waiting_reason = reason
            job.updated_at = now

    return change


def _forget_throttling(store: JobStore, job: Job, now: datetime) -> None:
    """Every ranked pool refused after an earlier try of this Run task was throttled: the job goes back to
    Place as a refused one (its throttling note cleared; its wait, `waiting_since`, goes on)."""
    if job.waiting_reason is None:
        return

    def change(fresh: Job) -> None:
        if fresh.state is JobState.LAUNCHING and fresh.waiting_reason is not None:
            fresh.waiting_reason = None
            fresh.updated_at = now

    update_job(store, job.job_id, change)


def _handed_over(
    store: JobStore,
    compute: Compute,
    clock: Clock,
    attempt: Attempt,
    pointer: CheckpointPointer | None,
    now: datetime,
) -> dict[str, Any]:
    """Count the recorded attempt on the job and return what the Run task launched, unless the job was
    cancelled, or ended, meanwhile. Launch checked the job before RunInstances, and a cancel can land
    while RunInstances runs (seconds): it then finds no attempt to stop, and on AWS it stops the execution,
    so no Finalize follows. So Launch looks at the job again after its write of the attempt, and cancel
    looks at the attempts after its write of `cancel_requested` (spotrelay.control.cancel). Both reads are
    consistent, so at least one side sees the other's write. If Launch sees the cancel, it terminates the
    instance it launched, closes the attempt CANCELLED, and raises JobCancelled (FinalizeCancelled, where
    the execution still runs). So no instance runs for an ended job after Launch has seen the cancel."""
    running = attempt.running_at is not None
    job, _ = update_job(
        store, attempt.job_id, lambda fresh: count_attempt(fresh, attempt.attempt, now, running=running)
    )
    if not (job.cancel_requested or job.state.is_terminal):
        return _launched(attempt)
    stop_for_ended_job(store, compute, attempt, pointer, clock.now())
    raise JobCancelled(
        f"job {attempt.job_id} is {job.state}{' (cancel requested)' if job.cancel_requested else ''}: attempt "
        f"{attempt.attempt}'s instance {attempt.instance_id} terminated as soon as it was launched"
    )


def stop_for_ended_job(
    store: JobStore, compute: Compute, attempt: Attempt, pointer: CheckpointPointer | None, at: datetime
) -> None:
    """Stop the instance of an attempt launched for a job that was cancelled, or ended, while RunInstances
    ran (Launch's attempt, reconcile's standby): terminate it first, so that the bill stops even if a write
    below fails; close the attempt CANCELLED at `at`, when the end was seen (charged for its seconds); total
    the job again from the attempts read after it, since a total that cancel or Finalize wrote before this
    close misses it."""
    if attempt.instance_id is not None:
        compute.terminate([attempt.instance_id])
    update_attempt(
        store,
        attempt.job_id,
        attempt.attempt,
        lambda fresh: close_attempt(fresh, AttemptOutcome.CANCELLED, at, pointer),
    )
    update_job(store, attempt.job_id, lambda fresh: account(fresh, store.attempts(fresh.job_id), pointer, at))


def launch_in_pool(
    job: Job,
    number: int,
    planned: PlannedPool,
    *,
    store: JobStore,
    compute: Compute,
    now: datetime,
    context: PlacementContext,
) -> str | LaunchRefused:
    """Start attempt `number`'s instance in one pool (idempotent by its client token): the instance id,
    or the refusal, after which the pool is blocked for every job for REFUSED_POOL_BLOCK_MINUTES.
    LaunchThrottled (EC2 throttling the call) is not a refusal: it is raised, and nothing is blocked."""
    pool = planned.pool
    request = LaunchRequestModel(
        job_id=job.job_id,
        job_name=job.spec.name,
        attempt=number,
        pool=pool,
        subnet_id=context.subnets[pool.availability_zone],
        max_price=job.spec.limits.max_price_per_hour if pool.market is Market.SPOT else None,
        client_token=client_token(job.job_id, number, planned),
        tags=dict(job.spec.tags),
    )
    try:
        return compute.launch(request)
    except LaunchRefused as refused:
        store.block_pool(refusal_block(pool, refused.code, now))
        return refused


def _adopt(
    store: JobStore,
    standby: Attempt,
    task_token: str,
    heartbeat_timeout_seconds: int | None,
    restored_work: float | None,
    now: datetime,
) -> Attempt | None:
    """Give the standby launched ahead of a handover this Run task: its agent, waiting for a token,
    restores the checkpoint the previous attempt committed when it handed the job back. A standby that
    already runs has `running_at` moved to now: the job's progress (and the work a loss would cost) on
    it starts here, not at its boot. None if the standby has ended meanwhile (interrupted, timed out):
    Launch then launches as usual."""

    def change(fresh: Attempt) -> Attempt | None:
        if not fresh.is_standby:
            return None
        update: dict[str, Any] = {"task_token": task_token, "heartbeat_timeout_seconds": heartbeat_timeout_seconds}
        if restored_work is not None:
            update["work_done_hours_at_start"] = restored_work
        if fresh.running_at is not None:
            update["running_at"] = max(fresh.running_at, now)
        return fresh.model_copy(update=update)

    adopted, changed = update_attempt(store, standby.job_id, standby.attempt, change)
    return adopted if changed or adopted.task_token == task_token else None


def _launched(attempt: Attempt) -> dict[str, Any]:
    return {
        "instance_id": attempt.instance_id,
        "attempt": attempt.attempt,
        "instance_type": attempt.pool.instance_type,
        "availability_zone": attempt.pool.availability_zone,
        "market": str(attempt.pool.market),
        "hourly_price": attempt.hourly_price,
    }


# ------------------------------------------------------------------------------------------- Recover


def recover_step(
    job_id: str, error: Mapping[str, Any], *, store: JobStore, compute: Compute, clock: Clock
) -> StepResult:
    """Close the lost attempt (terminating its instance, if it still runs), account its cost and lost
    work, and ask the job's recovery strategy what next: relaunch (back to Place, with the lost pool
    blocked or preferred) or fail."""
    now = clock.now()
    kind = end_kind(str(error.get("Error", "")))
    cause = error_cause(error)
    job, _ = store.get_job(job_id)
    attempts = store.attempts(job_id)
    current = next((a for a in attempts if a.attempt == job.attempts), None)
    if current is None:
        # no attempt to close: the job fails with the error as it came, its Cause one bounded line
        name, raw = error.get("Error"), error.get("Cause")
        message = lambda_error_message(raw) if isinstance(raw, str) else None
        return StepResult(
            action="fail",
            error=printable(str(name or "Unknown"), MAX_ERROR_NAME_CHARS),
            cause=one_line(message if message is not None else str(raw or "")),
        )
    if job.last_recovered_attempt >= current.attempt and job.last_recovery is not None:
        return StepResult.model_validate(job.last_recovery)  # a retried invocation: same answer
    pointer = store.get_checkpoint(job_id)
    final_committed = pointer is not None and (
        pointer.attempt > current.attempt or (pointer.attempt == current.attempt and pointer.final)
    )
    if (
        kind is EndKind.SPOT_INTERRUPTED
        and current.interrupted_at is not None
        and not final_committed
        and (now - current.interrupted_at).total_seconds() < FINAL_CHECKPOINT_WAIT_SECONDS
    ):
        return StepResult(action="wait_checkpoint", wait_seconds=FINAL_CHECKPOINT_POLL_SECONDS)

    # Closed before its instance is terminated: the instance's `shutting-down` may be handled (ec2_events)
    # before this step goes on, and must find the attempt closed, not a spot instance going away unwarned (an
    # interruption). A retry finds it closed and terminates again (idempotent).
    closed, closed_now = update_attempt(
        store, job_id, current.attempt, lambda fresh: close_attempt(fresh, kind.outcome, now, pointer)
    )
    ended = [closed if a.attempt == current.attempt else a for a in attempts]
    event = AttemptEnded(kind=kind, pool=current.pool, at=now, attempt=current.attempt, exit_code=exit_code(cause))
    keep = _keep_until(job, ended, pointer, event, closed, now) if current.instance_id is not None else None
    if keep is not None:
        # The job's code failed for good and the job asked to keep its instance to look at: kept, billed
        closed, _ = update_attempt(store, job_id, current.attempt, lambda fresh: _kept(fresh, keep))
        ended = [closed if a.attempt == current.attempt else a for a in ended]
    if current.instance_id is not None and not closed.kept_at(now):
        compute.terminate([current.instance_id])  # a failed job's or a silent instance's: stop the bill
    if closed_now and closed.pool.market is Market.SPOT:  # the interruption statistics are of spot pools
        interrupted = kind.is_interruption and closed.interrupted_at is None  # ec2_events counted warnings
        store.record_pool_usage(closed.pool, closed.runtime_hours(now), int(interrupted))

    def change(fresh: Job) -> Recovery:
        if fresh.last_recovered_attempt < current.attempt or fresh.last_recovery is None:
            account(fresh, ended, pointer, now)
        recovery = plan_recovery(fresh, ended, event, now)
        # Before the job's write: a retried invocation returns the recorded answer without blocking again
        for block in recovery.blocks:
            store.block_pool(block)
        return recovery

    _, recovery = update_job(store, job_id, change)
    return recovery.result


def _keep_until(
    job: Job,
    ended: list[Attempt],
    pointer: CheckpointPointer | None,
    event: AttemptEnded,
    closed: Attempt,
    now: datetime,
) -> datetime | None:
    """Until when the closed attempt's instance is kept (None: terminated now), as Recover's decision (made
    again below on a fresh read) fails the job: `keep_failed_until` of the job as it would be recorded."""
    if job.state.is_terminal or job.cancel_requested:
        return None  # a late Recover of an ended or cancelled job keeps nothing
    copy = job.model_copy(deep=True)
    account(copy, ended, pointer, now)
    return keep_failed_until(copy, plan_recovery(copy, ended, event, now).result, closed.hourly_price, now)


def _kept(fresh: Attempt, until: datetime) -> Attempt | None:
    if fresh.kept_until is not None or fresh.outcome is not AttemptOutcome.FAILED:
        return None
    return fresh.model_copy(update={"kept_until": until})


# ------------------------------------------------------------------------------------------ Finalize


class JobSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    state: JobState
    attempts: int
    interruptions: int
    cost_usd: float
    on_demand_cost_usd: float
    lost_work_hours: float
    failure_reason: str | None


def finalize_step(
    job_id: str,
    final: Mapping[str, Any],
    *,
    store: JobStore,
    compute: Compute,
    clock: Clock,
    wakeup: Wakeup,
) -> JobSummary:
    """End the job: close and terminate its live attempt, total its cost, record the final state
    (a job already ended keeps its state: a cancel wins over a late failure), wake the dispatcher."""
    now = clock.now()
    ending = final_outcome(final)
    attempts = store.attempts(job_id)
    pointer = store.get_checkpoint(job_id)
    ended: list[Attempt] = []
    for attempt in attempts:
        if attempt.outcome is None:
            attempt, closed_now = update_attempt(
                store,
                job_id,
                attempt.attempt,
                lambda fresh: close_attempt(fresh, closing_outcome(fresh, ending.attempt_outcome), now, pointer),
            )
            if closed_now and attempt.pool.market is Market.SPOT:
                store.record_pool_usage(attempt.pool, attempt.runtime_hours(now), 0)
        ended.append(attempt)
    current = store.get_job(job_id)[0].attempts  # the attempt whose end ends the job (a standby may number more)
    instance_ids = instances_to_terminate(ended, current, now)  # but the one kept to debug this failure
    if instance_ids:
        compute.terminate(instance_ids)
    reason = None if ending.state is JobState.SUCCEEDED else failure_reason(ending.error)

    def change(fresh: Job) -> None:
        account(fresh, ended, pointer, now)
        end_job(fresh, ending.state, reason, now)

    job, _ = update_job(store, job_id, change)
    wakeup.wake_dispatcher(f"job {job_id} ended {job.state}")
    return summarize(job, ended, now)


def summarize(job: Job, attempts: Sequence[Attempt], now: datetime) -> JobSummary:
    on_demand = on_demand_cost(attempts, now)
    return JobSummary(
        job_id=job.job_id,
        state=job.state,
        attempts=job.attempts,
        interruptions=job.interruptions,
        cost_usd=round(job.cost_usd, 6),
        on_demand_cost_usd=round(on_demand, 6),
        lost_work_hours=round(job.lost_work_hours, 6),
        failure_reason=job.failure_reason,
    )
