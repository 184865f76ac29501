"""`omniscient`: a provable lower bound on what any schedule that meets a job's deadline pays, knowing
the whole future of the market. It is a bound, not a schedule a policy could follow.

Split [submission, deadline] at the market's change points (of the job's pools) into segments; within
a segment every pool's price and capacity are constant. Relax two things: restart overheads take no
time, and within a segment the job may split its time between pools. What is left is a linear program:

    minimise   sum over segments s, options o of  price(o, s) * x(o, s)
    subject to sum speed(o) * x(o, s) >= W       (the work, in reference-GPU hours)
               sum over o of x(o, s) <= len(s)   (one instance at a time)
               x >= 0

where the options of a segment are the spot pools available in it (capacity > 0, price within the
cap) and the on-demand types. Proof sketch that every deadline-meeting schedule pays at least
LP + d * c_min: take any such schedule and let x(o, s) be the time it makes progress on option o in
segment s. A spot instance making progress in s was not interrupted, so its pool had capacity and a
price within the cap there: o is an option of s. The work is done by the deadline, so
sum speed * x >= W (lost work only adds), one instance runs at a time, so sum_o x(o, s) <= len(s), and
the progress time costs sum price * x >= LP. On top of that, the attempt that makes the progress paid
its full restart overhead d, at a price no lower than the cheapest option of any segment (c_min).

Solving it: when every option has the same speed (every standard workload: all V100), the LP is
solved exactly by taking each segment's cheapest option and filling the cheapest hours first — spot
in every hour some pool is available (the cheapest pool) and on-demand for the rest, when spot is the
cheaper. With mixed speeds we use LP duality: for every lambda >= 0,
    lambda * W - sum_s len(s) * max(0, max_o(lambda * speed(o) - price(o, s)))  <=  LP,
and we maximise it over lambda by bisection on its slope (any lambda gives a valid bound).

Restart overheads, tightened. Every (re)start pays d, billed, before any progress. A spot instance
runs inside one availability interval of its pool (a maximal stretch of segments where the pool has
capacity and a price within the cap): it is interrupted when the interval ends. So a schedule that makes
x hours of progress in an interval I of length L (within the window) started there at least once, paid
at least d * p_min(I) for it, and x <= L - d. With y_I in {0, 1} for "started in I", x <= (L - d) y_I,
and relaxing y_I to [0, 1]: the overhead costs at least d * p_min(I) * x / (L - d). Adding that to every
spot option's price keeps the LP a lower bound (LP'), and intervals no longer than d offer nothing.
The bound is max(LP' , LP + d * c_min): both are valid, neither dominates (LP' charges no overhead to
on-demand, LP + d * c_min only one restart in all).

If no schedule can meet the deadline (no on-demand type within the cap and too little spot), the
window is extended past the deadline until the work fits, and the result is marked as such.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from spotrelay.bench.sim import JobContext
from spotrelay.catalog import INSTANCE_TYPES, relative_speed


@dataclass(frozen=True, slots=True)
class Bound:
    cost: float
    completion_hours: float  # when the bound's (fractional) schedule finishes, from submission
    exact_lp: bool  # True: the LP's optimum (equal speeds); False: its dual bound
    within_deadline: bool


@dataclass(frozen=True, slots=True)
class _Segment:
    start: float
    end: float
    options: tuple[tuple[float, float], ...]  # (price, speed)


def _segments(ctx: JobContext, end: float, *, interval_overheads: bool = False) -> list[_Segment]:
    """The window's segments and their options (price, speed). `interval_overheads`: each spot option's
    price carries its interval's share of a restart, d * p_min(I) / (L - d) (module docstring)."""
    job = ctx.job
    cap = job.max_price
    priced = [(price, relative_speed(INSTANCE_TYPES[name])) for name, price in job.on_demand_prices.items()]
    # The on-demand types within the cap; with none, every priced one: the replay's rescue finishes a job
    # on on-demand ignoring the cap when it has to (sim._rescue), so such schedules exist too.
    on_demand = tuple(o for o in priced if cap is None or o[0] <= cap) or tuple(priced)
    start = job.submit_hours
    points = [start, *ctx.change_times(start, end), end]
    spans = [(a, b) for a, b in itertools.pairwise(points) if b > a]
    # per pool, per segment: (price, speed) where available, else None
    spot_by_pool = [
        [(ctx.spot_price(v.pool, a), v.speed) if v.timeline.available(a, cap) else None for a, _ in spans]
        for v in ctx.spot_pools
    ]
    if interval_overheads:
        spot_by_pool = [_with_overheads(row, spans, job.restart_overhead_hours) for row in spot_by_pool]
    return [
        _Segment(a, b, tuple(option for row in spot_by_pool if (option := row[i]) is not None) + on_demand)
        for i, (a, b) in enumerate(spans)
    ]


