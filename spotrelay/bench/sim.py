"""A discrete-event replay of one job under one policy on a `SpotMarket`.

Time is market time in hours (`SpotMarket` hours since its start). A job (`BenchJob`) is submitted at
`submit_hours` and has `work_hours` of work on the reference GPU (V100), a deadline `deadline_hours`
after submission, a restart overhead `d`, its GPU needs and price cap (its `JobSpec`), and the zones and
instance types it may use. The replay jumps from event to event, never by fixed ticks:

- a **decision point**: the job starts; a spot instance was lost; the job is idle and a price or the
  capacity of one of its pools changes (`SpotMarket` change points); or a time the policy asked to be
  woken at (`Decision.recheck_at`: when its rule would change its answer without any market change,
  e.g. a deadline safety net) — and, while running, market changes only if the policy asks
  (`Decision.watch_market`);
- a **preemption**: a spot instance started at `s` is lost at `interruption_time(pool, s, max_price)`;
- **completion**: the work is done.

Accounting, per attempt (one instance from its start to its end):
- every (re)start pays the restart overhead `d` (billed, no progress): boot, image pull, restore;
- progress = wall hours after the overhead x the relative speed of the instance type's GPU;
- cost = the price over the billed hours: the spot price as it changes (integrated over the price
  timeline), or the on-demand price;
- a preemption loses nothing when the job checkpoints at the interruption notice (AWS gives two
  minutes; the traces have no notices, so we assume the final checkpoint succeeds — the restart
  overhead is still paid). A job that checkpoints only periodically (`checkpoint_on_notice: false`)
  loses the progress since its last periodic checkpoint (`checkpoint.interval_minutes` of its spec);
  lost GPU-hours = those wall hours x the instance's GPU count.

A policy that gives up on a job (the control plane fails it: too many interruptions, no capacity for
`max_wait_hours`), or leaves it idle 24 h past its deadline (`RESCUE_AFTER_HOURS`), or idle with
nothing left that could change, has the job *rescued*: finished on the cheapest on-demand pool from
there (the user resubmits it without a deadline). Its cost counts and its deadline is missed, so
giving up never looks cheap.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from spotrelay.catalog import INSTANCE_TYPES, relative_speed
from spotrelay.market import PoolTimeline, SpotMarket
from spotrelay.models import JobSpec, Market, Pool
from spotrelay.models.billing import step_integral

# An idle job this long past its deadline is rescued on on-demand (the spec's default patience,
# `limits.max_wait_hours`).
RESCUE_AFTER_HOURS = 24.0
# Wake a little after a threshold so that a rule comparing with `<` sees it crossed.
WAKE_EPSILON_HOURS = 1e-6
# A runaway policy (one that never lets time advance) fails loudly instead of looping forever.
MAX_EVENTS_PER_JOB = 1_000_000


@dataclass(frozen=True, slots=True)
class BenchJob:
    """One job of a workload: its spec (GPU needs, work, deadline, cap, recovery) and where it may run."""

    name: str
    spec: JobSpec
    submit_hours: float
    restart_overhead_hours: float
    zones: tuple[str, ...]
    instance_types: tuple[str, ...]  # the types the job may use (fitting, allowed by the workload)
    on_demand_prices: Mapping[str, float]  # instance type -> on-demand USD/h
    checkpoint_on_notice: bool = True
    group: str = ""  # a label to break results down by (e.g. "D=52h d=0.05h")

    def __post_init__(self) -> None:
        if self.spec.work_hours is None or self.spec.limits.deadline_hours is None:
            raise ValueError(f"{self.name}: a bench job needs work_hours and limits.deadline_hours")
        if not self.zones or not self.instance_types:
            raise ValueError(f"{self.name}: a bench job needs at least one zone and one instance type")

    @property
    def work_hours(self) -> float:
        assert self.spec.work_hours is not None
        return self.spec.work_hours

    @property
    def deadline_hours(self) -> float:
        assert self.spec.limits.deadline_hours is not None
        return self.spec.limits.deadline_hours

    @property
    def deadline_at(self) -> float:
        return self.submit_hours + self.deadline_hours

    @property
    def max_price(self) -> float | None:
        return self.spec.limits.max_price_per_hour


@dataclass(frozen=True, slots=True)
class PoolView:
    """A spot pool a job may use, with what the replay asks of it."""

    pool: Pool
    timeline: PoolTimeline
    speed: float
    gpu_count: int
    price_times: tuple[float, ...]
    prices: tuple[float | None, ...]


@dataclass(frozen=True, slots=True)
class OnDemandChoice:
    pool: Pool
    price: float
    speed: float


class MarketView:
    """A workload's market with per-(types, zones) caches: the pools a job may use and their merged
    change points. Shared by every job of the workload (read-only after the caches fill)."""

    def __init__(self, market: SpotMarket, advisor_bands: Mapping[str, int] | None = None) -> None:
        self.market = market
        self.advisor_bands: Mapping[str, int] = advisor_bands or {}
        self._pools: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[PoolView, ...], tuple[float, ...]]] = {}
        self._views: dict[Pool, PoolView] = {}

    def view(self, pool: Pool) -> PoolView:
        found = self._views.get(pool)
        if found is None:
            timeline = self.market.timeline(pool)
            itype = INSTANCE_TYPES[pool.instance_type]
            changes = timeline.price_timeline.changes()
            times = tuple(t for t, _ in changes)
            prices: tuple[float | None, ...] = tuple(p for _, p in changes)
            if not times or times[0] != -math.inf:
                times, prices = (-math.inf, *times), (None, *prices)
            found = PoolView(pool, timeline, relative_speed(itype), itype.gpu_count, times, prices)
            self._views[pool] = found
        return found

    def pools_for(self, types: Sequence[str], zones: Sequence[str]) -> tuple[tuple[PoolView, ...], tuple[float, ...]]:
        key = (tuple(sorted(types)), tuple(sorted(zones)))
        found = self._pools.get(key)
        if found is None:
            wanted_types, wanted_zones = set(types), set(zones)
            views = tuple(
                self.view(p)
                for p in self.market.pools()
                if p.instance_type in wanted_types and p.availability_zone in wanted_zones
            )
            changes = tuple(sorted({t for v in views for t in v.timeline.change_times()}))
            found = (views, changes)
            self._pools[key] = found
        return found


class JobContext:
    """What a policy may ask about its job and the market, at any time."""

    def __init__(self, job: BenchJob, view: MarketView) -> None:
        self.job = job
        self.view = view
        self.market = view.market
        self.advisor_bands = view.advisor_bands
        self.spot_pools, self._changes = view.pools_for(job.instance_types, job.zones)
        self._by_pool = {v.pool: v for v in self.spot_pools}
        cap = job.max_price
        best: OnDemandChoice | None = None
        for name in sorted(job.instance_types):
            price = job.on_demand_prices.get(name)
            if price is None or (cap is not None and price > cap):
                continue
            speed = relative_speed(INSTANCE_TYPES[name])
            if best is None or price / speed < best.price / best.speed:
                zone = sorted(job.zones)[0]
                best = OnDemandChoice(
                    Pool(instance_type=name, availability_zone=zone, market=Market.ON_DEMAND), price, speed
                )
        self.on_demand = best  # None: no on-demand type within the cap

    def pool_view(self, pool: Pool) -> PoolView:
        return self._by_pool[pool]

    def can_launch(self, pool: Pool, t: float) -> bool:
        """A launch in `pool` at `t` succeeds: on-demand when its price is within the job's cap; spot when
        the pool has capacity, not being taken back (`PoolTimeline.launchable`: as the local EC2 answers), and
        its price is not above the cap. (The rescue alone may break the cap.)"""
        if pool.market is Market.ON_DEMAND:
            price = self.job.on_demand_prices.get(pool.instance_type)
            cap = self.job.max_price
            return price is not None and (cap is None or price <= cap)
        found = self._by_pool.get(pool)
        return found is not None and found.timeline.launchable(t, self.job.max_price)

    def spot_choices(self, t: float) -> list[PoolView]:
        """The spot pools a launch at `t` would get, cheapest per unit of work first (then by price and
        pool order: instance type, zone)."""
        cap = self.job.max_price
        choices = [v for v in self.spot_pools if v.timeline.launchable(t, cap)]
        choices.sort(
            key=lambda v: (_price(v, t) / v.speed, _price(v, t), v.pool.instance_type, v.pool.availability_zone)
        )
        return choices

    def spot_choices_cheaper_than_on_demand(self, t: float) -> list[PoolView]:
        """`spot_choices(t)` less the pools that cost as much per unit of work as the cheapest on-demand
        type or more (a 1-GPU job offered an 8-GPU spot instance): what a policy that can run on-demand
        would ever take."""
        choices = self.spot_choices(t)
        od = self.on_demand
        if od is None:
            return choices
        return [v for v in choices if _price(v, t) / v.speed < od.price / od.speed]

    def spot_price(self, pool: Pool, t: float) -> float:
        return _price(self._by_pool[pool], t)

    def on_demand_run_hours(self, remaining_work_hours: float) -> float | None:
        return None if self.on_demand is None else remaining_work_hours / self.on_demand.speed

    def next_change(self, t: float) -> float | None:
        """The first time after `t` when a price or the capacity of one of the job's spot pools changes."""
        i = bisect_right(self._changes, t)
        return self._changes[i] if i < len(self._changes) else None

    def change_times(self, from_t: float, to_t: float) -> tuple[float, ...]:
        """The job's pools' change points in (from_t, to_t)."""
        return self._changes[bisect_right(self._changes, from_t) : bisect_left(self._changes, to_t)]

    def speed_of(self, pool: Pool) -> float:
        return relative_speed(INSTANCE_TYPES[pool.instance_type])

    def price_integral(self, pool: Pool, start: float, end: float) -> float:
        """USD for one instance of `pool` over [start, end]."""
        if end <= start:
            return 0.0
        if pool.market is Market.ON_DEMAND:
            return self.job.on_demand_prices[pool.instance_type] * (end - start)
        v = self._by_pool[pool]
        return step_integral(v.price_times, v.prices, start, end)  # the control plane's integration too


