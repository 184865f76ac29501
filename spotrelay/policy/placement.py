"""Placement: rank the pools a job can run in by expected cost to finish, and say why.

Candidates are the priced spot pools (type x AZ) and, when the deadline calls for it, on-demand pools
of the same types in the same AZs. A candidate is rejected, with its reason, when the type is not a
GPU type we know, does not fit the job, the pool is blocked, its price is above the job's cap, it
would spend more than the job's remaining budget, or it cannot start and finish before the deadline
even if never interrupted.

How (`rank`, of a `PlacementRequest`: what `place()` is given): every candidate goes through a chain of
filters (`FILTERS`: fits, not blocked, within the price cap, in time for the deadline, within the budget),
the first that rejects it giving its reason, as Karpenter's scheduling filters do; the survivors are costed,
spot dearer per unit of work than the cheapest usable on-demand pool is rejected (spotrelay.policy.switching),
the market choice (Uniform Progress, spotrelay.policy.market_choice) picks spot, on-demand or waiting, and the
pools of the chosen market are ranked. What it answers is a `Placement` (spotrelay.policy.ranking).

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

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotrelay.catalog import INSTANCE_TYPES, InstanceType, relative_speed
from spotrelay.models import JobSpec, Market, Objective, Pool, PriceQuote
from spotrelay.models.job_spec import DEFAULT_RESTART_OVERHEAD_MINUTES
from spotrelay.policy.interruptions import InterruptionModel
from spotrelay.policy.market_choice import CATCH_UP_BAND_SHARE, MarketAction, MarketDecision, uniform_progress
from spotrelay.policy.ranking import Placement, RankedPool, Rejection
from spotrelay.policy.switching import (
    cheaper_than_on_demand,
    spot_run_hours,
    spot_run_pays_off,
    spot_runs_paying_off,
    unit_cost,
    work_at_risk_hours,
)

# The job spec's default restart overhead (`placement.restart_overhead_minutes`), in hours.
DEFAULT_RESTART_OVERHEAD_HOURS = DEFAULT_RESTART_OVERHEAD_MINUTES / 60
# A pool that finishes exactly at the deadline is feasible: sums of hours carry floating-point rounding
# (3.2 + 0.1 > 3.3 in binary), which must not turn "just in time" into "rejected for the deadline".
DEADLINE_ROUNDING_HOURS = 1e-9


def latest_quotes(quotes: Iterable[PriceQuote]) -> dict[Pool, PriceQuote]:
    """One quote per pool: the latest by timestamp (untimed quotes: the last one given)."""
    latest: dict[Pool, PriceQuote] = {}
    for quote in quotes:
        held = latest.get(quote.pool)
        if held is None or quote.timestamp is None or held.timestamp is None or quote.timestamp >= held.timestamp:
            latest[quote.pool] = quote
    return latest


@dataclass(frozen=True)
class PlacementRequest:
    """What `place()` ranks pools for: the job, the spot quotes, and what the caller knows of the job now
    (the arguments of `place()`, which says what each means)."""

    spec: JobSpec
    quotes: tuple[PriceQuote, ...]
    remaining_work_hours: float | None = None
    work_done_hours: float = 0.0
    elapsed_hours: float = 0.0
    blocked: frozenset[Pool] = frozenset()
    interruptions: InterruptionModel | None = None
    on_demand_prices: Mapping[str, float] | None = None
    budget_left_usd: float | None = None
    current_market: Market | None = None
    zones: frozenset[str] = frozenset()
    restart_overhead_hours: float | None = None
    migrates: bool = False
    spot_runs: Mapping[str, Sequence[float]] | None = None
    out_of_patience: bool = False


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
    """Rank the pools for `spec` given the current `quotes` (`rank` of the `PlacementRequest` they make).

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
    return rank(
        PlacementRequest(
            spec=spec,
            quotes=tuple(quotes),
            remaining_work_hours=remaining_work_hours,
            work_done_hours=work_done_hours,
            elapsed_hours=elapsed_hours,
            blocked=frozenset(blocked),
            interruptions=interruptions,
            on_demand_prices=on_demand_prices,
            budget_left_usd=budget_left_usd,
            current_market=current_market,
            zones=frozenset(zones),
            restart_overhead_hours=restart_overhead_hours,
            migrates=migrates,
            spot_runs=spot_runs,
            out_of_patience=out_of_patience,
        )
    )


