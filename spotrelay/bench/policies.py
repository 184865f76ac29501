"""The policies the benchmark compares, each a small class with one interface (`JobPolicy`): at each
decision point, run on a pool (spot or on-demand) or wait.

- `on-demand`: the cheapest on-demand pool that fits (price per unit of work), run to completion.
- `greedy`: spot whenever a pool is available (the cheapest; a pool that costs as much per unit of work
  as the cheapest on-demand type or more does not count, for this policy and the next), wait otherwise,
  until the slack runs out (time left < remaining on-demand run + d), then on-demand for good. A spot
  (re)start is made only while it leaves that slack after its own overhead (time left >= on-demand run +
  2d); below that the job waits for the slack to run out. Waiting costs nothing and the on-demand run is
  as long either way, so this changes completion times only, never the cost; without it a preemption
  just after a restart would miss the deadline.
- `uniform-progress`: Uniform Progress from "Can't Be Late" (Wu et al., NSDI'24): the rules are
  `spotrelay.policy.uniform_progress`, called here with the job's restart overhead; the spot pool is
  the cheapest available one among the job's zones (one zone in the paper's single-zone setting).
  Like the paper's policy it returns from on-demand to spot (rule 3, hysteresis): while on on-demand
  it is woken at every market change and when its progress crosses the hysteresis line.
- `skypilot-eager`: SkyPilot's EAGER_NEXT_REGION recovery at zone granularity: the cheapest available spot
  pool, however dear (it has no on-demand to compare with); on a preemption the lost zone is blocked and
  the next cheapest taken; if only the blocked zone has capacity it is retried; when no spot pool is
  available it waits and retries on spot (as SkyPilot's managed spot jobs do). No deadline awareness, no
  on-demand.
- `spotrelay`: what the control plane does (spotrelay.control.lifecycle): `place()` with the job spec, the
  remaining work, the elapsed time, the blocked pools (`decide_recovery` + `active_blocks`, the preferred
  pool of same-pool-first exempt), an `InterruptionModel` sharpened by the interruptions observed during
  the run (and the Advisor bands, if given), the market choice inside `place()`; then the launch: the
  first ranked pool that takes it (a refused pool is blocked for `REFUSED_POOL_BLOCK_MINUTES` and the next
  is tried; all refused: place again; nothing to launch in: the Wait state for Place's backoff,
  `place_wait_seconds`, not woken by capacity returning). A job running on on-demand is re-placed with
  `current_market=on-demand` and its interrupted spot runs (`spot_runs`) whenever reconcile runs (every
  `SCHEDULE_MINUTES`), and moved back to spot when the market choice says so (rule 3, with spotrelay's
  refinement: `spotrelay.policy.market_choice`) and the spot pool has capacity (production launches the
  spot instance first: a refused launch leaves the job on on-demand). Place uses rule 1
  (`place(migrates=True)`): an idle job behind schedule with no spot catches up on on-demand once it is
  behind by more than rule 1's band (and, wherever it is, once it has waited its `max_wait_hours`). The restart
  overhead `place()` assumes is the spec's (`placement.restart_overhead_minutes`), which the workloads set
  to the job's real d; a periodic-only job's spec gives no grace to save at the notice, so `place()`'s net
  keeps its checkpoint interval too. On a preemption, the job's recovery strategy decides (block the pool,
  prefer it, or fail the job), seeing the job's last placement as the control plane records it
  (`Job.placement`), which tells it whether there is another spot pool to move to.
- `spotrelay-no-migrate` (a what-if: the control plane without reconcile's move of jobs back to spot): as
  `spotrelay`, but a job on on-demand stays there, and `place()` without `migrates`: an idle job behind
  schedule with no spot waits for spot until the safety net.
- `spotrelay-sees-capacity` (a what-if no deployment can run): as `spotrelay`, but only spot pools with
  capacity now are offered to `place()`, as the other policies are told (with spotrelay's timing still);
  what finding capacity out by launching costs.

`omniscient` is not an online policy: see `spotrelay.bench.omniscient`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta

from spotrelay.bench.sim import WAKE_EPSILON_HOURS, Decision, JobContext, JobPolicy, JobStatus
from spotrelay.config import SCHEDULE_MINUTES
from spotrelay.control.lifecycle import PLAN_DEPTH, REFUSED_POOL_BLOCK_MINUTES, place_wait_seconds
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, PlannedPool, Pool
from spotrelay.policy import (
    AttemptEnded,
    BlockedPool,
    EndKind,
    Fail,
    InterruptionModel,
    MarketAction,
    MarketDecision,
    PoolObservation,
    market_choice,
    placement,
    recovery,
)

# Sums of hours carry floating-point rounding; far below WAKE_EPSILON_HOURS.
THRESHOLD_ROUNDING_HOURS = 1e-9
# Why the on-demand policy gives a job up at once (the replay rescues it on on-demand above the cap)
NO_ON_DEMAND_WITHIN_CAP = "no on-demand type within the price cap"


def _first(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def uniform_progress_wake(ctx: JobContext, st: JobStatus, restart_overhead_hours: float) -> float | None:
    """When, with nothing changing on the market, Uniform Progress's answer for an idle job can change:
    the safety net (time left < on-demand run + 2d) or the uniform line (progress < W t / D)."""
    job = ctx.job
    od_run = ctx.on_demand_run_hours(st.remaining)
    margin = market_choice.safety_net_margin_hours(restart_overhead_hours)
    net = None if od_run is None else job.deadline_at - od_run - margin
    line = job.submit_hours + st.work_done * job.deadline_hours / job.work_hours
    # A threshold at or before now (progress exactly on the line) flips as soon as time moves on. One a
    # rounding error before now counts too: the rule's own comparison (time left < run + 2d, summed in another
    # order) may not have flipped yet, and an idle job waiting for the safety net must not sleep through it.
    return _first(
        *(
            max(t, st.t) + WAKE_EPSILON_HOURS
            for t in (net, line)
            if t is not None and t >= st.t - THRESHOLD_ROUNDING_HOURS
        )
    )


def hysteresis_crossing(ctx: JobContext, st: JobStatus, restart_overhead_hours: float) -> float | None:
    """For a job on (or about to start on) on-demand: when its progress reaches the uniform line 2d
    ahead, where Uniform Progress's hysteresis (rule 3) lets it back to spot (a hair after, so that the
    rule's own comparison has flipped; None: never, or already past)."""
    crossing = hysteresis_line_crossing(ctx, st, restart_overhead_hours)
    return crossing + WAKE_EPSILON_HOURS if crossing is not None and crossing > st.t else None