def _price(v: PoolView, t: float) -> float:
    price = v.prices[bisect_right(v.price_times, t) - 1]
    return math.inf if price is None else price


@dataclass(slots=True)
class JobStatus:
    """Where the job stands at a decision point (the replay owns it; policies read it)."""

    job: BenchJob
    t: float
    work_done: float = 0.0
    running: Pool | None = None
    run_started_at: float | None = None  # the current attempt's start (its overhead included)
    attempts: int = 0
    interruptions: int = 0
    cost: float = 0.0

    @property
    def elapsed(self) -> float:
        return self.t - self.job.submit_hours

    @property
    def remaining(self) -> float:
        return max(0.0, self.job.work_hours - self.work_done)

    @property
    def time_left(self) -> float:
        return self.job.deadline_at - self.t


@dataclass(frozen=True, slots=True)
class Decision:
    """Run on `pool` (keep running if it is the current one), or stay idle (`pool` None; a running
    instance is stopped, its work checkpointed). `recheck_at`: wake me then even if nothing changes;
    `watch_market`: while running, wake me at market changes too (idle jobs are woken at them unless
    `market_blind`: a job in a timed wait that nothing wakes early). `give_up`: the policy abandons the
    job (the replay rescues it, see the module docstring)."""

    pool: Pool | None
    recheck_at: float | None = None
    watch_market: bool = False
    give_up: str | None = None
    market_blind: bool = False