def rank(request: PlacementRequest) -> Placement:
    """The candidates through the filter chain (`FILTERS`), the market choice over what passed, the ranking."""
    terms = _Terms.of(request)
    rejected: list[Rejection] = []
    spot = [
        r
        for pool, quote in terms.latest
        if pool.market is Market.SPOT and (r := _consider(pool, quote.usd_per_hour, terms, rejected))
    ]
    # The on-demand pools the job could be given now (fits, not blocked, within the cap, the deadline and
    # the budget), when the market choice can pick on-demand at all (it needs a deadline and a work
    # estimate; without them it chooses between spot and waiting). Their rejections are reported only if
    # it does pick on-demand.
    on_demand_rejected: list[Rejection] = []
    on_demand = [
        r for pool, price in terms.on_demand_candidates() if (r := _consider(pool, price, terms, on_demand_rejected))
    ]
    # The yardstick for spot: the cheapest of them per unit of work. Spot dearer than that is no spot at all.
    objective = request.spec.placement.objective
    cheapest_on_demand = (
        min(on_demand, key=lambda r: (unit_cost(r, objective), *_pool_order(r.pool))) if on_demand else None
    )
    if cheapest_on_demand is not None:
        spot = cheaper_than_on_demand(spot, cheapest_on_demand, objective, rejected)
    decision, spot = _market_decision(terms, spot, cheapest_on_demand, rejected)
    ranked: list[RankedPool] = []
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
        if objective is Objective.HOURLY
        else (lambda r: (r.expected_cost_to_finish, r.hourly_price, *_pool_order(r.pool)))
    )
    ranked.sort(key=key)
    return Placement(
        job_name=request.spec.name,
        objective=objective,
        remaining_work_hours=terms.remaining_work_hours,
        work_hours_known=terms.known,
        market=decision,
        ranked=tuple(ranked),
        rejected=tuple(rejected),
        deadline_lost=terms.deadline_lost,
    )


# --- the request resolved ------------------------------------------------------------------------------


