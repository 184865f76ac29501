"""Admission: which queued jobs may start now, within max concurrency, spot vCPU quotas and the budget.

Pure. Jobs are considered highest priority first, then oldest first; a job that does not fit the
room left is held and the next one is considered (smaller jobs backfill behind a big one).

A queued job's demand is estimated from the cheapest (on-demand price) catalog type that fits it
within the allowed families: its vCPUs count against the spot vCPU quota of that type's quota group,
and its hourly cost against the budget at that on-demand price, or the job's price cap if lower. The
estimate is deliberately high for spot (spot usually costs far less), so the budget is never overrun.

Spot vCPU quotas are per quota group, as AWS sets them: "All G and VT Spot Instance Requests" and
"All P... Spot Instance Requests" (Service Quotas, EC2). A family belongs to the group whose key is
its longest prefix (`{"g": 64, "p": 96, "p5": 192}`: p5 -> "p5", p4d -> "p"); a family with no group
has no quota here.

An active job counts against the budget at the same estimate, or at what its live instances cost per hour
now if that is more (`live_usd_per_hour`, given by the dispatcher: spot at the price in effect now, the
latest quote of its pool; on-demand at its price): a job placed on a dearer type than the estimate's, moved
to on-demand, running a standby beside its instance, or on a pool whose spot price rose past the estimate
counts what it costs, so that a price rise holds the next job rather than overrun the budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from spotrelay.catalog import family_of
from spotrelay.models import Attempt, Job, JobSpec, Market
from spotrelay.models.billing import SeriesKey, series_key


class AdmissionLimits(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_concurrent_jobs: int
    budget_usd_per_hour: float
    spot_vcpu_quotas: Mapping[str, int]
    allowed_families: tuple[str, ...]


class Demand(BaseModel):
    model_config = ConfigDict(frozen=True)

    instance_type: str
    vcpus: int
    quota_group: str | None
    usd_per_hour: float


class Held(BaseModel):
    model_config = ConfigDict(frozen=True)

    job: Job
    reason: str


class AdmissionPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    admitted: tuple[Job, ...]
    held: tuple[Held, ...]
    impossible: tuple[Held, ...]  # no allowed family can ever run these: fail them


def quota_group(family: str, quotas: Mapping[str, int]) -> str | None:
    matches = [key for key in quotas if family.startswith(key)]
    return max(matches, key=len) if matches else None


def demand_of(spec: JobSpec, limits: AdmissionLimits) -> Demand | None:
    """The job's estimated demand, or None if no type of an allowed family fits it."""
    candidates = [
        t
        for t in spec.resources.fitting_types()
        if family_of(t.name) in limits.allowed_families and t.on_demand_usd_per_hour is not None
    ]
    if not candidates:
        return None
    cheapest = min(candidates, key=lambda t: (t.on_demand_usd_per_hour or 0.0, t.vcpus, t.name))
    price = cheapest.on_demand_usd_per_hour or 0.0
    cap = spec.limits.max_price_per_hour
    return Demand(
        instance_type=cheapest.name,
        vcpus=cheapest.vcpus,
        quota_group=quota_group(family_of(cheapest.name), limits.spot_vcpu_quotas),
        usd_per_hour=min(price, cap) if cap is not None else price,
    )


def admission_order(job: Job) -> tuple[int, datetime, str]:
    return (job.spec.priority.rank, job.submitted_at, job.job_id)


def live_usd_per_hour(attempts: Sequence[Attempt], spot_prices_now: Mapping[SeriesKey, float]) -> float:
    """What a job's live instances cost per hour now: each live attempt with an instance (the current one,
    and a standby beside it) at the spot price in effect now in its pool (`spot_prices_now`: series key ->
    the latest quote), or its launch price where none is known; on-demand at its price."""
    total = 0.0
    for attempt in attempts:
        if not attempt.is_live or attempt.instance_id is None:
            continue
        spot = attempt.pool.market is Market.SPOT
        total += spot_prices_now.get(series_key(attempt.pool), attempt.hourly_price) if spot else attempt.hourly_price
    return total