def hysteresis_line_crossing(ctx: JobContext, st: JobStatus, restart_overhead_hours: float) -> float | None:
    """`hysteresis_crossing` exactly (possibly in the past); None: progress never gains on the line."""
    job, od = ctx.job, ctx.on_demand
    if od is None:
        return None
    d, s = restart_overhead_hours, job.submit_hours
    rate, slope = od.speed, job.work_hours / job.deadline_hours
    if rate <= slope:
        return None
    if st.running is not None and st.running.market is Market.ON_DEMAND and st.run_started_at is not None:
        begin = max(st.t, st.run_started_at + job.restart_overhead_hours)  # progress since its overhead
    else:
        begin = st.t + job.restart_overhead_hours  # starting on-demand now
    # progress(t) = work_done + rate (t - begin) = slope (t - s + 2d)
    return (slope * (2 * d - s) - st.work_done + rate * begin) / (rate - slope)


class OnDemand:
    name = "on-demand"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def decide(self, status: JobStatus) -> Decision:
        if self.ctx.on_demand is None:
            return Decision(pool=None, give_up=NO_ON_DEMAND_WITHIN_CAP)
        return Decision(pool=self.ctx.on_demand.pool)

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        raise AssertionError("on-demand instances are not preempted")


class Greedy:
    name = "greedy"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.on_demand_for_good = False

    def decide(self, status: JobStatus) -> Decision:
        ctx, job, d = self.ctx, self.ctx.job, self.ctx.job.restart_overhead_hours
        if status.running is not None and status.running.market is Market.SPOT:
            return Decision(pool=status.running)  # stays until preempted
        od = ctx.on_demand
        if od is None:  # no on-demand within the cap: spot or wait
            choices = ctx.spot_choices(status.t)
            return Decision(pool=choices[0].pool if choices else None)
        od_run = status.remaining / od.speed
        # The slack runs out at time left = on-demand run + d; woken a hair before, so that floating
        # point cannot push the on-demand run past the deadline.
        if self.on_demand_for_good or status.time_left < od_run + d + 2 * WAKE_EPSILON_HOURS:
            self.on_demand_for_good = True
            return Decision(pool=od.pool)
        slack_out = job.deadline_at - od_run - d - WAKE_EPSILON_HOURS
        if status.time_left >= od_run + 2 * d:
            choices = ctx.spot_choices_cheaper_than_on_demand(status.t)
            if choices:
                return Decision(pool=choices[0].pool)
        return Decision(pool=None, recheck_at=slack_out)

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        pass


