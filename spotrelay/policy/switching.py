"""What a switch between markets costs, for placement (spotrelay.policy.placement): the work a preemption
may lose, a pool's cost per unit of work, spot dearer than on-demand, and whether a spot run pays for leaving
on-demand, judged from the job's own interrupted runs (`spot_run_hours`) or the pool's interruption rate."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from spotrelay.catalog import REFERENCE_GPU
from spotrelay.models import Attempt, AttemptOutcome, JobSpec, Market, Objective
from spotrelay.policy.interruptions import InterruptionModel
from spotrelay.policy.ranking import RankedPool, Rejection


def work_at_risk_hours(spec: JobSpec) -> float:
    """The work a preemption may lose, which the safety net keeps in its margin (see
    `spotrelay.policy.market_choice`). At the notice the agent sends SIGTERM, gives the job
    `checkpoint.grace_seconds` to save its state, then uploads the checkpoint dir. A job given no grace
    (`grace_seconds: 0`: it saves only on its own schedule) resumes from its last periodic checkpoint, up to
    `checkpoint.interval_minutes` of work ago; a job given grace saves at the notice and loses nothing
    (the paper's assumption)."""
    return spec.checkpoint.interval_minutes / 60 if spec.checkpoint.grace_seconds == 0 else 0.0


def unit_cost(r: RankedPool, objective: Objective = Objective.COST_TO_FINISH) -> float:
    """USD per reference-GPU hour of work on a ranked pool: its expected cost to finish (interruptions
    included) over the work, or, with objective `hourly` or no work left, its hourly price over its speed."""
    if objective is Objective.HOURLY or r.run_hours <= 0:
        return r.hourly_price / r.relative_speed
    return r.expected_cost_to_finish / (r.run_hours * r.relative_speed)


def cheaper_than_on_demand(
    spot: list[RankedPool], best: RankedPool, objective: Objective, rejected: list[Rejection]
) -> list[RankedPool]:
    """The spot pools that cost less per unit of work than `best`, the cheapest usable on-demand pool; the
    others are rejected. Spot is worth its interruptions only when it is cheaper: a 1-GPU job offered only
    an 8-GPU spot instance ($7-8/h for p3.16xlarge) runs on a 1-GPU on-demand one ($3.06/h for p3.2xlarge),
    or waits for cheaper spot while it is ahead of schedule."""
    yardstick = unit_cost(best, objective)
    kept = []
    for r in spot:
        unit = unit_cost(r, objective)
        if unit < yardstick:
            kept.append(r)
            continue
        rejected.append(
            Rejection(
                pool=r.pool,
                reason=(
                    f"${unit:.4f} per {REFERENCE_GPU}-hour of work on spot, no less than ${yardstick:.4f} "
                    f"on {best.pool.instance_type} on-demand"
                ),
                category="dearer-than-on-demand",
            )
        )
    return kept


def spot_runs_paying_off(
    spot: list[RankedPool],
    yardstick: RankedPool,
    spec: JobSpec,
    rates: InterruptionModel,
    overhead: float,
    spot_runs: Mapping[str, Sequence[float]],
) -> list[RankedPool]:
    """The spot pools where a run is expected to pay for leaving `yardstick`, the cheapest usable on-demand
    pool."""
    on_demand_unit = unit_cost(yardstick, spec.placement.objective)
    # a job that does not save at the notice also loses half a checkpoint interval on average
    overhead_hours = overhead + work_at_risk_hours(spec) / 2
    return [
        r
        for r in spot
        if spot_run_pays_off(
            spot_unit=r.hourly_price / r.relative_speed,
            on_demand_unit=on_demand_unit,
            speed_ratio=yardstick.relative_speed / r.relative_speed,
            overhead_hours=overhead_hours,
            runs=spot_runs.get(r.pool.offering, ()),
            hourly_rate=rates.hourly_rate(r.pool),
        )
    ]


def spot_run_pays_off(
    *,
    spot_unit: float,
    on_demand_unit: float,
    overhead_hours: float,
    runs: Sequence[float],
    hourly_rate: float,
    speed_ratio: float = 1.0,
) -> bool:
    """Whether moving a job from on-demand to a spot pool is expected to cost less than staying, whatever
    its progress. Prices per unit of work: spot s, on-demand o; `speed_ratio` k = on-demand speed / spot
    speed; d the overhead a start costs (hours).

    A spot run that lasts T hours before its interruption costs T x spot price and makes (T - d)+ hours of
    spot progress; the job then restarts on on-demand (d hours at its price). Staying on on-demand for the
    same T + d hours costs (T + d) x its price. The switch's shortfall in work is bought back on on-demand
    at worst (o per unit), so per unit of spot speed the switch pays off when T s + d o k < (T - d)+ o; on
    average over T:
        E[(T - d)+] / E[T] > s / o + d k / E[T].
    With the job's own interrupted runs in the pool (`runs`, boot included) the averages are theirs; with
    none, T is exponential with the pool's interruption rate r: E[(T - d)+] = exp(-r d) / r, and the
    condition is s + r d o k < exp(-r d) o. A pool whose capacity comes and goes in minutes (most of its
    runs end within d) fails it even at a third of the on-demand price."""
    if runs:
        total = sum(runs)
        if total <= 0:
            return False
        useful = sum(max(0.0, t - overhead_hours) for t in runs)
        return useful / total > spot_unit / on_demand_unit + overhead_hours * speed_ratio * len(runs) / total
    x = hourly_rate * overhead_hours
    return spot_unit + x * on_demand_unit * speed_ratio < math.exp(-x) * on_demand_unit


def spot_run_hours(attempts: Iterable[Attempt]) -> dict[str, list[float]]:
    """Per offering ('type:az'), how long each interrupted spot attempt ran: from its launch (an adopted
    standby: from the handover) to the interruption notice (or its end)."""
    runs: dict[str, list[float]] = {}
    for a in attempts:
        end = a.interrupted_at or a.ended_at
        # A standby that took the job over ran for it from the handover (its boot overlapped on-demand work).
        start = a.running_at if a.handover_from is not None and a.running_at is not None else a.started_at
        if a.pool.market is Market.SPOT and a.outcome is AttemptOutcome.INTERRUPTED and end is not None:
            runs.setdefault(a.pool.offering, []).append(max(0.0, (end - start).total_seconds() / 3600))
    return runs
