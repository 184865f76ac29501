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


def _segments(ctx: JobContext, end: float) -> list[_Segment]:
    job = ctx.job
    cap = job.max_price
    on_demand = tuple(
        (price, relative_speed(INSTANCE_TYPES[name]))
        for name in job.instance_types
        if (price := job.on_demand_prices.get(name)) is not None and (cap is None or price <= cap)
    )
    start = job.submit_hours
    points = [start, *ctx.change_times(start, end), end]
    segments = []
    for a, b in itertools.pairwise(points):
        if b <= a:
            continue
        spot = tuple((ctx.spot_price(v.pool, a), v.speed) for v in ctx.spot_pools if v.timeline.available(a, cap))
        segments.append(_Segment(a, b, spot + on_demand))
    return segments


def omniscient_bound(ctx: JobContext) -> Bound:
    """The lower bound of the module docstring for `ctx.job`."""
    job = ctx.job
    segments = _segments(ctx, job.deadline_at)
    within = _capacity(segments) >= job.work_hours * (1 - 1e-12)
    if not within:
        segments = _segments(ctx, math.inf)
    speeds = {speed for seg in segments for _, speed in seg.options}
    if len(speeds) <= 1:
        cost, finish = _equal_speed(segments, job.work_hours, next(iter(speeds), 1.0))
        exact = True
    else:
        cost, finish = _dual_bound(segments, job.work_hours)
        exact = False
    c_min = min((price for seg in segments for price, _ in seg.options), default=math.inf)
    return Bound(
        cost=cost + job.restart_overhead_hours * c_min,
        completion_hours=finish - job.submit_hours,
        exact_lp=exact,
        within_deadline=within,
    )


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
