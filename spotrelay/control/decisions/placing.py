"""Place, Launch and Recover, and the pools of reconcile's move back to spot (the package docstring:
spotrelay.control.decisions)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotrelay.catalog import INSTANCE_TYPES, family_of
from spotrelay.config import ERROR_CANCELLED, SPOT_NOTICE_SECONDS
from spotrelay.control.dispatcher import printable
from spotrelay.models import Attempt, Job, JobSpec, JobState, Market, PlannedPool, Pool, PriceQuote, ensure_transition
from spotrelay.policy import (
    AttemptEnded,
    BlockedPool,
    Fail,
    InterruptionModel,
    MarketAction,
    MarketDecision,
    Placement,
    active_blocks,
    decide_recovery,
    place,
)

# How many of the ranked pools Place hands to Launch.
PLAN_DEPTH = 10
# Backoff while no pool is feasible: 1, 2, then every 3 minutes (the Wait state sleeps it). At most the
# refused-launch block: a waiting job tries a pool again as soon as its block lapses, so it finds
# capacity within minutes of its return (a Place and a Launch every 3 minutes cost next to nothing;
# every minute of a late start eats slack that on-demand may have to buy back).
WAIT_BASE_SECONDS = 60
MIN_WAIT_SECONDS = 1
# A pool that refused a launch (no capacity, price) is skipped for this long: Karpenter's unavailable-
# offerings cache TTL (UnavailableOfferingsTTL, 3 min, aws/karpenter-provider-aws pkg/cache). Capacity
# comes back quickly: on the Can't Be Late traces, a 10-minute block costs more per job than a 3-minute one
# (the bench's spotrelay replayed with either value).
REFUSED_POOL_BLOCK_MINUTES = 3
WAIT_MAX_SECONDS = REFUSED_POOL_BLOCK_MINUTES * 60
# A launch EC2 throttled past the Run task's own retries (LaunchThrottled: the first call and 6 retries over
# 90 s, stacks/lifecycle_construct.py) comes back to Place, which waits before it plans again, as it does when
# no pool is feasible (WaitForCapacity): as long as the job has waited already (Launch notes the first throttled
# launch as the start of its wait, `waiting_since`), at least THROTTLED_WAIT_MIN_SECONDS and at most
# THROTTLED_WAIT_MAX_SECONDS. Each round about doubles the job's wait, as a backoff does, with no counter to
# keep; the job's patience (`limits.max_wait_hours`) then fails it NoCapacity, as a capacity outage does. So
# under throttling that never ends a job makes at most 7 RunInstances calls a round, its rounds starting at 0,
# 3, 9, 20.5 minutes and then every 11.5 minutes (90 s of retries and the wait): at most 49 calls in its first
# hour and 37 an hour after (`THROTTLED_LAUNCHES_PER_HOUR`), and once one round more, when a wait is cut
# short to end with the job's patience (the Place at its end plans once more, and the round it launches fails
# the job within 90 s of its patience rather than up to 11.5 minutes after). No pool is blocked, and waking
# sooner would not help: EC2 meters the calls per account and Region, both markets alike.
THROTTLED_WAIT_MIN_SECONDS = 60
THROTTLED_WAIT_MAX_SECONDS = 600
THROTTLED_NOTE = "EC2 throttled RunInstances"  # how Launch's note of a throttled launch starts
# A failed job's `failure_reason` (`spotrelay status`, the replay's timeline): one line, the error's name and
# message, never a stack trace.
MAX_FAILURE_REASON_CHARS = 500
SPOT_NOTICE = timedelta(seconds=SPOT_NOTICE_SECONDS)  # EC2's interruption notice (spotrelay.config)
# Spot pools a job on on-demand tries for its standby per reconcile run (each refusal blocks its pool)
STANDBY_POOLS_TRIED = 3


class StepResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: str
    wait_seconds: int = 0
    error: str | None = None
    cause: str | None = None

    def payload(self) -> dict[str, Any]:
        return self.model_dump()


@dataclass(frozen=True)
class MarketSeen:
    """What a step knows of the market now: the spot quotes of the job's launchable types in the zones it
    may use (`zones`: those with a subnet), their on-demand prices, the pools' blocks (refused launches,
    recoveries) and the interruption record (the pools' observed interruptions, and the Advisor's bands
    where known)."""

    quotes: Sequence[PriceQuote]
    zones: Sequence[str]
    on_demand_prices: Mapping[str, float]
    blocks: Sequence[BlockedPool] = ()
    interruptions: InterruptionModel = field(default_factory=InterruptionModel)


# --------------------------------------------------------------------------------------------- Place


def rank_pools(
    job: Job,
    work_done: float,
    market: MarketSeen,
    now: datetime,
    *,
    current_market: Market | None = None,
    migrates: bool = False,
    billing_usd: float = 0.0,
    spot_runs: Mapping[str, Sequence[float]] | None = None,
    out_of_patience: bool = False,
    reclaiming: Pool | None = None,
) -> Placement:
    """`place()` for the job at `now` with `work_done` hours done and the market as seen.
    `current_market`: the market of the instance the job runs on (None: idle); `billing_usd`: what its
    open attempts have cost so far (not in `job.cost_usd` until they are closed); `migrates`, `spot_runs`,
    `out_of_patience`: see `place()`. Same-pool-first: the pool recovery asked for is exempt from the block
    its own loss put there, once EC2 has taken the lost instance back: `reclaiming` (`reclaiming_pool`), the
    pool of an interruption whose notice still runs, is never offered (an instance launched there now
    would be launched into the capacity EC2 is reclaiming, and lost again within the notice)."""
    limits = job.spec.limits
    blocked = blocked_for(job, market.blocks, now)
    return place(
        job.spec,
        market.quotes,
        work_done_hours=work_done,
        elapsed_hours=job.elapsed_hours(now),
        blocked=blocked | {reclaiming} if reclaiming is not None else blocked,
        interruptions=market.interruptions,
        on_demand_prices=market.on_demand_prices,
        budget_left_usd=(
            None if limits.max_total_cost is None else max(0.0, limits.max_total_cost - job.cost_usd - billing_usd)
        ),
        zones=market.zones,
        current_market=current_market,
        migrates=migrates,
        spot_runs=spot_runs,
        out_of_patience=out_of_patience,
    )


def blocked_for(job: Job, blocks: Iterable[BlockedPool], now: datetime) -> frozenset[Pool]:
    """The pools `blocks` keep the job out of at `now`: those blocked then, less the pool its recovery
    prefers (same-pool-first, a lost only pool), which is exempt from the blocks its own loss put there."""
    return active_blocks(blocks, now) - {job.preferred_pool}


def _ended(job: Job) -> StepResult | None:
    """Place's answer for a job cancelled or ended meanwhile (the state machine finalizes it), else None."""
    if job.cancel_requested or job.state.is_terminal:
        return StepResult(action="fail", error=ERROR_CANCELLED, cause="cancelled by the user")
    return None