class JobPolicy(Protocol):
    """One policy's state for one job."""

    def decide(self, status: JobStatus) -> Decision: ...

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None: ...


PolicyFactory = Callable[[JobContext], JobPolicy]


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of one job's timeline: `kind` is "overhead" (billed, no progress) or "run"."""

    start: float
    end: float
    pool: Pool
    kind: str


@dataclass(frozen=True, slots=True)
class JobResult:
    job: str
    group: str
    cost: float
    completion_hours: float  # from submission to the end of the work
    deadline_met: bool
    interruptions: int
    lost_gpu_hours: float
    rescued: str | None  # why the job was rescued on on-demand, if it was
    spot_hours: float
    on_demand_hours: float
    segments: tuple[Segment, ...] = ()


@dataclass(slots=True)
class _Attempt:
    pool: Pool
    start: float
    progress_from: float  # start + restart overhead
    speed: float
    interrupt_at: float | None  # None: never (on-demand, or a pool nothing happens to)
    rescue: bool = False


@dataclass(slots=True)
class _Replay:
    ctx: JobContext
    status: JobStatus
    keep_timeline: bool
    lost_gpu_hours: float = 0.0
    spot_hours: float = 0.0
    on_demand_hours: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    rescued: str | None = None

    def start(self, pool: Pool, t: float, *, rescue: bool = False) -> _Attempt:
        ctx, st = self.ctx, self.status
        if not rescue and not ctx.can_launch(pool, t):
            raise RuntimeError(f"{ctx.job.name}: the policy launched in {pool} at {t:.4f} h, where no launch succeeds")
        d = ctx.job.restart_overhead_hours
        interrupt_at = None
        if pool.market is Market.SPOT:
            interrupt_at = ctx.pool_view(pool).timeline.interruption_time(t, ctx.job.max_price)
        st.running, st.run_started_at = pool, t
        st.attempts += 1
        return _Attempt(pool, t, t + d, ctx.speed_of(pool), interrupt_at, rescue)

    def close(self, run: _Attempt, t: float) -> None:
        ctx, st = self.ctx, self.status
        st.cost += ctx.price_integral(run.pool, run.start, t)
        if run.pool.market is Market.SPOT:
            self.spot_hours += t - run.start
        else:
            self.on_demand_hours += t - run.start
        if self.keep_timeline:
            overhead_end = min(run.progress_from, t)
            self.segments.append(Segment(run.start, overhead_end, run.pool, "overhead"))
            if t > run.progress_from:
                self.segments.append(Segment(run.progress_from, t, run.pool, "run"))
        st.running, st.run_started_at = None, None

    def advance(self, run: _Attempt | None, t: float) -> None:
        st = self.status
        if run is not None:
            begin = max(run.progress_from, st.t)
            if t > begin:
                st.work_done = min(st.job.work_hours, st.work_done + (t - begin) * run.speed)
        st.t = t

    def finish_time(self, run: _Attempt) -> float:
        st = self.status
        return max(run.progress_from, st.t) + st.remaining / run.speed

    def lose_uncheckpointed_work(self, run: _Attempt, t: float) -> None:
        ctx, st = self.ctx, self.status
        if ctx.job.checkpoint_on_notice:
            return
        interval = ctx.job.spec.checkpoint.interval_minutes / 60
        ran = max(0.0, t - run.progress_from)
        lost_wall = ran - math.floor(ran / interval + 1e-12) * interval
        if lost_wall > 0:
            st.work_done = max(0.0, st.work_done - lost_wall * run.speed)
            self.lost_gpu_hours += lost_wall * INSTANCE_TYPES[run.pool.instance_type].gpu_count


