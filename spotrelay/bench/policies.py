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
- `spotrelay`: the control plane's own decisions (spotrelay.control.decisions, which the Place, Launch and
  Recover Lambdas and reconcile call), run on the simulated market in the state machine's order (the class
  docstring): Place ranks the pools (`place()` with the job's spec, the remaining work, the elapsed time,
  the blocked pools, an `InterruptionModel` sharpened by the interruptions observed during the run and the
  Advisor bands if given) and plans a launch, waits (Place's backoff, `place_wait_seconds`, not woken by
  capacity returning) or gives up once the job's patience is spent; Launch tries the plan's pools in order (a
  refused pool is blocked for `REFUSED_POOL_BLOCK_MINUTES`; all refused: Place again); Recover asks the
  job's recovery strategy (block the pool, prefer it, or fail the job) from the `Job` record the steps keep
  (its last placement tells it whether there is another spot pool to move to). A job running on on-demand is
  re-placed with `current_market=on-demand` and its interrupted spot runs whenever reconcile runs (every
  `SCHEDULE_MINUTES`), and moved back to spot when the market choice says so (rule 3, with spotrelay's
  refinement: `spotrelay.policy.market_choice`) and one of its standby pools has capacity (production
  launches the spot instance first: a refused launch leaves the job on on-demand). Place uses rule 1
  (`migrates`): an idle job behind schedule with no spot catches up on on-demand once it is behind by more
  than rule 1's band (and, wherever it is, once it has waited its `max_wait_hours`). The restart overhead
  `place()` assumes is the spec's (`placement.restart_overhead_minutes`), which the workloads set to the
  job's real d; a periodic-only job's spec gives no grace to save at the notice, so `place()`'s net keeps its
  checkpoint interval too.
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
from datetime import datetime

from spotrelay.bench.sim import WAKE_EPSILON_HOURS, Decision, JobContext, JobPolicy, JobStatus
from spotrelay.config import INTERRUPTION_BLOCK_MINUTES, SCHEDULE_MINUTES
from spotrelay.control.decisions import (
    SPOT_NOTICE,
    MarketSeen,
    count_attempt,
    forget_preference,
    launch_order,
    moves_back_considered,
    patience_spent,
    plan_place,
    plan_recovery,
    plan_standby,
    rank_pools,
    reclaim_ends,
    refusal_block,
    standby_pools,
    warning_block,
)
from spotrelay.models import Attempt, AttemptOutcome, Job, Market, PlannedPool, Pool
from spotrelay.policy import (
    AttemptEnded,
    BlockedPool,
    EndKind,
    InterruptionModel,
    MarketAction,
    PoolObservation,
    market_choice,
    placement,
)