class UniformProgress:
    name = "uniform-progress"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def decide(self, status: JobStatus) -> Decision:
        ctx, job = self.ctx, self.ctx.job
        d = job.restart_overhead_hours
        choices = ctx.spot_choices_cheaper_than_on_demand(status.t)
        current = None if status.running is None else status.running.market
        decision = market_choice.uniform_progress(
            total_work_hours=job.work_hours,
            work_done_hours=status.work_done,
            deadline_hours=job.deadline_hours,
            elapsed_hours=status.elapsed,
            on_demand_run_hours=ctx.on_demand_run_hours(status.remaining),
            restart_overhead_hours=d,
            spot_available=bool(choices),
            on_demand_allowed=job.spec.limits.on_demand_fallback,
            current=current,
        )
        if decision.action is MarketAction.SPOT:
            if status.running is not None and status.running.market is Market.SPOT:
                return Decision(pool=status.running)
            return Decision(pool=choices[0].pool)
        if decision.action is MarketAction.ON_DEMAND:
            assert ctx.on_demand is not None
            return Decision(pool=ctx.on_demand.pool, watch_market=True, recheck_at=hysteresis_crossing(ctx, status, d))
        return Decision(pool=None, recheck_at=uniform_progress_wake(ctx, status, d))

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        pass


class SkypilotEager:
    name = "skypilot-eager"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.blocked_zones: set[str] = set()

    def decide(self, status: JobStatus) -> Decision:
        if status.running is not None:
            return Decision(pool=status.running)
        choices = self.ctx.spot_choices(status.t)
        preferred = [c for c in choices if c.pool.availability_zone not in self.blocked_zones]
        picked = (preferred or choices)[:1]
        if not picked:
            return Decision(pool=None)  # wait and retry at the next market change
        self.blocked_zones.clear()
        return Decision(pool=picked[0].pool)

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        self.blocked_zones.add(pool.availability_zone)