def _with_overheads(
    row: list[tuple[float, float] | None], spans: list[tuple[float, float]], overhead: float
) -> list[tuple[float, float] | None]:
    """One pool's options with each availability interval's restart share added to its prices; the
    options of an interval no longer than the overhead dropped."""
    out: list[tuple[float, float] | None] = list(row)
    i = 0
    while i < len(row):
        if row[i] is None:
            i += 1
            continue
        j = i
        while j < len(row) and row[j] is not None:
            j += 1
        length = spans[j - 1][1] - spans[i][0]
        cheapest = min(option[0] for option in row[i:j] if option is not None)
        for k in range(i, j):
            option = row[k]
            assert option is not None
            out[k] = (option[0] + overhead * cheapest / (length - overhead), option[1]) if length > overhead else None
        i = j
    return out


def omniscient_bound(ctx: JobContext) -> Bound:
    """The lower bound of the module docstring for `ctx.job`: max(LP', LP + d * c_min)."""
    job = ctx.job
    end = job.deadline_at
    within = _capacity(_segments(ctx, end)) >= job.work_hours * (1 - 1e-12)
    if not within:
        end = math.inf
    segments = _segments(ctx, end)
    cost, finish, exact = _lp(segments, job.work_hours)
    c_min = min((price for seg in segments for price, _ in seg.options), default=math.inf)
    cost += job.restart_overhead_hours * c_min
    tightened, tightened_finish, tightened_exact = _lp(_segments(ctx, end, interval_overheads=True), job.work_hours)
    if math.isfinite(tightened) and tightened > cost:  # infinite: no spot interval longer than d; LP stands
        cost, finish, exact = tightened, tightened_finish, tightened_exact
    return Bound(cost=cost, completion_hours=finish - job.submit_hours, exact_lp=exact, within_deadline=within)


def _lp(segments: list[_Segment], work: float) -> tuple[float, float, bool]:
    """(the LP's optimum or its dual bound, when its fractional schedule ends, whether exact)."""
    speeds = {speed for seg in segments for _, speed in seg.options}
    if len(speeds) <= 1:
        cost, finish = _equal_speed(segments, work, next(iter(speeds), 1.0))
        return cost, finish, True
    cost, finish = _dual_bound(segments, work)
    return cost, finish, False


def _capacity(segments: list[_Segment]) -> float:
    return sum((s.end - s.start) * max((speed for _, speed in s.options), default=0.0) for s in segments)


def _equal_speed(segments: list[_Segment], work: float, speed: float) -> tuple[float, float]:
    need = work / speed
    cheapest = sorted(
        (min(price for price, _ in s.options), s.start, s.end) for s in segments if s.options and s.end > s.start
    )
    cost, finish = 0.0, -math.inf
    for price, a, b in cheapest:
        if need <= 0:
            break
        used = min(b - a, need)
        cost += price * used
        need -= used
        finish = max(finish, a + used)
    return (cost, finish) if need <= 1e-9 else (math.inf, math.inf)


def _dual_bound(segments: list[_Segment], work: float) -> tuple[float, float]:
    def pick(lam: float, seg: _Segment) -> tuple[float, float] | None:
        best, best_value = None, 0.0
        for price, speed in seg.options:
            value = lam * speed - price
            if value > best_value:
                best, best_value = (price, speed), value
        return best

    def done(lam: float) -> float:
        return sum((s.end - s.start) * chosen[1] for s in segments if (chosen := pick(lam, s)) is not None)

    def dual(lam: float) -> float:
        total = lam * work
        for s in segments:
            chosen = pick(lam, s)
            if chosen is not None:
                total -= (s.end - s.start) * (lam * chosen[1] - chosen[0])
        return total

    high = 2 * max(price / speed for s in segments for price, speed in s.options) + 1.0
    low = 0.0
    for _ in range(100):
        mid = (low + high) / 2
        if done(mid) >= work:
            high = mid
        else:
            low = mid
    finish = max((s.end for s in segments if pick(high, s) is not None), default=math.inf)
    return max(dual(low), dual(high)), finish