def reclaim_ends(attempt: Attempt | None, now: datetime) -> datetime | None:
    """When EC2 has taken back the instance of the job's latest attempt, if it is still doing so at `now`
    (a spot interruption warning less than SPOT_NOTICE ago; None otherwise): Recover goes on as soon as the
    final checkpoint is committed, seconds into the notice, and until the notice ends the pool still shows
    the capacity that is being reclaimed."""
    if attempt is None or attempt.pool.market is not Market.SPOT or attempt.interrupted_at is None:
        return None
    ends = attempt.interrupted_at + SPOT_NOTICE
    return ends if now < ends else None


def plan_reclaim_wait(job: Job, pool: Pool, ends: datetime, now: datetime) -> StepResult:
    """Place for a job that prefers the pool EC2 is still taking its instance back from (same-pool-first,
    or a lost only pool): wait for the notice to end, then go back to it (an instance launched now would run
    on the capacity being reclaimed, and be lost again within the notice). Not a wait for capacity: the
    job's patience (`waiting_since`) and backoff (`place_waits`) are left as they are."""
    if (ended := _ended(job)) is not None:
        return ended
    job.state = ensure_transition(job.state, JobState.PLACING)
    job.state = ensure_transition(job.state, JobState.WAITING)
    job.updated_at = now
    seconds = max(MIN_WAIT_SECONDS, math.ceil((ends - now).total_seconds()))
    return StepResult(action="wait", wait_seconds=seconds, cause=f"EC2 is taking its instance in {pool} back")