class Spotrelay:
    """The control plane's Place -> Launch -> Recover loop on the simulated market (module docstring).

    `place()` gets the restart overhead from the job spec, as the control plane calls it. `migrate` (on, as
    the control plane does): re-place a job running on on-demand whenever reconcile runs, with
    `current_market=on-demand`, and move it back to spot when the market choice says so. Off: the what-if
    `spotrelay-no-migrate`.
    """

    name = "spotrelay"

    def __init__(self, ctx: JobContext, migrate: bool = True, sees_capacity: bool = False) -> None:
        self.ctx = ctx
        self.sees_capacity = sees_capacity
        job = ctx.job
        self.overhead = job.spec.placement.restart_overhead_hours  # what place() assumes
        self.migrate = migrate
        self.blocks: list[BlockedPool] = []
        self.observed: dict[str, tuple[int, float]] = {}
        self.attempts: list[Attempt] = []
        self.interruptions = 0
        self.preferred: Pool | None = None
        self.placement: tuple[PlannedPool, ...] = ()  # the latest non-empty ranking, as Place records it
        self.waiting_since: float | None = None
        self.place_waits = 0  # Place's waits in a row (Job.place_waits)
        self._runs: dict[str, list[float]] | None = None  # spot_run_hours(self.attempts), until the next one
        self.failed: str | None = None
        self.types = set(job.instance_types)
        self.zones = sorted(set(job.zones))
        self.on_demand_prices = dict(job.on_demand_prices)

    def _now(self, t: float) -> datetime:
        return self.ctx.market.to_datetime(t)

    def decide(self, status: JobStatus) -> Decision:
        if self.failed is not None:
            return Decision(pool=None, give_up=self.failed)
        on_demand = status.running is not None and status.running.market is Market.ON_DEMAND
        if status.running is not None and not (self.migrate and on_demand):
            return Decision(pool=status.running)  # the control plane never re-places a running job
        ctx, job, t = self.ctx, self.ctx.job, status.t
        now = self._now(t)
        zones = set(self.zones)
        quotes = [
            q
            for q in ctx.market.quotes(t)
            if q.pool.instance_type in self.types
            and q.pool.availability_zone in zones
            and (not self.sees_capacity or ctx.can_launch(q.pool, t))
        ]
        interruptions = InterruptionModel(
            bands=ctx.advisor_bands,
            observed={k: PoolObservation(interruptions=n, instance_hours=h) for k, (n, h) in self.observed.items()},
        )
        for _ in range(PLAN_DEPTH + 2):  # Place -> Launch (every pool refused) -> Place again, with them blocked
            self.blocks = [b for b in self.blocks if b.until > now]  # lapsed ones change nothing (active_blocks)
            blocked = recovery.active_blocks(self.blocks, now) - {self.preferred}
            ranking = placement.place(
                job.spec,
                quotes,
                work_done_hours=status.work_done,
                elapsed_hours=status.elapsed,
                blocked=blocked,
                interruptions=interruptions,
                on_demand_prices=self.on_demand_prices,
                zones=self.zones,
                current_market=Market.ON_DEMAND if on_demand else None,
                migrates=self.migrate,  # as Place: with migration, rule 1 (catch up on on-demand)
                spot_runs=self._spot_runs() if on_demand else None,  # as reconcile
                out_of_patience=self._patience_spent(t),  # as Place
            )
            plan = list(ranking.ranked[:PLAN_DEPTH])
            if on_demand and (ranking.market.action is not MarketAction.SPOT or not plan):
                return self._stay_on_demand(status)
            if not plan:
                return self._wait(status, ranking.market)
            self.place_waits = 0
            if self.preferred is not None:
                plan.sort(key=lambda r: r.pool != self.preferred)
            self.placement = tuple(
                PlannedPool(pool=r.pool, hourly_price=r.hourly_price, relative_speed=r.relative_speed) for r in plan
            )
            for ranked in plan:
                pool = ranked.pool
                if pool in blocked:
                    continue
                if not ctx.can_launch(pool, t):
                    if pool == self.preferred:  # tried once: from now on its blocks apply (as in Launch)
                        self.preferred = None
                    self.blocks.append(
                        BlockedPool(
                            pool=pool,
                            until=now + timedelta(minutes=REFUSED_POOL_BLOCK_MINUTES),
                            reason="launch refused: InsufficientInstanceCapacity",
                        )
                    )
                    continue
                self._launched(status, pool, ranked.hourly_price, ranked.relative_speed, now)
                if pool.market is Market.ON_DEMAND and self.migrate:
                    return self._stay_on_demand(status, pool)
                return Decision(pool=pool)
        return self._stay_on_demand(status) if on_demand else self._wait(status, ranking.market)

    def _patience_spent(self, t: float) -> bool:
        """`lifecycle.patience_spent`, in the replay's hours (the same test as `_wait`'s give-up)."""
        return self.waiting_since is not None and t >= self.waiting_since + self.ctx.job.spec.limits.max_wait_hours

    def _spot_runs(self) -> dict[str, list[float]]:
        """`spot_run_hours(self.attempts)`, recomputed only after an interruption added a run."""
        if self._runs is None:
            self._runs = placement.spot_run_hours(self.attempts)
        return self._runs

    def _stay_on_demand(self, status: JobStatus, pool: Pool | None = None) -> Decision:
        """On on-demand: reconcile re-places the job when it runs (every SCHEDULE_MINUTES, on a fixed grid).
        Until a market change, the hysteresis line or a block's lapse, every run would leave it there (nothing
        it decides on changes, and a refused pool stays refused), so the replay wakes it at the first run after
        any of them."""
        t, now = status.t, self._now(status.t)
        lapses = [self.ctx.market.to_hours(b.until) for b in self.blocks if b.until > now]
        crossing = hysteresis_line_crossing(self.ctx, status, self.overhead)
        if crossing is not None and crossing < t - THRESHOLD_ROUNDING_HOURS:
            crossing = None  # passed: it is ahead, and only the market can change the answer
        # A run at the crossing, or a rounding error after it, may see the job ahead.
        ahead = None if crossing is None else crossing - THRESHOLD_ROUNDING_HOURS
        first = _first(self.ctx.next_change(t), ahead, *lapses)
        wake = None if first is None else _reconcile_run_after(max(first, t + WAKE_EPSILON_HOURS))
        return Decision(pool=pool or status.running, recheck_at=wake)

    def _wait(self, status: JobStatus, market: MarketDecision) -> Decision:
        """No pool to launch in: the Wait state for Place's backoff (`place_wait_seconds`: 1, 2, then
        every 3 min, sooner for the safety net), then Place again; NoCapacity after `max_wait_hours`.
        Nothing wakes it early: production does not see capacity return."""
        t, limits = status.t, self.ctx.job.spec.limits
        if self.waiting_since is None:
            self.waiting_since = t
        give_up_at = self.waiting_since + limits.max_wait_hours
        if t >= give_up_at:
            return Decision(pool=None, give_up=f"NoCapacity: nothing launched for {limits.max_wait_hours:g} h")
        wait = place_wait_seconds(self.place_waits, market)
        self.place_waits += 1
        return Decision(pool=None, recheck_at=min(t + wait / 3600, give_up_at), market_blind=True)

    def _launched(self, status: JobStatus, pool: Pool, price: float, speed: float, now: datetime) -> None:
        self.preferred = None
        self.waiting_since = None  # as Launch: the wait ends with a launch, not with a plan
        if self.attempts and self.attempts[-1].outcome is None:  # a migration ends the on-demand attempt
            self.attempts[-1] = self.attempts[-1].model_copy(
                update={"outcome": AttemptOutcome.CANCELLED, "ended_at": now}
            )
        self.attempts.append(
            Attempt(
                job_id=self.ctx.job.name,
                attempt=len(self.attempts) + 1,
                pool=pool,
                hourly_price=price,
                started_at=now,
                relative_speed=speed,
                work_done_hours_at_start=status.work_done,
            )
        )

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        """Recover: account the attempt, record the pool's interruption, and let the job's recovery
        strategy decide (block the pool, prefer it, or fail the job)."""
        now = self._now(status.t)
        seen = self.observed.get(pool.offering, (0, 0.0))
        self.observed[pool.offering] = (seen[0] + 1, seen[1] + ran_hours)
        current = self.attempts[-1]
        self.attempts[-1] = current.model_copy(update={"outcome": AttemptOutcome.INTERRUPTED, "ended_at": now})
        self._runs = None
        job = Job(
            job_id=self.ctx.job.name,
            spec=self.ctx.job.spec,
            state=JobState.RECOVERING,
            submitted_at=self._now(self.ctx.job.submit_hours),
            updated_at=now,
            attempts=current.attempt,
            interruptions=self.interruptions,
            cost_usd=status.cost,
            work_done_hours=status.work_done,
            placement=self.placement,
        )
        event = AttemptEnded(kind=EndKind.SPOT_INTERRUPTED, pool=pool, at=now, attempt=current.attempt)
        action = recovery.decide_recovery(job, self.attempts, event)
        if isinstance(action, Fail):
            self.failed = f"{action.error}: {action.reason}"
            return
        self.interruptions += int(action.counts_interruption)
        self.preferred = action.prefer
        self.blocks.extend(action.block)