@dataclass
class _Terms:
    """A request's values as the filters and the costing read them."""

    request: PlacementRequest
    overhead: float  # restart overhead, hours
    rates: InterruptionModel
    known: bool  # a work estimate was given (the spec's or the caller's)
    remaining_work_hours: float
    od_prices: Mapping[str, float]
    cap: float | None
    overhead_per_interruption: float
    latest: list[tuple[Pool, PriceQuote]]  # one quote per pool, in pool order
    on_demand_types: list[InstanceType]
    time_left: float | None = None  # hours to the deadline, when it is judged (None: not)
    deadline_lost: bool = False
    misfits: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def of(cls, request: PlacementRequest) -> _Terms:
        spec = request.spec
        known = spec.work_hours is not None or request.remaining_work_hours is not None
        remaining = request.remaining_work_hours
        if remaining is None:
            remaining = max(0.0, spec.work_hours - request.work_done_hours) if spec.work_hours else 1.0
        overhead = (
            spec.placement.restart_overhead_hours
            if request.restart_overhead_hours is None
            else request.restart_overhead_hours
        )
        od_prices = request.on_demand_prices if request.on_demand_prices is not None else _catalog_on_demand_prices()
        terms = cls(
            request=request,
            overhead=overhead,
            rates=request.interruptions or InterruptionModel(),
            known=known,
            remaining_work_hours=remaining,
            od_prices=od_prices,
            cap=spec.limits.max_price_per_hour,
            overhead_per_interruption=overhead + spec.checkpoint.interval_minutes / 60 / 2,
            latest=sorted(latest_quotes(request.quotes).items(), key=lambda item: _pool_order(item[0])),
            on_demand_types=[],
        )
        terms.on_demand_types = [
            itype
            for name in sorted(od_prices)
            if (itype := INSTANCE_TYPES.get(name)) is not None and terms.misfit(name) is None
        ]
        # Without a work estimate nobody knows whether a pool can finish in time: no deadline rejections.
        deadline = spec.limits.deadline_hours
        if deadline is not None and known and deadline:
            terms.time_left = deadline - request.elapsed_hours
        terms.deadline_lost = terms._deadline_lost()
        if terms.deadline_lost:
            terms.time_left = None
        return terms

    def misfit(self, type_name: str) -> str | None:
        if type_name not in self.misfits:
            itype = INSTANCE_TYPES.get(type_name)
            self.misfits[type_name] = (
                "not a GPU instance type in the catalog" if itype is None else self.request.spec.resources.misfit(itype)
            )
        return self.misfits[type_name]

    def within_cap(self, price: float) -> bool:
        return self.cap is None or price <= self.cap

    def _deadline_lost(self) -> bool:
        """A deadline no pool can meet any more (a preemption lost work the net could not cover, or the job
        came too late): rejecting every pool for it would leave the job waiting until `max_wait_hours` fails
        it. It is late whatever happens now, so no pool is rejected for the deadline and the market choice's
        safety net puts it on on-demand: finished as soon as possible, the least late it can be. Only types
        the job could get at all count: a spot quote or (with on_demand_fallback) an on-demand price within
        max_price_per_hour."""
        if self.time_left is None:
            return False
        usable = {
            pool.instance_type
            for pool, quote in self.latest
            if pool.market is Market.SPOT and self.within_cap(quote.usd_per_hour)
        }
        if self.request.spec.limits.on_demand_fallback:
            usable |= {t.name for t in self.on_demand_types if self.within_cap(self.od_prices[t.name])}
        types = [t for name in usable if (t := INSTANCE_TYPES.get(name)) is not None and self.misfit(name) is None]
        return bool(types) and (
            min(self.remaining_work_hours / relative_speed(t) for t in types) + self.overhead
            > self.time_left + DEADLINE_ROUNDING_HOURS
        )

    def on_demand_candidates(self) -> list[tuple[Pool, float]]:
        """The on-demand pools to consider: every fitting type in every zone (the request's and the quoted
        ones), when the market choice may pick on-demand (a deadline, a work estimate, the fallback allowed)."""
        limits = self.request.spec.limits
        if not (
            limits.on_demand_fallback and limits.deadline_hours is not None and self.request.spec.work_hours is not None
        ):
            return []
        zones = set(self.request.zones) | {pool.availability_zone for pool, _ in self.latest}
        return [
            (
                Pool(instance_type=itype.name, availability_zone=zone, market=Market.ON_DEMAND),
                self.od_prices[itype.name],
            )
            for itype in self.on_demand_types
            for zone in sorted(zones)
        ]

    def run_hours(self, pool: Pool) -> float:
        return self.remaining_work_hours / relative_speed(INSTANCE_TYPES[pool.instance_type])

    def expected_interruptions(self, pool: Pool) -> float:
        return self.rates.hourly_rate(pool) * self.run_hours(pool)

    def expected_cost(self, pool: Pool, price: float) -> float:
        """The pool's expected cost to finish: its price over the run and the expected interruptions' overhead."""
        return price * (self.run_hours(pool) + self.expected_interruptions(pool) * self.overhead_per_interruption)

    def costed(self, pool: Pool, price: float) -> RankedPool:
        return RankedPool(
            pool=pool,
            hourly_price=price,
            relative_speed=relative_speed(INSTANCE_TYPES[pool.instance_type]),
            run_hours=self.run_hours(pool),
            expected_interruptions=self.expected_interruptions(pool),
            expected_cost_to_finish=self.expected_cost(pool, price),
            interruption_basis=self.rates.describe(pool),
        )


# --- the filter chain ----------------------------------------------------------------------------------
# Each filter looks at one candidate pool (at its price) and rejects it with a reason, or lets it through;
# the first to reject it is the one reported. In order: the type fits the job, the pool is not blocked,
# the price is within the job's cap, it can finish before the deadline, its expected cost is within the
# budget left.


def _fits(pool: Pool, price: float, terms: _Terms) -> Rejection | None:
    reason = terms.misfit(pool.instance_type)
    if reason is None:
        return None
    category = "unknown-type" if pool.instance_type not in INSTANCE_TYPES else "misfit"
    return Rejection(pool=pool, reason=reason, category=category)


def _not_blocked(pool: Pool, price: float, terms: _Terms) -> Rejection | None:
    if pool not in terms.request.blocked:
        return None
    return Rejection(pool=pool, reason="pool blocked after a recent loss", category="blocked")


def _within_price_cap(pool: Pool, price: float, terms: _Terms) -> Rejection | None:
    if terms.cap is None or not price > terms.cap:
        return None
    reason = f"${price:.4f}/h is above max_price_per_hour ${terms.cap:g}"
    return Rejection(pool=pool, reason=reason, category="price-cap", hourly_price=price)