def simulate(ctx: JobContext, policy: PolicyFactory, *, keep_timeline: bool = False) -> JobResult:
    """Replay `ctx.job` under `policy` on `ctx.market` (see the module docstring)."""
    job = ctx.job
    agent = policy(ctx)
    st = JobStatus(job=job, t=job.submit_hours)
    replay = _Replay(ctx, st, keep_timeline)
    run: _Attempt | None = None
    decision = Decision(pool=None)
    rescue_at = job.deadline_at + RESCUE_AFTER_HOURS
    need_decision = True
    for _ in range(MAX_EVENTS_PER_JOB):
        if need_decision and run is not None and run.rescue:
            need_decision = False
        if need_decision:
            need_decision = False
            decision = agent.decide(st)
            if decision.give_up is not None:
                replay.rescued = decision.give_up
                if run is not None:
                    replay.close(run, st.t)
                run = _rescue(replay)
                if run is None:
                    break
            elif run is None or decision.pool != run.pool:
                if run is not None:
                    replay.close(run, st.t)  # a voluntary stop checkpoints first: nothing is lost
                    run = None
                if decision.pool is not None:
                    run = replay.start(decision.pool, st.t)
        # The next event.
        finish = interrupt = None
        candidates: list[float] = []
        if run is not None:
            finish = replay.finish_time(run)
            candidates.append(finish)
            if run.interrupt_at is not None:
                interrupt = run.interrupt_at
                candidates.append(interrupt)
        if decision.recheck_at is not None and decision.recheck_at > st.t:
            candidates.append(decision.recheck_at)
        if (run is None and not decision.market_blind) or (
            run is not None and decision.watch_market and not run.rescue
        ):
            change = ctx.next_change(st.t)
            if change is not None:
                candidates.append(change)
        if run is None:
            candidates.append(max(rescue_at, st.t))
        if run is None and (not candidates or min(candidates) >= rescue_at):
            # Idle until the rescue time (or forever): rescue now, or at the rescue time.
            if candidates and rescue_at > st.t:
                replay.advance(None, rescue_at)
            replay.rescued = replay.rescued or "idle 24 h past the deadline"
            run = _rescue(replay)
            if run is None:
                break
            continue
        next_t = min(candidates)
        replay.advance(run, next_t)
        if run is not None and finish is not None and next_t >= finish and (interrupt is None or interrupt >= finish):
            st.work_done = job.work_hours
            replay.close(run, next_t)
            return _result(replay, next_t)
        if run is not None and interrupt is not None and next_t >= interrupt:
            pool, ran = run.pool, next_t - run.start
            replay.lose_uncheckpointed_work(run, next_t)
            replay.close(run, next_t)
            run = None
            st.interruptions += 1
            agent.on_preempted(st, pool, ran)
        need_decision = True
    else:
        raise RuntimeError(f"{job.name}: more than {MAX_EVENTS_PER_JOB} events; a policy never lets time advance")
    # No on-demand type at all: the job never finishes.
    return JobResult(
        job=job.name,
        group=job.group,
        cost=st.cost,
        completion_hours=math.inf,
        deadline_met=False,
        interruptions=st.interruptions,
        lost_gpu_hours=replay.lost_gpu_hours,
        rescued=replay.rescued,
        spot_hours=replay.spot_hours,
        on_demand_hours=replay.on_demand_hours,
        segments=tuple(replay.segments),
    )


