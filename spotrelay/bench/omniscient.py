"""`omniscient`: what a schedule that knows the whole future of the market pays for a job, as a provable
lower bound on every schedule that meets the job's deadline, together with a schedule built from it that
shows how close the bound is to the true optimum.

The replay's model (spotrelay/bench/sim.py): one instance at a time; a run on an option o (a spot pool,
or an on-demand type within the job's price cap) from s to e is billed the option's price over [s, e] and
makes speed(o) x max(0, e - s - d) hours of progress (d, the restart overhead, is paid at every start); a
spot run lies inside one availability interval of its pool (capacity, and a price within the cap); the
job is done when its progress reaches W. A voluntary stop loses nothing; a preemption loses the work since
the last checkpoint of a job that checkpoints only periodically, which only lowers its progress. (Only
the replay's rescue may run on-demand above the cap, and a rescued job is late.) Nothing else is relaxed:
restarts take time, every run pays its own.

**The bound: Lagrangian relaxation of the work constraint.** Split the window [submission, deadline] at
the change points of the job's pools into segments, in each of which every price and every pool's
capacity are constant. Count a run's progress as speed x (e - s - d), negative for a run shorter than d.
For a multiplier lam >= 0, let

    G(lam) = min over schedules S in the window of  cost(S) - lam * progress(S)  (progress counted so).

Take any schedule that meets the deadline and drop its runs shorter than d (they cost and make no
progress): what is left, S, costs no more, and its progress counted so is its real progress, at least W.
So the schedule costs at least cost(S) >= G(lam) + lam * W: every lam gives a valid lower bound, and the
bound is the largest we find (the function is concave and piecewise linear; `_maximise` closes in on its
maximum with cutting planes).

G(lam) is an exact dynamic programme over the segments. Lemma: some minimiser starts and ends every run
at a segment boundary. Fix which segment each run's start and end fall in; cost - lam * progress is then
linear in those times (prices are constant within a segment, and a run contributes its billed price
integral - lam * speed * (e - s - d)), and the times range over a polytope (each within its segment, in
order, runs not overlapping). A linear function has a minimum at a vertex. There every time is pinned by
constraints that hold with equality; a chain of times equal to each other is pinned only by a segment
boundary, so every time is a boundary. A run whose start and end coincide costs lam * speed * d >= 0 and
is dropped. So each state of the programme is "idle" or "running on o" at a boundary, and a segment adds
(price - lam * speed) x its length to a run on o, and lam * speed * d once when the run starts there.

**One whole restart.** The relaxation mixes schedules, and so may spread a restart over them. Any real
schedule that does work pays at least one whole restart, at no less than the cheapest price in the
window (c_min), and its progress time is a feasible schedule of the same problem without overheads
(d = 0); by weak duality that problem's Lagrangian bound LP is below its cost, so LP + d * c_min is a
bound too, and we keep the larger.

**The schedule.** The programme's minimiser at the smallest multiplier found whose schedule makes at
least W of progress (ties broken towards more progress) is a real schedule in the window. Trimmed of its
excess (the priciest runs' ends first; a run left no longer than d dropped), it does the work by the
deadline, and its cost is an upper bound on the optimum: the true optimum lies between the bound and it.
(For a job that checkpoints only periodically, a run may end at the very instant its pool is lost: the
schedule stops it then, voluntarily, which the model allows; the replay, which sees a preemption there,
would count the loss.) On the standard workloads the two are close; on a small market whose capacity
comes and goes at the scale of d the gap can be wide (the report gives it per workload).

If no schedule can meet the deadline (no on-demand type within the cap and too little spot, or a deadline
too short for the work and a restart), the bound is on the cheapest schedule at all, the rescue's
on-demand types above the cap included, and is marked as such. Its window is extended to when that
schedule has surely finished: past the last change point the market is constant, so the runs there can
be replaced by one run on the cheapest-per-work option among them (no dearer: it keeps one restart of
theirs and the lowest price per unit of work), which lasts at most d + W / (the slowest speed); a run
crossing that point lasts at most as long again.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from spotrelay.bench.sim import JobContext
from spotrelay.catalog import INSTANCE_TYPES, relative_speed
from spotrelay.models import Market, Pool

# `_maximise` stops when the cutting planes leave less than this share of the bound to gain.
RELATIVE_TOLERANCE = 1e-9
MAX_ITERATIONS = 200
# Work done to within this share of W is W done (the rounding of the segments' lengths).
WORK_TOLERANCE = 1e-12


@dataclass(frozen=True, slots=True)
class Run:
    """One instance of the foresight schedule: billed from `start` to `end`, progress after d."""

    pool: Pool
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Bound:
    cost: float  # the lower bound on any schedule that meets the deadline
    completion_hours: float  # when the foresight schedule finishes, from submission
    within_deadline: bool  # False: no schedule meets the deadline (the window was extended)
    schedule: tuple[Run, ...]  # the foresight schedule (module docstring)
    schedule_cost: float  # its cost: the optimum lies in [cost, schedule_cost]


@dataclass(frozen=True, slots=True)
class _Option:
    pool: Pool
    speed: float
    prices: tuple[float | None, ...]  # per segment; None where a spot pool cannot be used


@dataclass(slots=True)
class _Solution:
    value: float  # the programme's minimum: G(lam) when cost_weight is 1
    progress: float
    plan: list[int]  # per segment: the option running in it, -1 idle
    starts: list[bool]  # per segment: a run starts at its beginning


@dataclass(slots=True)
class _Cut:
    option: int
    segments: list[int]
    start: float
    end: float


def omniscient_bound(ctx: JobContext) -> Bound:
    """The bound and the foresight schedule of the module docstring for `ctx.job`."""
    job = ctx.job
    d, work = job.restart_overhead_hours, job.work_hours
    spans, options = _market(ctx, job.deadline_at, above_cap=False)
    most = _max_progress(spans, options, d)
    within = most >= work * (1 - WORK_TOLERANCE)
    if not within:
        spans, options = _market(ctx, _extended_end(ctx), above_cap=True)
        most = _max_progress(spans, options, d)
        if most < work * (1 - WORK_TOLERANCE):
            return Bound(math.inf, math.inf, within_deadline=False, schedule=(), schedule_cost=math.inf)
    # A schedule that does the work to the last rounding error counts as doing it (the replay's own sum of
    # the work is as rounded); asking the programme for more than its most would find no multiplier.
    target = min(work, most)
    lower, solution = _maximise(spans, options, d, target)
    # The relaxation spreads a restart over the schedules it mixes; any real schedule pays one whole
    # restart at least, at no less than the cheapest price of the window (module docstring).
    no_overheads, _ = _maximise(spans, options, 0.0, target)
    cheapest = min(p for o in options for p in o.prices if p is not None)
    lower = max(lower, no_overheads + d * cheapest)
    schedule, cost = _trim(_runs(solution), spans, options, d, target)
    # The bound is below every schedule's cost, the foresight schedule's too (rounding aside): anything
    # else is a bug in one or the other, not a figure to print.
    assert lower <= cost * (1 + 1e-9) + 1e-9, (job.name, lower, cost)
    finish = max((run.end for run in schedule), default=job.submit_hours)
    return Bound(
        cost=lower,
        completion_hours=finish - job.submit_hours,
        within_deadline=within,
        schedule=tuple(schedule),
        schedule_cost=cost,
    )


def _market(ctx: JobContext, end: float, *, above_cap: bool) -> tuple[list[tuple[float, float]], list[_Option]]:
    """The window's segments and every option with its price in each (None: a spot pool not usable).
    On-demand: the types within the cap, and with `above_cap` the others too (the rescue's)."""
    job = ctx.job
    cap = job.max_price
    zone = sorted(job.zones)[0]
    on_demand = [
        (Pool(instance_type=name, availability_zone=zone, market=Market.ON_DEMAND), price)
        for name, price in sorted(job.on_demand_prices.items())
        if above_cap or cap is None or price <= cap
    ]
    start = job.submit_hours
    points = [start, *ctx.change_times(start, end), end]
    spans = [(a, b) for a, b in itertools.pairwise(points) if b > a]
    options = [
        _Option(
            v.pool,
            v.speed,
            tuple(ctx.spot_price(v.pool, a) if v.timeline.available(a, cap) else None for a, _ in spans),
        )
        for v in ctx.spot_pools
    ]
    options += [
        _Option(pool, relative_speed(INSTANCE_TYPES[pool.instance_type]), (price,) * len(spans))
        for pool, price in on_demand
    ]
    return spans, options


def _extended_end(ctx: JobContext) -> float:
    """When the cheapest schedule at all has surely finished (module docstring, last paragraph)."""
    job = ctx.job
    last = max((*ctx.change_times(job.submit_hours, math.inf), job.deadline_at))
    slowest = min((v.speed for v in ctx.spot_pools), default=1.0)
    slowest = min([slowest, *(relative_speed(INSTANCE_TYPES[name]) for name in job.on_demand_prices)])
    return last + 2 * (job.restart_overhead_hours + job.work_hours / slowest)


def _solve(
    spans: list[tuple[float, float]], options: list[_Option], d: float, lam: float, cost_weight: float = 1.0
) -> _Solution:
    """min over schedules of cost_weight * cost - lam * progress (the lemma's programme), ties broken
    towards more progress, with the minimiser's plan."""
    n = len(options)
    idle_value, idle_progress = 0.0, 0.0
    value = [math.inf] * n
    progress = [0.0] * n
    back: list[tuple[int, list[bool]]] = []  # per segment: the best state before it, the options started
    for k, (a, b) in enumerate(spans):
        length = b - a
        best, best_progress, best_state = idle_value, idle_progress, -1
        for j in range(n):
            if value[j] < best or (value[j] == best and progress[j] > best_progress):
                best, best_progress, best_state = value[j], progress[j], j
        started = [False] * n
        for j, option in enumerate(options):
            price = option.prices[k]
            if price is None:
                value[j] = math.inf
                continue
            step = (cost_weight * price - lam * option.speed) * length
            start = best + lam * option.speed * d
            start_progress = best_progress - option.speed * d
            if start < value[j] or (start == value[j] and start_progress > progress[j]):
                value[j], progress[j] = start + step, start_progress + option.speed * length
                started[j] = True
            else:
                value[j] += step
                progress[j] += option.speed * length
        idle_value, idle_progress = best, best_progress
        back.append((best_state, started))
    final, final_progress, state = idle_value, idle_progress, -1
    for j in range(n):
        if value[j] < final or (value[j] == final and progress[j] > final_progress):
            final, final_progress, state = value[j], progress[j], j
    plan, starts = [-1] * len(spans), [False] * len(spans)
    for k in range(len(spans) - 1, -1, -1):
        before, started = back[k]
        if state == -1:
            state = before
            continue
        plan[k] = state
        if started[state]:
            starts[k] = True
            state = before
    return _Solution(final, final_progress, plan, starts)


def _max_progress(spans: list[tuple[float, float]], options: list[_Option], d: float) -> float:
    """The most work any schedule in the window does: the programme with no cost, minimising -progress."""
    return _solve(spans, options, d, lam=1.0, cost_weight=0.0).progress if options else 0.0


def _maximise(
    spans: list[tuple[float, float]], options: list[_Option], d: float, work: float
) -> tuple[float, _Solution]:
    """(the largest G(lam) + lam * W found, the minimiser at the smallest lam found whose schedule does W).
    Cutting planes: L(lam) = G(lam) + lam * W is concave with supergradient W - progress(lam); between
    a lam whose schedule does less than W and one whose schedule does W or more, the maximum lies below
    where their tangents cross; evaluate there and keep the side it falls on."""

    def evaluate(lam: float) -> tuple[float, _Solution]:
        solution = _solve(spans, options, d, lam)
        return solution.value + lam * work, solution

    low, (low_bound, low_solution) = 0.0, evaluate(0.0)
    if low_solution.progress >= work:  # free options: nothing to pay for
        return low_bound, low_solution
    high = 2 * max(p / o.speed for o in options for p in o.prices if p is not None) + 1.0
    high_bound, high_solution = evaluate(high)
    for _ in range(MAX_ITERATIONS):  # progress grows with lam up to its maximum, which is >= W
        if high_solution.progress >= work:
            break
        low, low_bound, low_solution = high, high_bound, high_solution
        high *= 2
        high_bound, high_solution = evaluate(high)
    else:
        raise RuntimeError(f"no multiplier up to {high:g} makes a schedule that does {work:g} h of work")
    best = max(low_bound, high_bound)
    for _ in range(MAX_ITERATIONS):
        rise, fall = work - low_solution.progress, work - high_solution.progress  # slopes: > 0, <= 0
        if rise - fall <= 0:
            break
        cross = (high_bound - low_bound + rise * low - fall * high) / (rise - fall)
        cross = min(max(cross, low), high)
        ceiling = low_bound + rise * (cross - low)
        if not low < cross < high:
            break
        bound, solution = evaluate(cross)
        best = max(best, bound)
        if ceiling - bound <= RELATIVE_TOLERANCE * max(1.0, abs(best)):
            if solution.progress >= work:
                high_solution = solution
            break
        if solution.progress >= work:
            high, high_bound, high_solution = cross, bound, solution
        else:
            low, low_bound, low_solution = cross, bound, solution
    return best, high_solution


def _runs(solution: _Solution) -> list[tuple[int, list[int]]]:
    """The plan as runs: (option, its segments in order)."""
    runs: list[tuple[int, list[int]]] = []
    for k, j in enumerate(solution.plan):
        if j == -1:
            continue
        if solution.starts[k] or not runs or runs[-1][0] != j or runs[-1][1][-1] != k - 1:
            runs.append((j, []))
        runs[-1][1].append(k)
    return runs


def _trim(
    runs: list[tuple[int, list[int]]],
    spans: list[tuple[float, float]],
    options: list[_Option],
    d: float,
    work: float,
) -> tuple[list[Run], float]:
    """The runs cut to W of progress, and what they cost: the excess comes off the end of the run that is
    dearest per unit of work there; a run left no longer than d makes no progress and is dropped."""
    cuts = [_Cut(j, list(ks), spans[ks[0]][0], spans[ks[-1]][1]) for j, ks in runs]
    excess = sum(options[c.option].speed * max(0.0, c.end - c.start - d) for c in cuts) - work
    while excess > 1e-12 and cuts:
        cut = max(cuts, key=lambda c: _price(options[c.option], c.segments[-1]) / options[c.option].speed)
        speed = options[cut.option].speed
        segment_start = spans[cut.segments[-1]][0]
        usable = speed * max(0.0, cut.end - max(segment_start, cut.start + d))
        if usable > excess:
            cut.end -= excess / speed
            break
        excess -= usable
        cut.segments.pop()
        cut.end = segment_start
        if not cut.segments or cut.end - cut.start <= d:
            cuts.remove(cut)
    schedule, cost = [], 0.0
    for cut in sorted(cuts, key=lambda c: c.start):
        option = options[cut.option]
        schedule.append(Run(option.pool, cut.start, cut.end))
        cost += sum(_price(option, k) * (min(spans[k][1], cut.end) - spans[k][0]) for k in cut.segments)
    return schedule, cost


def _price(option: _Option, segment: int) -> float:
    price = option.prices[segment]
    assert price is not None  # a run only covers segments where its option can be used
    return price