def _reconcile_run_after(t: float) -> float:
    """The first run of reconcile's schedule (every SCHEDULE_MINUTES from the market's start) at or after `t`
    (a run a rounding error before `t` would see the market as it was before `t`: the next one)."""
    period = SCHEDULE_MINUTES / 60
    run = math.ceil(t / period) * period
    return run if run >= t else run + period


PolicyClass = Callable[[JobContext], JobPolicy]


def spotrelay_not_migrating(ctx: JobContext) -> JobPolicy:
    """`spotrelay-no-migrate`: as `spotrelay`, but a job on on-demand stays there (the control plane
    without reconcile's move of jobs back to spot)."""
    return Spotrelay(ctx, migrate=False)


def spotrelay_seeing_capacity(ctx: JobContext) -> JobPolicy:
    """`spotrelay-sees-capacity`: as `spotrelay`, but told which spot pools have capacity now, as the other
    policies are (they take `spot_choices`), instead of finding out by launching: what the information
    the others get for free is worth. No deployment can do this (EC2 does not publish capacity)."""
    return Spotrelay(ctx, sees_capacity=True)


ONLINE_POLICIES: dict[str, PolicyClass] = {
    OnDemand.name: OnDemand,
    Greedy.name: Greedy,
    UniformProgress.name: UniformProgress,
    SkypilotEager.name: SkypilotEager,
    Spotrelay.name: Spotrelay,
}
# What-if variants of `spotrelay`, run on request (`--policies ...,spotrelay-no-migrate`) and by `make bench`.
SPOTRELAY_VARIANTS: dict[str, PolicyClass] = {
    "spotrelay-no-migrate": spotrelay_not_migrating,
    "spotrelay-sees-capacity": spotrelay_seeing_capacity,
}
ALL_POLICIES: dict[str, PolicyClass] = {**ONLINE_POLICIES, **SPOTRELAY_VARIANTS}
OMNISCIENT = "omniscient"
DEFAULT_POLICIES: tuple[str, ...] = (*ONLINE_POLICIES, OMNISCIENT)