def admit(
    queued: Sequence[Job],
    active: Sequence[Job],
    limits: AdmissionLimits,
    live_spend: Mapping[str, float] | None = None,
) -> AdmissionPlan:
    """The plan: `queued` jobs admitted, held (and why) or impossible, with `active` jobs taking their room;
    `live_spend` (job id -> `live_usd_per_hour`, where known) counts an active job at more than its
    estimate when its instances cost more now."""
    used_vcpus: dict[str, int] = {}
    spend = 0.0
    running = len(active)
    for job in active:
        demand = demand_of(job.spec, limits)
        live = (live_spend or {}).get(job.job_id, 0.0)
        spend += max(demand.usd_per_hour if demand is not None else 0.0, live)
        if demand is not None and demand.quota_group is not None:
            used_vcpus[demand.quota_group] = used_vcpus.get(demand.quota_group, 0) + demand.vcpus

    admitted: list[Job] = []
    held: list[Held] = []
    impossible: list[Held] = []
    for job in sorted(queued, key=admission_order):
        demand = demand_of(job.spec, limits)
        never = _why_never(demand, limits)
        if never is not None:
            impossible.append(Held(job=job, reason=never))
            continue
        assert demand is not None  # _why_never says why when there is none
        reason = _no_room(demand, running, spend, used_vcpus, limits)
        if reason is not None:
            held.append(Held(job=job, reason=reason))
            continue
        admitted.append(job)
        running += 1
        spend += demand.usd_per_hour
        if demand.quota_group is not None:
            used_vcpus[demand.quota_group] = used_vcpus.get(demand.quota_group, 0) + demand.vcpus
    return AdmissionPlan(admitted=tuple(admitted), held=tuple(held), impossible=tuple(impossible))


def never_admitted(spec: JobSpec, limits: AdmissionLimits) -> str | None:
    """Why no room these limits could ever make admits the job (no type of an allowed family fits it, or
    it is bigger than the whole budget or quota), or None. The dispatcher fails such a job
    (Unschedulable); `spotrelay submit` refuses it before sending."""
    return _why_never(demand_of(spec, limits), limits)


def _why_never(demand: Demand | None, limits: AdmissionLimits) -> str | None:
    if demand is None:
        return f"no instance type of the allowed GPU families ({', '.join(limits.allowed_families)}) fits resources"
    return _never_fits(demand, limits)


def _never_fits(demand: Demand, limits: AdmissionLimits) -> str | None:
    """A job bigger than the whole budget or the whole quota would wait forever: say so instead."""
    if demand.usd_per_hour > limits.budget_usd_per_hour:
        return (
            f"its cheapest fitting type ({demand.instance_type}) costs ${demand.usd_per_hour:.2f}/h, "
            f"more than the whole budget of ${limits.budget_usd_per_hour:g}/h"
        )
    group = demand.quota_group
    if group is not None and demand.vcpus > limits.spot_vcpu_quotas[group]:
        return (
            f"its smallest fitting type ({demand.instance_type}) has {demand.vcpus} vCPUs, more than the "
            f"whole spot vCPU quota '{group}' of {limits.spot_vcpu_quotas[group]}"
        )
    return None


def _no_room(
    demand: Demand, running: int, spend: float, used_vcpus: Mapping[str, int], limits: AdmissionLimits
) -> str | None:
    if running >= limits.max_concurrent_jobs:
        return f"max_concurrent_jobs {limits.max_concurrent_jobs} reached"
    if spend + demand.usd_per_hour > limits.budget_usd_per_hour:
        return (
            f"budget: ${spend:.2f}/h in use + ${demand.usd_per_hour:.2f}/h for this job "
            f"> ${limits.budget_usd_per_hour:g}/h"
        )
    group = demand.quota_group
    if group is not None:
        quota = limits.spot_vcpu_quotas[group]
        in_use = used_vcpus.get(group, 0)
        if in_use + demand.vcpus > quota:
            return f"spot vCPU quota '{group}': {in_use} in use + {demand.vcpus} > {quota}"
    return None