def plan_place(job: Job, decision: Placement, work_done: float, now: datetime) -> StepResult:
    """Place's answer for the job (changed as Place writes it): launch its best PLAN_DEPTH pools (the
    preferred one first, same-pool-first, if placement still finds it feasible), wait, or give up with
    NoCapacity once its patience is spent with nothing launched; after a launch EC2 throttled past the Run
    task's retries, wait before planning again however many pools rank. A job cancelled or ended fails."""
    if (ended := _ended(job)) is not None:
        return ended
    throttled = launch_throttled(job)
    job.state = ensure_transition(job.state, JobState.PLACING)
    job.work_done_hours = max(job.work_done_hours, work_done)
    job.updated_at = now
    if throttled:
        return _wait_after_throttling(job, decision, now)
    ranked = decision.ranked[:PLAN_DEPTH]
    if ranked:
        plan = [PlannedPool(pool=r.pool, hourly_price=r.hourly_price, relative_speed=r.relative_speed) for r in ranked]
        preferred = job.preferred_pool
        if preferred is not None:
            plan.sort(key=lambda p: p.pool != preferred)
        job.placement = tuple(plan)
        job.place_waits = 0
        job.waiting_reason = None
        # `waiting_since` stays: the wait ends when an instance is launched (`count_attempt`), not when a
        # plan is made, or a job whose every launch is refused would never run out of patience.
        job.state = ensure_transition(job.state, JobState.LAUNCHING)
        return StepResult(action="launch")
    waiting_since = job.waiting_since or now
    waited_hours = (now - waiting_since).total_seconds() / 3600
    if waited_hours >= patience_hours(job.spec.limits.max_wait_hours, decision):
        return _no_capacity(job, waited_hours, " | ".join(decision.explain(alternatives=0)))
    wait = place_wait_seconds(job.place_waits, decision.market)
    job.place_waits += 1
    job.waiting_since = waiting_since
    job.waiting_reason = decision.why_none()
    job.state = ensure_transition(job.state, JobState.WAITING)
    return StepResult(action="wait", wait_seconds=wait, cause=decision.market.reason)


def plan_standby(job: Job, standby: Attempt, work_done: float, now: datetime) -> StepResult:
    """Place for a job handed back to move onto the standby launched ahead of it (make-before-break): no
    new decision, the plan is the standby's pool, which Launch adopts."""
    if (ended := _ended(job)) is not None:
        return ended
    job.state = ensure_transition(job.state, JobState.PLACING)
    job.work_done_hours = max(job.work_done_hours, work_done)
    job.placement = (
        PlannedPool(pool=standby.pool, hourly_price=standby.hourly_price, relative_speed=standby.relative_speed),
    )
    job.place_waits = 0
    job.waiting_reason = None
    job.state = ensure_transition(job.state, JobState.LAUNCHING)
    job.updated_at = now
    return StepResult(action="launch", cause=f"onto the standby {standby.instance_id} in {standby.pool}")


def _no_capacity(job: Job, waited_hours: float, last: str) -> StepResult:
    """The job's patience is spent with nothing launched: Place gives up (the state machine finalizes)."""
    return StepResult(
        action="fail",
        error="NoCapacity",
        cause=(
            f"nothing launched for {waited_hours:.1f} h (limits.max_wait_hours "
            f"{job.spec.limits.max_wait_hours:g}); last: {last}"
        ),
    )


def waiting_on_throttling(job: Job) -> bool:
    """Whether what the job waits on is EC2 throttling its launches (Launch's note), not capacity: once
    its patience is spent it fails NoCapacity (`_wait_after_throttling`), on-demand fallback or not, since
    EC2 throttles the on-demand launches of the account and Region alike."""
    return job.waiting_reason is not None and job.waiting_reason.startswith(THROTTLED_NOTE)


def launch_throttled(job: Job) -> bool:
    """Whether the job is back at Place from a Run task whose launch EC2 throttled past its retries. Launch
    notes a throttled launch as why the job waits (`waiting_reason`, on the LAUNCHING job); every other way to
    LAUNCHING clears it (Place's plans, a launch, every ranked pool refusing), and nothing else writes it on a
    job past QUEUED."""
    return job.state is JobState.LAUNCHING and job.waiting_reason is not None


def _wait_after_throttling(job: Job, decision: Placement, now: datetime) -> StepResult:
    """Place after a throttled launch (`launch_throttled`): the job WAITs `throttled_wait_seconds`, or fails
    NoCapacity once it has waited its patience (`patience_hours`: as a capacity outage's job does)."""
    assert job.waiting_reason is not None
    waiting_since = job.waiting_since or now
    waited = (now - waiting_since).total_seconds()
    patience = patience_hours(job.spec.limits.max_wait_hours, decision) * 3600
    if waited >= patience:
        return _no_capacity(job, waited / 3600, job.waiting_reason)
    job.waiting_since = waiting_since
    job.place_waits += 1
    job.state = ensure_transition(job.state, JobState.WAITING)
    wait = throttled_wait_seconds(waited, patience - waited)
    return StepResult(action="wait", wait_seconds=wait, cause=job.waiting_reason)