def _rescue(replay: _Replay) -> _Attempt | None:
    """Finish the job on the cheapest on-demand pool from now (ignoring the price cap if it has to)."""
    ctx = replay.ctx
    choice = ctx.on_demand
    if choice is None:
        job = ctx.job
        priced = [
            (p / ctx.speed_of(Pool(instance_type=n, availability_zone=job.zones[0])), n)
            for n, p in job.on_demand_prices.items()
        ]
        if not priced:
            return None
        _, name = min(priced)
        pool = Pool(instance_type=name, availability_zone=sorted(job.zones)[0], market=Market.ON_DEMAND)
    else:
        pool = choice.pool
    return replay.start(pool, replay.status.t, rescue=True)


def _result(replay: _Replay, end: float) -> JobResult:
    st, job = replay.status, replay.ctx.job
    completion = end - job.submit_hours
    return JobResult(
        job=job.name,
        group=job.group,
        cost=st.cost,
        completion_hours=completion,
        # A rescued job missed its deadline however soon it ends: the job failed, and its user resubmitted
        # it without one (the module docstring); otherwise giving up early could look like meeting it.
        deadline_met=replay.rescued is None and completion <= job.deadline_hours + 1e-9,
        interruptions=st.interruptions,
        lost_gpu_hours=replay.lost_gpu_hours,
        rescued=replay.rescued,
        spot_hours=replay.spot_hours,
        on_demand_hours=replay.on_demand_hours,
        segments=tuple(replay.segments),
    )