def _in_time(pool: Pool, price: float, terms: _Terms) -> Rejection | None:
    run_hours = terms.run_hours(pool)
    if terms.time_left is None or not run_hours + terms.overhead > terms.time_left + DEADLINE_ROUNDING_HOURS:
        return None
    reason = (
        f"needs {run_hours:.2f} h + {terms.overhead:g} h to start, only {terms.time_left:.2f} h left to the deadline"
    )
    return Rejection(pool=pool, reason=reason, category="deadline")


def _within_budget(pool: Pool, price: float, terms: _Terms) -> Rejection | None:
    budget = terms.request.budget_left_usd
    if budget is None:
        return None
    expected = terms.expected_cost(pool, price)
    if not expected > budget:
        return None
    reason = f"expected ${expected:.2f} to finish exceeds the ${budget:.2f} budget left"
    return Rejection(pool=pool, reason=reason, category="budget")


FILTERS: tuple[Callable[[Pool, float, _Terms], Rejection | None], ...] = (
    _fits,
    _not_blocked,
    _within_price_cap,
    _in_time,
    _within_budget,
)


def _consider(pool: Pool, price: float, terms: _Terms, rejected: list[Rejection]) -> RankedPool | None:
    for check in FILTERS:
        rejection = check(pool, price, terms)
        if rejection is not None:
            rejected.append(rejection)
            return None
    return terms.costed(pool, price)


def _market_decision(
    terms: _Terms, spot: list[RankedPool], cheapest_on_demand: RankedPool | None, rejected: list[Rejection]
) -> tuple[MarketDecision, list[RankedPool]]:
    """Uniform Progress's market choice over the spot pools left (spotrelay.policy.market_choice), and the
    spot pools it keeps: for a job on on-demand behind the line, only those where a run pays for the switch."""
    request, spec = terms.request, terms.request.spec
    market_inputs: dict[str, Any] = {
        "total_work_hours": spec.work_hours,
        "work_done_hours": request.work_done_hours,
        "deadline_hours": spec.limits.deadline_hours,
        "elapsed_hours": request.elapsed_hours,
        "on_demand_run_hours": _on_demand_run_hours(
            terms.on_demand_types, terms.od_prices, terms.remaining_work_hours, terms.cap
        ),
        "restart_overhead_hours": terms.overhead,
        "spot_available": bool(spot),
        "on_demand_allowed": spec.limits.on_demand_fallback,
        "current": request.current_market,
        "returns_to_spot": request.migrates or request.current_market is Market.ON_DEMAND,
        "work_at_risk_hours": work_at_risk_hours(spec),
        "catch_up_band_share": CATCH_UP_BAND_SHARE,
        "out_of_patience": request.out_of_patience,
    }
    decision = uniform_progress(**market_inputs)
    on_demand_now = request.current_market is Market.ON_DEMAND
    if on_demand_now and decision.action is MarketAction.ON_DEMAND and spot and cheapest_on_demand:
        # Rule 3, refined: behind the line, back to spot only in the pools where a run pays for the switch.
        runs_of = request.spot_runs or {}
        paying = spot_runs_paying_off(spot, cheapest_on_demand, spec, terms.rates, terms.overhead, runs_of)
        refined = uniform_progress(**market_inputs, spot_run_pays_off=bool(paying))
        if refined.action is MarketAction.SPOT:
            decision = refined
            for r in spot:
                if r not in paying:
                    runs = runs_of.get(r.pool.offering, ())
                    why = (
                        f"its {len(runs)} interrupted run(s) here averaged {sum(runs) / len(runs) * 60:.0f} min"
                        if runs
                        else f"{terms.rates.hourly_rate(r.pool):.2f} interruptions/h expected here"
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
    if terms.deadline_lost:
        decision = decision.model_copy(
            update={"reason": f"the deadline can no longer be met: finish as soon as possible; {decision.reason}"}
        )
    return decision, spot


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


__all__ = [
    "DEADLINE_ROUNDING_HOURS",
    "DEFAULT_RESTART_OVERHEAD_HOURS",
    "FILTERS",
    "Placement",
    "PlacementRequest",
    "RankedPool",
    "Rejection",
    "latest_quotes",
    "place",
    "rank",
    "spot_run_hours",
    "spot_run_pays_off",
    "unit_cost",
    "work_at_risk_hours",
]
