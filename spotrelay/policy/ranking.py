"""What `place()` answers (spotrelay.policy.placement): the ranked pools, the rejected candidates with
their reasons, the market decision, and the lines `spotrelay place --explain` and `status` print of them."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from spotrelay.catalog import INSTANCE_TYPES, REFERENCE_GPU
from spotrelay.models import Objective, Pool
from spotrelay.policy.market_choice import MarketDecision


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