def throttled_wait_seconds(waited_seconds: float, patience_left_seconds: float) -> int:
    """How long a job whose launch EC2 throttled waits before Place plans again, when it has waited
    `waited_seconds` (since its first throttled launch, or earlier) and has `patience_left_seconds` of patience:
    as long again, within THROTTLED_WAIT_MIN_SECONDS and THROTTLED_WAIT_MAX_SECONDS, and no later than its
    patience runs out (so that it fails on time: see THROTTLED_WAIT_MIN_SECONDS)."""
    backoff = min(THROTTLED_WAIT_MAX_SECONDS, max(THROTTLED_WAIT_MIN_SECONDS, math.ceil(waited_seconds)))
    return max(MIN_WAIT_SECONDS, min(backoff, math.ceil(patience_left_seconds)))


def launchable_types(spec: JobSpec, allowed_families: Collection[str] | None) -> list[str]:
    """The instance types that fit the job in the stack's GPU families (None: every family)."""
    return [
        t.name
        for t in spec.resources.fitting_types()
        if allowed_families is None or family_of(t.name) in allowed_families
    ]


def catalog_on_demand_prices(types: Iterable[str]) -> dict[str, float]:
    """The catalog's on-demand prices of `types` (those it prices)."""
    return {name: price for name in types if (price := INSTANCE_TYPES[name].on_demand_usd_per_hour) is not None}


def patience_spent(waiting_since: datetime | None, max_wait_hours: float, now: datetime) -> bool:
    """Whether a job waiting since `waiting_since` (None: not waiting) has waited `max_wait_hours` (its
    `limits.max_wait_hours`), after which Place puts it on on-demand if it may (`place(out_of_patience=)`),
    and fails it with NoCapacity if nothing can be launched (`patience_hours`)."""
    return waiting_since is not None and (now - waiting_since).total_seconds() / 3600 >= max_wait_hours


def patience_hours(max_wait_hours: float, decision: Placement) -> float:
    """How long a job may wait without a launch before Place fails it with NoCapacity: its `max_wait_hours`,
    twice that when the market choice picked on-demand and on-demand pools are blocked only by refused
    launches (an on-demand shortage is usually short: a job out of patience keeps trying on-demand, as
    the blocks lapse, for another `max_wait_hours`)."""
    on_demand_refused = decision.market.action is MarketAction.ON_DEMAND and any(
        r.pool.market is Market.ON_DEMAND and r.category == "blocked" for r in decision.rejected
    )
    return 2 * max_wait_hours if on_demand_refused else max_wait_hours


def place_wait_seconds(place_waits: int, market: MarketDecision) -> int:
    """How long a job with no pool to launch in waits before Place runs again, its `place_waits`-th wait
    in a row: 1, 2, then every 3 minutes (the refused-pool block), sooner if Uniform Progress's safety net
    is due first."""
    backoff: int = min(WAIT_BASE_SECONDS * 2 ** min(place_waits, 16), WAIT_MAX_SECONDS)
    to_net = _seconds_to_safety_net(market)
    # Wake by the net while it is ahead (a job told to wait exactly at it: a second later, when rule 4's
    # strict comparison fires); once it is due and still nothing can be placed (every pool blocked, over
    # the budget or the cap), waking sooner would not help: the backoff paces Place.
    if to_net > 0 or market.action is MarketAction.WAIT:
        return min(backoff, max(MIN_WAIT_SECONDS, to_net))
    return backoff


def _seconds_to_safety_net(market: MarketDecision) -> int:
    """How long a waiting job may sleep before Uniform Progress's safety net is due (the slack down to
    two restart overheads and the work a preemption may lose; <= 0: due already): a job that woke later
    could miss a deadline that was still reachable. No net (no deadline, or no on-demand to fall back
    on): the longest wait."""
    hours = market.hours_to_safety_net
    if hours is None:
        return WAIT_MAX_SECONDS
    return math.ceil(hours * 3600)


# -------------------------------------------------------------------------------------------- Launch


def launch_order(job: Job, blocks: Iterable[BlockedPool], zones: Collection[str], now: datetime) -> list[PlannedPool]:
    """The pools of the job's plan that Launch tries, in the plan's order: those in a zone the deployment
    has a subnet in (`zones`) and not blocked for the job at `now` (`blocked_for`)."""
    blocked = blocked_for(job, blocks, now)
    return [p for p in job.placement if p.pool.availability_zone in zones and p.pool not in blocked]


def refusal_block(pool: Pool, code: str, now: datetime) -> BlockedPool:
    """The block a refused launch puts on its pool, for every job: REFUSED_POOL_BLOCK_MINUTES."""
    return BlockedPool(
        pool=pool, until=now + timedelta(minutes=REFUSED_POOL_BLOCK_MINUTES), reason=f"launch refused: {code}"
    )