# A runaway Place -> Launch loop (every round blocks the pools it refused, so it ends) fails loudly
MAX_PLACE_ROUNDS = 1_000
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
    """The control plane's decisions (spotrelay.control.decisions, the functions the Place, Launch and
    Recover steps and reconcile call) on the simulated market, in the order the state machine runs them:
    Place (`rank_pools`, `plan_place`), then Launch (`launch_order`; a refused pool blocked by
    `refusal_block`, the preference forgotten, `count_attempt` on a launch; every pool refused: Place
    again), the Wait state for Place's wait, Recover (`plan_recovery`) on a preemption, and reconcile's move
    back to spot (`rank_pools` with `current_market=on-demand`, `standby_pools`). The job is the `Job` record
    the steps would write; what the bench leaves out of production: the instance's boot and the agent's
    handover are instantaneous (the standby that launches takes the job over at once), and the preemption's
    final checkpoint always succeeds.

    `migrate` (on, as the control plane does): reconcile runs over a job on on-demand (every
    SCHEDULE_MINUTES) and moves it back to spot when the market choice says so. Off: the what-if
    `spotrelay-no-migrate`, which also places without `migrates`.
    """

    name = "spotrelay"

    def __init__(self, ctx: JobContext, migrate: bool = True, sees_capacity: bool = False) -> None:
        self.ctx = ctx
        self.sees_capacity = sees_capacity
        bench_job = ctx.job
        self.overhead = bench_job.spec.placement.restart_overhead_hours  # what place() assumes
        self.migrate = migrate
        self.blocks: list[BlockedPool] = []
        self.observed: dict[str, tuple[int, float]] = {}
        self.attempts: list[Attempt] = []
        self._runs: dict[str, list[float]] | None = None  # spot_run_hours(self.attempts), until the next one
        self.failed: str | None = None
        self.types = set(bench_job.instance_types)
        self.zones = sorted(set(bench_job.zones))
        self.on_demand_prices = dict(bench_job.on_demand_prices)
        submitted = self._now(bench_job.submit_hours)
        self.job = Job(job_id=bench_job.name, spec=bench_job.spec, submitted_at=submitted, updated_at=submitted)

    def _now(self, t: float) -> datetime:
        return self.ctx.market.to_datetime(t)

    def _market(self, t: float, now: datetime) -> MarketSeen:
        self.blocks = [b for b in self.blocks if b.until > now]  # lapsed ones change nothing (active_blocks)
        zones = set(self.zones)
        quotes = [
            q
            for q in self.ctx.market.quotes(t)
            if q.pool.instance_type in self.types
            and q.pool.availability_zone in zones
            and (not self.sees_capacity or self.ctx.can_launch(q.pool, t))
        ]
        interruptions = InterruptionModel(
            bands=self.ctx.advisor_bands,
            observed={k: PoolObservation(interruptions=n, instance_hours=h) for k, (n, h) in self.observed.items()},
        )
        return MarketSeen(
            quotes=quotes,
            zones=self.zones,
            on_demand_prices=self.on_demand_prices,
            blocks=self.blocks,
            interruptions=interruptions,
        )

    def decide(self, status: JobStatus) -> Decision:
        if self.failed is not None:
            return Decision(pool=None, give_up=self.failed)
        on_demand = status.running is not None and status.running.market is Market.ON_DEMAND
        if status.running is not None and not (self.migrate and on_demand):
            return Decision(pool=status.running)  # the control plane never re-places a running job
        t, job = status.t, self.job
        now = self._now(t)
        job.cost_usd = status.cost  # what its attempts have cost (Recover derives it from their bills)
        job.work_done_hours = max(job.work_done_hours, status.work_done)  # its last checkpoint
        if on_demand:
            return self._reconcile(status, now)
        for _ in range(MAX_PLACE_ROUNDS):  # Place -> Launch (every pool refused) -> Place, until one launches
            ranking = rank_pools(
                job,
                status.work_done,
                self._market(t, now),
                now,
                migrates=self.migrate,  # with migration, rule 1 (catch up on on-demand)
                out_of_patience=patience_spent(job.waiting_since, job.spec.limits.max_wait_hours, now),
                reclaiming=self._reclaiming(now),
            )
            result = plan_place(job, ranking, status.work_done, now)
            if result.action == "fail":
                self.failed = f"{result.error}: {result.cause}"
                return Decision(pool=None, give_up=self.failed)
            if result.action == "wait":  # the Wait state; production does not see capacity return meanwhile
                return Decision(pool=None, recheck_at=t + result.wait_seconds / 3600, market_blind=True)
            launched = self._launch(status, now)
            if launched is None:
                continue  # InsufficientInstanceCapacity: back to Place, the refused pools blocked
            if launched.market is Market.ON_DEMAND and self.migrate:
                return self._stay_on_demand(status, launched)
            return Decision(pool=launched)
        raise AssertionError(f"{job.job_id}: Place and Launch went round {MAX_PLACE_ROUNDS} times at {t} h")

    def _reclaiming(self, now: datetime) -> Pool | None:
        """Place's `reclaim_ends` of the latest attempt: never here, since the engine preempts an instance
        when its capacity goes, at the notice's end (and Place's wait for it, `plan_reclaim_wait`, is never
        needed)."""
        latest = self.attempts[-1] if self.attempts else None
        return latest.pool if latest is not None and reclaim_ends(latest, now) is not None else None

    def _launch(self, status: JobStatus, now: datetime) -> Pool | None:
        """The Run task: the plan's pools in order until one launches (None: every one refused)."""
        job = self.job
        for planned in launch_order(job, self.blocks, self.zones, now):
            if not self.ctx.can_launch(planned.pool, status.t):
                self.blocks.append(refusal_block(planned.pool, "InsufficientInstanceCapacity", now))
                forget_preference(job, planned.pool, now)
                continue
            self._launched(status, planned, now)
            return planned.pool
        return None

    def _reconcile(self, status: JobStatus, now: datetime) -> Decision:
        """Reconcile's run over a job on on-demand: back to spot when the market choice says so and a
        standby pool launches (the standby takes the job over at once), else it stays."""
        job = self.job
        if not moves_back_considered(job, self.attempts[-1]):
            return self._stay_on_demand(status)
        ranking = rank_pools(
            job,
            status.work_done,
            self._market(status.t, now),
            now,
            current_market=Market.ON_DEMAND,
            billing_usd=self._running_cost(status),
            spot_runs=self._spot_runs(),
        )
        for planned in standby_pools(ranking, self.zones):
            if not self.ctx.can_launch(planned.pool, status.t):
                self.blocks.append(refusal_block(planned.pool, "InsufficientInstanceCapacity", now))
                continue
            return self._hand_over(status, planned, now)
        return self._stay_on_demand(status)

    def _hand_over(self, status: JobStatus, planned: PlannedPool, now: datetime) -> Decision:
        """The standby runs and the on-demand agent hands the job over (at once here): the on-demand attempt
        ends MIGRATED, Recover decides (`plan_recovery`: nothing blocked, nothing counted, unless the job's
        limits end it), Place plans the standby (`plan_standby`) and Launch adopts it (`count_attempt`)."""
        job, current = self.job, self.attempts[-1]
        self.attempts[-1] = current.model_copy(update={"outcome": AttemptOutcome.MIGRATED, "ended_at": now})
        job.cost_usd = status.cost + self._running_cost(status)
        event = AttemptEnded(kind=EndKind.MIGRATED, pool=current.pool, at=now, attempt=current.attempt)
        recovery = plan_recovery(job, self.attempts, event, now)
        if recovery.result.action == "fail":
            self.failed = f"{recovery.result.error}: {recovery.result.cause}"
            return Decision(pool=None, give_up=self.failed)
        self.blocks.extend(recovery.blocks)
        standby = self._attempt(status, planned, now)
        plan_standby(job, standby, status.work_done, now)
        count_attempt(job, standby.attempt, now, running=True)
        return Decision(pool=planned.pool)

    def _running_cost(self, status: JobStatus) -> float:
        """What the running instance has cost so far (reconcile's `attempt.cost(now)`)."""
        if status.running is None or status.run_started_at is None:
            return 0.0
        return self.ctx.price_integral(status.running, status.run_started_at, status.t)

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

    def _launched(self, status: JobStatus, planned: PlannedPool, now: datetime) -> None:
        """An instance launched in `planned`'s pool: a new attempt, counted on the job, which runs (its
        `running` event, at once)."""
        attempt = self._attempt(status, planned, now)
        count_attempt(self.job, attempt.attempt, now, running=True)

    def _attempt(self, status: JobStatus, planned: PlannedPool, now: datetime) -> Attempt:
        """A new attempt in `planned`'s pool, launched and running now."""
        assert not self.attempts or self.attempts[-1].outcome is not None, "an attempt is still open"
        attempt = Attempt(
            job_id=self.job.job_id,
            attempt=len(self.attempts) + 1,
            pool=planned.pool,
            hourly_price=planned.hourly_price,
            started_at=now,
            running_at=now,
            relative_speed=planned.relative_speed,
            work_done_hours_at_start=status.work_done,
        )
        self.attempts.append(attempt)
        return attempt

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        """Recover: close the attempt, record the pool's interruption, and let `plan_recovery` (the job's
        recovery strategy) decide: relaunch (the pools it blocks, the one it prefers) or fail."""
        now = self._now(status.t)
        seen = self.observed.get(pool.offering, (0, 0.0))
        self.observed[pool.offering] = (seen[0] + 1, seen[1] + ran_hours)
        current = self.attempts[-1]
        # the interruption warning, two minutes before (ec2_events), blocks the pool for every job
        self.blocks.append(warning_block(current, now - SPOT_NOTICE, INTERRUPTION_BLOCK_MINUTES))
        warned = {"interrupted_at": now - SPOT_NOTICE}  # the warning, when EC2 gave it
        self.attempts[-1] = current.model_copy(
            update={"outcome": AttemptOutcome.INTERRUPTED, "ended_at": now, **warned}
        )
        self._runs = None
        job = self.job
        job.cost_usd = status.cost
        job.work_done_hours = max(job.work_done_hours, status.work_done)
        event = AttemptEnded(kind=EndKind.SPOT_INTERRUPTED, pool=pool, at=now, attempt=current.attempt)
        recovery = plan_recovery(job, self.attempts, event, now)
        if recovery.result.action == "fail":
            self.failed = f"{recovery.result.error}: {recovery.result.cause}"
        self.blocks.extend(recovery.blocks)


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
