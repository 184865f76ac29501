"""The standard workloads and their jobs:

- `cant-be-late`: the paper's setting (Wu et al., "Can't Be Late: Optimizing Spot Instance Savings
  under Deadlines", NSDI'24): a 48 h job on p3.2xlarge (V100, relative speed 1), deadlines 52 h and
  70 h, restart overheads 0.05 h and 0.2 h, spot $0.97/h and on-demand $3.06/h (the paper's figures,
  always, whatever `--prices` says), started every 24 h over the p3.2xlarge traces; single-zone, as in
  the paper: each zone is its own market, every zone x setting x start offset is one job.
- `cant-be-late-multi`: the same jobs with every traced zone open to every policy.
- `fleet`: `FLEET_JOBS` jobs, seeded, on every traced pool of the `--traces` directories priced by
  `--prices` (see `fleet`'s docstring for the generator).

A workload of a YAML file is spotrelay.bench.workloads.workload_file; the overview of the workloads is
spotrelay.bench.workloads.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from spotrelay.bench.sim import BenchJob
from spotrelay.bench.workloads.common import (
    FLEET_JOBS,
    PAPER_DEADLINES_HOURS,
    PAPER_INSTANCE_TYPE,
    PAPER_ON_DEMAND_PRICE,
    PAPER_RESTART_OVERHEADS_HOURS,
    PAPER_SPOT_PRICE,
    PAPER_WORK_HOURS,
    START_EVERY_HOURS,
    UNLIMITED_INTERRUPTIONS,
    Workload,
    WorkloadError,
)
from spotrelay.bench.workloads.inputs import BenchInputs
from spotrelay.bench.workloads.traced_market import build_market, market_span, on_demand_price
from spotrelay.catalog import INSTANCE_TYPES, family_of
from spotrelay.models import JobSpec, RecoveryStrategyName
from spotrelay.models.job_spec import DEFAULT_RESTART_OVERHEAD_MINUTES


def job_spec(
    name: str,
    *,
    gpus: int,
    work_hours: float,
    deadline_hours: float,
    gpu_models: Sequence[str] | None = None,
    recovery: RecoveryStrategyName = RecoveryStrategyName.EAGER_NEXT_POOL,
    checkpoint_interval_minutes: float = 15,
    max_interruptions: int = UNLIMITED_INTERRUPTIONS,
    restart_overhead_hours: float = DEFAULT_RESTART_OVERHEAD_MINUTES / 60,
    saves_at_notice: bool = True,
) -> JobSpec:
    """A bench job's spec; `restart_overhead_hours` is the job's real d, which the spec tells `place()`;
    a job that does not save at the notice (`saves_at_notice` False: it checkpoints only periodically)
    says so as a user would, with no grace to save (`checkpoint.grace_seconds: 0`), which `place()` reads
    as a checkpoint interval of work at risk."""
    resources: dict[str, Any] = {"gpus": gpus}
    if gpu_models is not None:
        resources["gpu_models"] = list(gpu_models)
    return JobSpec.model_validate(
        {
            "name": name,
            "run": {"command": "train"},
            "resources": resources,
            "work_hours": work_hours,
            "checkpoint": {
                "interval_minutes": checkpoint_interval_minutes,
                **({} if saves_at_notice else {"grace_seconds": 0}),
            },
            "limits": {"deadline_hours": deadline_hours, "max_interruptions": max_interruptions},
            "recovery": {"strategy": recovery},
            "placement": {"restart_overhead_minutes": restart_overhead_hours * 60},
        }
    )


def fitting_types(spec: JobSpec, allowed: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(name for name in allowed if spec.resources.misfit(INSTANCE_TYPES[name]) is None))


def cant_be_late(inputs: BenchInputs, *, multi_zone: bool = False) -> Workload:
    """The paper's setting (module docstring); `multi_zone`: every zone open to every job."""
    pools = [p for p in inputs.traces if p.instance_type == PAPER_INSTANCE_TYPE]
    if not pools:
        raise WorkloadError(
            f"cant-be-late replays {PAPER_INSTANCE_TYPE} availability (label v100_1); no such trace in --traces"
        )
    market, notes = build_market(pools, inputs, spot_prices={PAPER_INSTANCE_TYPE: PAPER_SPOT_PRICE})
    horizon = min(p.trace.duration_hours for p in pools)
    last_start = horizon - max(PAPER_DEADLINES_HOURS)
    if last_start < 0:
        raise WorkloadError(f"the traces span {horizon:.1f} h, less than the {max(PAPER_DEADLINES_HOURS):g} h deadline")
    offsets = [k * START_EVERY_HOURS for k in range(int(last_start // START_EVERY_HOURS) + 1)]
    zones = sorted({p.zone for p in pools})
    zone_sets = [tuple(zones)] if multi_zone else [(z,) for z in zones]
    on_demand = {PAPER_INSTANCE_TYPE: PAPER_ON_DEMAND_PRICE}
    jobs = []
    for zone_set in zone_sets:
        where = "all" if multi_zone else zone_set[0]
        for deadline in PAPER_DEADLINES_HOURS:
            for overhead in PAPER_RESTART_OVERHEADS_HOURS:
                for offset in offsets:
                    name = f"cbl-{where}-D{deadline:g}-d{overhead:g}-t{offset:g}"
                    spec = job_spec(
                        name,
                        gpus=1,
                        gpu_models=["V100"],
                        work_hours=PAPER_WORK_HOURS,
                        deadline_hours=deadline,
                        restart_overhead_hours=overhead,
                    )
                    jobs.append(
                        BenchJob(
                            name=name,
                            spec=spec,
                            submit_hours=offset,
                            restart_overhead_hours=overhead,
                            zones=zone_set,
                            instance_types=(PAPER_INSTANCE_TYPE,),
                            on_demand_prices=on_demand,
                            group=f"D={deadline:g}h d={overhead:g}h",
                        )
                    )
    setting = f"{len(zones)} zones, every policy sees all" if multi_zone else f"single-zone, {len(zones)} zones"
    description = (
        f"Can't Be Late (NSDI'24) setting, {setting}: a {PAPER_WORK_HOURS:g} h job on {PAPER_INSTANCE_TYPE}, "
        f"deadlines {'/'.join(f'{d:g}' for d in PAPER_DEADLINES_HOURS)} h, restart overheads "
        f"{'/'.join(f'{d:g}' for d in PAPER_RESTART_OVERHEADS_HOURS)} h, spot ${PAPER_SPOT_PRICE}/h vs on-demand "
        f"${PAPER_ON_DEMAND_PRICE}/h, {len(offsets)} starts every {START_EVERY_HOURS:g} h over {horizon:.0f} h "
        f"of traces: {len(jobs)} jobs"
    )
    return Workload(
        "cant-be-late-multi" if multi_zone else "cant-be-late", description, market, tuple(jobs), tuple(notes)
    )


FLEET_GPU_MIX = ((1, 0.6), (4, 0.15), (8, 0.25))
FLEET_WORK_HOURS = (2.0, 48.0)  # log-uniform
FLEET_DEADLINE_FACTOR = (1.1, 2.5)  # deadline = work x factor (at least work + 4 restarts)
FLEET_RESTART_OVERHEADS = (0.05, 0.1, 0.2)
FLEET_SAME_POOL_FIRST = 0.25
FLEET_PERIODIC_ONLY = 0.2  # jobs that checkpoint only periodically (no final checkpoint at the notice)
FLEET_CHECKPOINT_MINUTES = (15.0, 30.0, 60.0)


def fleet(inputs: BenchInputs, *, seed: int = 1, count: int = FLEET_JOBS) -> Workload:
    """`count` independent jobs (no shared capacity: each sees the whole market), drawn with `seed`:

    - GPUs: 1 (60%), 4 (15%) or 8 (25%), among the counts some traced type can hold; any type of the
      traced families that fits may take the job (a 4-GPU job fits p3.8xlarge on-demand and
      p3.16xlarge spot);
    - work: log-uniform in 2..48 reference-GPU hours; deadline: work x uniform(1.1, 2.5), at least
      work + 4 restart overheads; restart overhead 0.05, 0.1 or 0.2 h;
    - recovery: eager-next-pool (75%) or same-pool-first (25%); 20% of the jobs checkpoint only
      periodically (every 15, 30 or 60 min) and lose the work since, the rest also at the notice;
    - submitted uniformly over the span every trace and the prices cover, less the longest deadline;
    - every zone of the market open to every job; on-demand prices from the catalog.
    """
    market, notes = build_market(inputs.traces, inputs)
    pools = market.pools()
    traced = {(p.instance_type, p.zone): p for p in inputs.traces}
    span = market_span((traced[(p.instance_type, p.availability_zone)] for p in pools), inputs.prices)
    horizon = span.hours
    families = {family_of(p.instance_type) for p in pools}
    allowed = sorted(
        name
        for name, t in INSTANCE_TYPES.items()
        if family_of(name) in families and t.on_demand_usd_per_hour is not None
    )
    spot_gpus = max(INSTANCE_TYPES[p.instance_type].gpu_count for p in pools)
    mix = [(g, w) for g, w in FLEET_GPU_MIX if g <= spot_gpus] or [(1, 1.0)]
    longest = FLEET_WORK_HOURS[1] * FLEET_DEADLINE_FACTOR[1]
    if horizon < longest:
        raise WorkloadError(f"fleet needs traces and prices spanning {longest:g} h; {span}")
    zones = tuple(market.zones())
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        gpus = rng.choices([g for g, _ in mix], weights=[w for _, w in mix])[0]
        low, high = FLEET_WORK_HOURS
        work = round(math.exp(rng.uniform(math.log(low), math.log(high))), 2)
        overhead = rng.choice(FLEET_RESTART_OVERHEADS)
        deadline = round(max(work * rng.uniform(*FLEET_DEADLINE_FACTOR), work + 4 * overhead), 2)
        recovery = (
            RecoveryStrategyName.SAME_POOL_FIRST
            if rng.random() < FLEET_SAME_POOL_FIRST
            else RecoveryStrategyName.EAGER_NEXT_POOL
        )
        periodic_only = rng.random() < FLEET_PERIODIC_ONLY
        interval = rng.choice(FLEET_CHECKPOINT_MINUTES) if periodic_only else 15.0
        submit = round(rng.uniform(0, horizon - longest), 3)
        name = f"fleet-{i:04d}"
        spec = job_spec(
            name,
            gpus=gpus,
            work_hours=work,
            deadline_hours=deadline,
            recovery=recovery,
            checkpoint_interval_minutes=interval,
            restart_overhead_hours=overhead,
            saves_at_notice=not periodic_only,
        )
        types = fitting_types(spec, allowed)
        jobs.append(
            BenchJob(
                name=name,
                spec=spec,
                submit_hours=submit,
                restart_overhead_hours=overhead,
                zones=zones,
                instance_types=types,
                on_demand_prices={t: p for t in types if (p := on_demand_price(t)) is not None},
                checkpoint_on_notice=not periodic_only,
                group=f"{gpus} GPU",
            )
        )
    price_source = inputs.prices.source if inputs.prices is not None else "on-demand x Advisor-style savings"
    drawn = sorted({job.spec.resources.gpus for job in jobs}) or [g for g, _ in mix]
    gpu_counts = (
        f"GPUs {'/'.join(map(str, drawn))}" if len(drawn) > 1 else f"{drawn[0]} GPU{'s' * (drawn[0] > 1)} per job"
    )
    if len(mix) < len(FLEET_GPU_MIX):
        gpu_counts += f" (no traced spot type has more than {spot_gpus})"
    description = (
        f"{count} jobs (seed {seed}) over {len(pools)} spot pools ({', '.join(sorted(families))} in "
        f"{len(zones)} zones), prices from {price_source}; {gpu_counts}, work 2-48 h, deadlines 1.1-2.5x work"
    )
    return Workload("fleet", description, market, tuple(jobs), tuple(notes))