def warning_block(attempt: Attempt, at: datetime, block_minutes: float) -> BlockedPool:
    """The block an interruption warning (at `at`) puts on its attempt's pool, for every job: the
    deployment's `block_minutes` (spotrelay.config.INTERRUPTION_BLOCK_MINUTES by default), and at least
    until the notice ends (a shorter setting would offer other jobs the capacity being reclaimed). A job
    whose only spot pool this is is exempt: its recovery prefers the pool (and waits for the notice's end,
    `plan_reclaim_wait`)."""
    return BlockedPool(
        pool=attempt.pool,
        until=at + max(timedelta(minutes=block_minutes), SPOT_NOTICE),
        reason=f"spot interruption warning for attempt {attempt.attempt}",
    )


def forget_preference(job: Job, pool: Pool, now: datetime) -> None:
    """A refused launch in the job's preferred pool: tried once, from now on the pool's blocks apply to the
    job too, or Place and Launch would go round the refused pool without a pause (Launch -> Place has no
    Wait)."""
    if job.preferred_pool == pool:
        job.preferred_pool = None
        job.updated_at = now


def count_attempt(job: Job, number: int, now: datetime, *, running: bool = False) -> None:
    """Attempt `number` launched: the job counts it, no longer prefers a pool and no longer waits.
    `running`: its instance already runs (an adopted standby, whose `running` event came before it had the
    job), so the job is RUNNING now rather than when that event arrives."""
    if job.attempts < number:
        job.attempts = number
        job.preferred_pool = None
        job.waiting_since = None  # launched: the job no longer waits
        job.waiting_reason = None  # (a throttled try's note)
        job.updated_at = now
    if running and job.attempts == number and job.state is JobState.LAUNCHING:
        job.state = ensure_transition(job.state, JobState.RUNNING)
        job.updated_at = now


# ------------------------------------------------------------------------------------------- Recover


@dataclass(frozen=True)
class Recovery:
    """Recover's answer: the step's result, and the pools to block (for every job)."""

    result: StepResult
    blocks: tuple[BlockedPool, ...] = ()


def plan_recovery(job: Job, ended: Sequence[Attempt], event: AttemptEnded, now: datetime) -> Recovery:
    """What Recover makes of the attempt `event` ended, for the job (changed as Recover writes it; its cost
    and lost work already derived from `ended`, all its attempts with that one closed): the recovery
    strategy's relaunch (the pools it blocks, the pool it prefers, the interruption and restart it counts)
    or its failure. A retried invocation gets the answer recorded the first time."""
    if job.last_recovered_attempt >= event.attempt and job.last_recovery is not None:
        return Recovery(StepResult.model_validate(job.last_recovery))
    action = decide_recovery(job, ended, event)
    blocks: tuple[BlockedPool, ...] = ()
    if isinstance(action, Fail):
        result = StepResult(action="fail", error=action.error, cause=one_line(action.reason))
        job.interruptions += int(event.kind.is_interruption)  # the one that ended it happened too
    else:
        job.interruptions += int(action.counts_interruption)
        job.restarts += int(action.counts_restart)
        job.preferred_pool = action.prefer
        if job.state in {JobState.LAUNCHING, JobState.RUNNING}:
            job.state = ensure_transition(job.state, JobState.RECOVERING)
        result = StepResult(action="relaunch", cause=one_line(action.reason))
        blocks = tuple(action.block)
    job.last_recovered_attempt = event.attempt
    job.last_recovery = result.payload()
    job.updated_at = now
    return Recovery(result, blocks)


def one_line(text: str) -> str:
    """`text` as one printable line of at most MAX_FAILURE_REASON_CHARS (whitespace runs become one space)."""
    return printable(" ".join(text.split()), MAX_FAILURE_REASON_CHARS)


# ------------------------------------------------------------------------------------------ Reconcile


def standby_pools(decision: Placement, zones: Collection[str]) -> list[PlannedPool]:
    """Where a job on on-demand that the market choice sends back to spot (`decision`: `rank_pools` with
    `current_market=on-demand`) launches its standby: the first STANDBY_POOLS_TRIED ranked spot pools in a
    zone with a subnet, tried in order until one launches; none when the market choice keeps it on
    on-demand."""
    if decision.market.action is not MarketAction.SPOT:
        return []
    spot = [r for r in decision.ranked if r.pool.market is Market.SPOT and r.pool.availability_zone in zones]
    return [
        PlannedPool(pool=r.pool, hourly_price=r.hourly_price, relative_speed=r.relative_speed)
        for r in spot[:STANDBY_POOLS_TRIED]
    ]
