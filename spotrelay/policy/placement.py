"""Placement: rank the pools a job can run in by expected cost to finish, and say why.

Candidates are the priced spot pools (type x AZ) and, when the deadline calls for it, on-demand pools
of the same types in the same AZs. A candidate is rejected, with its reason, when the type is not a
GPU type we know, does not fit the job, the pool is blocked, its price is above the job's cap, it
would spend more than the job's remaining budget, or it cannot start and finish before the deadline
even if never interrupted.

Expected cost to finish (objective `cost-to-finish`):
    run_hours     = remaining work (reference-GPU hours) / relative speed of the type's GPU
    interruptions = hourly interruption rate of the pool x run_hours
    overhead      = interruptions x (restart overhead + half a checkpoint interval of lost work)
    expected cost = hourly price x (run_hours + overhead)
with the restart overhead the spec's `placement.restart_overhead_minutes` unless the caller overrides it,
so with equal speeds and rates it is simply the cheapest hourly price. Objective `hourly` ranks by
the hourly price alone. Ties break on price, then type, zone and market names: the result is a pure,
deterministic function of its inputs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotrelay.catalog import INSTANCE_TYPES, REFERENCE_GPU, InstanceType, relative_speed
from spotrelay.models import Attempt, AttemptOutcome, JobSpec, Market, Objective, Pool, PriceQuote
from spotrelay.models.job_spec import DEFAULT_RESTART_OVERHEAD_MINUTES
from spotrelay.policy.interruptions import InterruptionModel
from spotrelay.policy.market_choice import CATCH_UP_BAND_SHARE, MarketAction, MarketDecision, uniform_progress

# The job spec's default restart overhead (`placement.restart_overhead_minutes`), in hours.
DEFAULT_RESTART_OVERHEAD_HOURS = DEFAULT_RESTART_OVERHEAD_MINUTES / 60
# A pool that finishes exactly at the deadline is feasible: sums of hours carry floating-point rounding
# (3.2 + 0.1 > 3.3 in binary), which must not turn "just in time" into "rejected for the deadline".
DEADLINE_ROUNDING_HOURS = 1e-9


class RankedPool(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool: Pool
    hourly_price: float
    relative_speed: float
    run_hours: float
    expected_interruptions: float
    expected_cost_to_finish: float
    interruption_basis: str

    @property
    def gpu_model(self) -> str:
        return INSTANCE_TYPES[self.pool.instance_type].gpu_model


class Rejection(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool: Pool
    reason: str
    category: str  # a short key to summarise rejections by: "misfit", "blocked", "price-cap", ...
    hourly_price: float | None = None  # the pool's price, where it was quoted


class Placement(BaseModel):
    """The ranked feasible pools (best first), the rejected candidates, and the market decision."""

    model_config = ConfigDict(frozen=True)

    job_name: str
    objective: Objective
    remaining_work_hours: float
    work_hours_known: bool
    market: MarketDecision
    ranked: tuple[RankedPool, ...]
    rejected: tuple[Rejection, ...]
    # No pool can finish before the deadline any more: none is rejected for it, the job finishes as soon
    # as it can (on on-demand, by the safety net, if the job allows on-demand).
    deadline_lost: bool = False

    @property
    def best(self) -> RankedPool | None:
        return self.ranked[0] if self.ranked else None

    def to_json_dict(self) -> dict[str, list[dict[str, object]]]:
        return {
            "ranked": [
                {
                    "instance_type": r.pool.instance_type,
                    "availability_zone": r.pool.availability_zone,
                    "market": str(r.pool.market),
                    "hourly_price": r.hourly_price,
                    "expected_cost_to_finish": round(r.expected_cost_to_finish, 6),
                }
                for r in self.ranked
            ],
            "rejected": [
                {
                    "instance_type": r.pool.instance_type,
                    "availability_zone": r.pool.availability_zone,
                    "reason": r.reason,
                }
                for r in self.rejected
            ],
        }

    def explain(self, alternatives: int = 3) -> list[str]:
        """A few lines a person can read: what was chosen, why, what came next, what was ruled out."""
        work = (
            f"{self.remaining_work_hours:g} h of work left on the reference GPU ({REFERENCE_GPU})"
            if self.work_hours_known
            else "no work_hours given: costs are per hour of reference-GPU work"
        )
        lines = [f"job {self.job_name}: {work}; ranking by {self.objective}", f"market: {self.market.reason}"]
        best = self.best
        if best is None:
            lines.append("no pool can take the job now")
        else:
            lines.append(
                f"chosen: {best.pool} at ${best.hourly_price:.4f}/h — {best.gpu_model} runs at "
                f"{best.relative_speed:.2f}x {REFERENCE_GPU}, so {best.run_hours:.2f} h; "
                f"{best.expected_interruptions:.2f} interruptions expected ({best.interruption_basis}); "
                f"expected cost to finish ${best.expected_cost_to_finish:.2f}"
            )
            for r in self.ranked[1 : 1 + alternatives]:
                lines.append(
                    f"  next: {r.pool} at ${r.hourly_price:.4f}/h, expected ${r.expected_cost_to_finish:.2f} "
                    f"(+${r.expected_cost_to_finish - best.expected_cost_to_finish:.2f})"
                )
            if len(self.ranked) > 1 + alternatives:
                lines.append(f"  ... and {len(self.ranked) - 1 - alternatives} more feasible pools")
        if self.rejected:
            counts = Counter(r.category for r in self.rejected)
            summary = ", ".join(f"{n} {category}" for category, n in sorted(counts.items()))
            lines.append(f"rejected {len(self.rejected)} candidates: {summary}")
            shown: set[str] = set()
            for rejection in self.rejected:
                if rejection.category not in shown:
                    shown.add(rejection.category)
                    lines.append(f"  e.g. {rejection.pool}: {rejection.reason}")
        return lines

    def why_none(self, *, market: bool = True) -> str:
        """One line on why no pool can take the job now: what ruled the candidates out, with the cheapest
        example of each kind (the price a cap would have to allow); with `market`, the market choice's
        reason too."""
        if not self.rejected:
            return f"no pool is quoted for the job; market: {self.market.reason}"
        counts = Counter(r.category for r in self.rejected)
        kinds = []
        for category, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            of_kind = [r for r in self.rejected if r.category == category]
            example = min(of_kind, key=lambda r: (r.hourly_price is None, r.hourly_price or 0.0))
            kinds.append(f"{n} {category} (cheapest: {example.pool}: {example.reason})")
        tail = f"; market: {self.market.reason}" if market else ""
        return f"no pool can take the job now: {'; '.join(kinds)}{tail}"


def latest_quotes(quotes: Iterable[PriceQuote]) -> dict[Pool, PriceQuote]:
    """One quote per pool: the latest by timestamp (untimed quotes: the last one given)."""
    latest: dict[Pool, PriceQuote] = {}
    for quote in quotes:
        held = latest.get(quote.pool)
        if held is None or quote.timestamp is None or held.timestamp is None or quote.timestamp >= held.timestamp:
            latest[quote.pool] = quote
    return latest


def place(
    spec: JobSpec,
    quotes: Iterable[PriceQuote],
    *,
    remaining_work_hours: float | None = None,
    work_done_hours: float = 0.0,
    elapsed_hours: float = 0.0,
    blocked: Collection[Pool] = (),
    interruptions: InterruptionModel | None = None,
    on_demand_prices: Mapping[str, float] | None = None,
    budget_left_usd: float | None = None,
    current_market: Market | None = None,
    zones: Collection[str] = (),
    restart_overhead_hours: float | None = None,
    migrates: bool = False,
    spot_runs: Mapping[str, Sequence[float]] | None = None,
    out_of_patience: bool = False,
) -> Placement:
    """Rank the pools for `spec` given the current `quotes`.

    `remaining_work_hours` defaults to the spec's `work_hours` minus `work_done_hours` (or 1 h of
    reference-GPU work when the spec gives none). `on_demand_prices` default to the catalog's.
    `blocked` pools are skipped (the interrupted-pool cache of the recovery strategies). On-demand
    pools are considered in `zones` and in every zone that has a spot quote.

    `restart_overhead_hours` (boot, image pull, checkpoint restore) defaults to the spec's
    `placement.restart_overhead_minutes`. `current_market` is the market of the job's running instance
    (None: idle). `migrates`: the caller re-places a job while it runs on on-demand and moves it back to
    spot when the market choice says so; only then does an idle job behind schedule with no spot go
    on-demand to catch up (Uniform Progress's rule 1, see `spotrelay.policy.market_choice`), once it is
    behind by more than rule 1's band, and an `out_of_patience` one (it has waited its
    `limits.max_wait_hours`) with no spot go on-demand wherever it is; otherwise it waits for spot until
    the safety net. A caller that passes `current_market=on-demand` is re-placing an on-demand job, so it
    migrates by definition.

    `spot_runs`: how long (hours, boot included) each of the job's spot attempts ran before it was
    interrupted, per offering ('type:az') — `spot_run_hours(attempts)`. For a job on on-demand behind the
    uniform line, they decide in which pools a spot run pays for the switch (`spot_run_pays_off`).
    """
    overhead = spec.placement.restart_overhead_hours if restart_overhead_hours is None else restart_overhead_hours
    rates = interruptions or InterruptionModel()
    known = spec.work_hours is not None or remaining_work_hours is not None
    if remaining_work_hours is None:
        remaining_work_hours = max(0.0, spec.work_hours - work_done_hours) if spec.work_hours else 1.0
    od_prices = on_demand_prices if on_demand_prices is not None else _catalog_on_demand_prices()
    blocked_set = frozenset(blocked)
    cap = spec.limits.max_price_per_hour
    overhead_per_interruption = overhead + spec.checkpoint.interval_minutes / 60 / 2
    # Without a work estimate nobody knows whether a pool can finish in time: no deadline rejections.
    judge_deadline = spec.limits.deadline_hours is not None and known
    time_left = spec.limits.deadline_hours - elapsed_hours if judge_deadline and spec.limits.deadline_hours else None
    misfits: dict[str, str | None] = {}

    def misfit(type_name: str) -> str | None:
        if type_name not in misfits:
            itype = INSTANCE_TYPES.get(type_name)
            misfits[type_name] = (
                "not a GPU instance type in the catalog" if itype is None else spec.resources.misfit(itype)
            )
        return misfits[type_name]

    def within_cap(price: float) -> bool:
        return cap is None or price <= cap

    latest = sorted(latest_quotes(quotes).items(), key=lambda item: _pool_order(item[0]))
    on_demand_types = [
        itype for name in sorted(od_prices) if (itype := INSTANCE_TYPES.get(name)) is not None and misfit(name) is None
    ]
    # A deadline no pool can meet any more (a preemption lost work the net could not cover, or the job
    # came too late): rejecting every pool for it would leave the job waiting until `max_wait_hours`
    # fails it. It is late whatever happens now, so no pool is rejected for the deadline and the market
    # choice's safety net puts it on on-demand: finished as soon as possible, the least late it can be.
    # Only types the job could get at all count: a spot quote or (with on_demand_fallback) an on-demand
    # price within max_price_per_hour.
    usable_names = {
        pool.instance_type for pool, quote in latest if pool.market is Market.SPOT and within_cap(quote.usd_per_hour)
    }
    if spec.limits.on_demand_fallback:
        usable_names |= {t.name for t in on_demand_types if within_cap(od_prices[t.name])}
    candidate_types = [
        itype for name in usable_names if (itype := INSTANCE_TYPES.get(name)) is not None and misfit(name) is None
    ]
    deadline_lost = (
        time_left is not None
        and bool(candidate_types)
        and min(remaining_work_hours / relative_speed(t) for t in candidate_types) + overhead
        > time_left + DEADLINE_ROUNDING_HOURS
    )
    if deadline_lost:
        time_left = None

    ranked: list[RankedPool] = []
    rejected: list[Rejection] = []

    def consider(pool: Pool, price: float, rejected: list[Rejection] = rejected) -> RankedPool | None:
        reason = misfit(pool.instance_type)
        if reason is not None:
            category = "unknown-type" if pool.instance_type not in INSTANCE_TYPES else "misfit"
            rejected.append(Rejection(pool=pool, reason=reason, category=category))
            return None
        if pool in blocked_set:
            rejected.append(Rejection(pool=pool, reason="pool blocked after a recent loss", category="blocked"))
            return None
        if cap is not None and price > cap:
            rejected.append(
                Rejection(
                    pool=pool,
                    reason=f"${price:.4f}/h is above max_price_per_hour ${cap:g}",
                    category="price-cap",
                    hourly_price=price,
                )
            )
            return None
        speed = relative_speed(INSTANCE_TYPES[pool.instance_type])
        run_hours = remaining_work_hours / speed
        if time_left is not None and run_hours + overhead > time_left + DEADLINE_ROUNDING_HOURS:
            rejected.append(
                Rejection(
                    pool=pool,
                    reason=(
                        f"needs {run_hours:.2f} h + {overhead:g} h to start, "
                        f"only {time_left:.2f} h left to the deadline"
                    ),
                    category="deadline",
                )
            )
            return None
        rate = rates.hourly_rate(pool)
        expected_interruptions = rate * run_hours
        billed_hours = run_hours + expected_interruptions * overhead_per_interruption
        expected_cost = price * billed_hours
        if budget_left_usd is not None and expected_cost > budget_left_usd:
            rejected.append(
                Rejection(
                    pool=pool,
                    reason=f"expected ${expected_cost:.2f} to finish exceeds the ${budget_left_usd:.2f} budget left",
                    category="budget",
                )
            )
            return None
        return RankedPool(
            pool=pool,
            hourly_price=price,
            relative_speed=speed,
            run_hours=run_hours,
            expected_interruptions=expected_interruptions,
            expected_cost_to_finish=expected_cost,
            interruption_basis=rates.describe(pool),
        )

    spot: list[RankedPool] = []
    all_zones = set(zones)
    for pool, quote in latest:
        all_zones.add(pool.availability_zone)
        if pool.market is Market.SPOT:
            candidate = consider(pool, quote.usd_per_hour)
            if candidate is not None:
                spot.append(candidate)

    od_run_hours = _on_demand_run_hours(on_demand_types, od_prices, remaining_work_hours, cap)
    # The on-demand pools the job could be given now (fits, not blocked, within the cap, the deadline and
    # the budget), when the market choice can pick on-demand at all (it needs a deadline and a work
    # estimate; without them it chooses between spot and waiting). Their rejections are reported only if
    # it does pick on-demand.
    on_demand: list[RankedPool] = []
    on_demand_rejected: list[Rejection] = []
    if spec.limits.on_demand_fallback and spec.limits.deadline_hours is not None and spec.work_hours is not None:
        for itype in on_demand_types:
            for zone in sorted(all_zones):
                pool = Pool(instance_type=itype.name, availability_zone=zone, market=Market.ON_DEMAND)
                candidate = consider(pool, od_prices[itype.name], on_demand_rejected)
                if candidate is not None:
                    on_demand.append(candidate)
    # The yardstick for spot: the cheapest of them per unit of work. Spot dearer than that is no spot at all.
    cheapest_on_demand = (
        min(on_demand, key=lambda r: (unit_cost(r, spec.placement.objective), *_pool_order(r.pool)))
        if on_demand
        else None
    )
    if cheapest_on_demand is not None:
        spot = _cheaper_than(spot, cheapest_on_demand, spec.placement.objective, rejected)
    market_inputs: dict[str, Any] = {
        "total_work_hours": spec.work_hours,
        "work_done_hours": work_done_hours,
        "deadline_hours": spec.limits.deadline_hours,
        "elapsed_hours": elapsed_hours,
        "on_demand_run_hours": od_run_hours,
        "restart_overhead_hours": overhead,
        "spot_available": bool(spot),
        "on_demand_allowed": spec.limits.on_demand_fallback,
        "current": current_market,
        "returns_to_spot": migrates or current_market is Market.ON_DEMAND,
        "work_at_risk_hours": work_at_risk_hours(spec),
        "catch_up_band_share": CATCH_UP_BAND_SHARE,
        "out_of_patience": out_of_patience,
    }
    decision = uniform_progress(**market_inputs)
    if current_market is Market.ON_DEMAND and decision.action is MarketAction.ON_DEMAND and spot and cheapest_on_demand:
        # Rule 3, refined: behind the line, back to spot only in the pools where a run pays for the switch.
        paying = _spot_runs_paying_off(spot, cheapest_on_demand, spec, rates, overhead, spot_runs or {})
        refined = uniform_progress(**market_inputs, spot_run_pays_off=bool(paying))
        if refined.action is MarketAction.SPOT:
            decision = refined
            for r in spot:
                if r not in paying:
                    runs = (spot_runs or {}).get(r.pool.offering, ())
                    why = (
                        f"its {len(runs)} interrupted run(s) here averaged {sum(runs) / len(runs) * 60:.0f} min"
                        if runs
                        else f"{rates.hourly_rate(r.pool):.2f} interruptions/h expected here"
                    )
                    rejected.append(
                        Rejection(
                            pool=r.pool,
                            reason=f"{why}: a run is too short to pay for leaving on-demand",
                            category="short-runs",
                        )
                    )
            spot = paying
        else:
            decision = decision.model_copy(
                update={"reason": f"{decision.reason}; no spot pool where a run would pay for the switch"}
            )
    if deadline_lost:
        decision = decision.model_copy(
            update={"reason": f"the deadline can no longer be met: finish as soon as possible; {decision.reason}"}
        )

    if decision.action is MarketAction.SPOT:
        ranked.extend(spot)
    elif decision.action is MarketAction.ON_DEMAND:
        rejected.extend(on_demand_rejected)
        if on_demand or not spot:
            ranked.extend(on_demand)
            for r in spot:
                rejected.append(
                    Rejection(pool=r.pool, reason=f"market is on-demand now: {decision.reason}", category="market")
                )
        else:
            # On-demand is the safe choice, but no on-demand pool is usable (blocked, over the budget or
            # the cap): spot is better than waiting for nothing.
            ranked.extend(spot)
            decision = decision.model_copy(
                update={
                    "action": MarketAction.SPOT,
                    "reason": f"{decision.reason}; no on-demand pool is usable: spot instead",
                }
            )

    key = (
        (lambda r: (r.hourly_price, *_pool_order(r.pool)))
        if spec.placement.objective is Objective.HOURLY
        else (lambda r: (r.expected_cost_to_finish, r.hourly_price, *_pool_order(r.pool)))
    )
    ranked.sort(key=key)
    return Placement(
        job_name=spec.name,
        objective=spec.placement.objective,
        remaining_work_hours=remaining_work_hours,
        work_hours_known=known,
        market=decision,
        ranked=tuple(ranked),
        rejected=tuple(rejected),
        deadline_lost=deadline_lost,
    )


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


def _cheaper_than(
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


def _spot_runs_paying_off(
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


def _pool_order(pool: Pool) -> tuple[str, str, str]:
    return (pool.instance_type, pool.availability_zone, str(pool.market))


def _catalog_on_demand_prices() -> dict[str, float]:
    return {
        name: itype.on_demand_usd_per_hour
        for name, itype in INSTANCE_TYPES.items()
        if itype.on_demand_usd_per_hour is not None
    }


def _on_demand_run_hours(
    types: list[InstanceType], prices: Mapping[str, float], remaining_work_hours: float, cap: float | None
) -> float | None:
    """Run time on the on-demand type that finishes the remaining work cheapest (within the cap)."""
    affordable = [t for t in types if cap is None or prices[t.name] <= cap]
    if not affordable:
        return None
    best = min(affordable, key=lambda t: (prices[t.name] / relative_speed(t), t.name))
    return remaining_work_hours / relative_speed(best)
