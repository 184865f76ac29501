"""Workloads: the jobs a benchmark replays, and the market they run on.

Inputs (`BenchInputs`): availability traces (`--traces DIR`, repeatable: one `<zone>_<label>.json` per
pool, the Can't Be Late spot-traces format), optionally a price file (`--prices`: a training-on-a-dime
price history, or a PRICES.csv of `spotrelay place`) and a Spot Instance Advisor CSV (`--advisor`).

A trace's instance type comes from its label: `v100_1` is the catalog type with one V100 (p3.2xlarge),
`v100_8` the one with eight (p3.16xlarge); a label that is a catalog type name is that type. Traces of
types the catalog does not hold (K80 `k80_*`, CPU `intel_64`) are skipped with a note. When several
directories hold the same (type, zone) pool, the first directory given wins.

Prices of spot pools: a price history is replayed from the market's start (its time 0 is the latest
first row among the pools kept, so every pool has a price from time 0; the history's dates are not
the traces' dates: each pool's capacity and price are real, their alignment in time is ours); a
PRICES.csv gives constant prices (its timestamped rows become steps, its earliest timestamp at time 0).
With a price file, traced pools it has no price for are left out. Without one, a pool's spot price is
its on-demand price (catalog) times (1 - the Advisor's savings for its type and region) with
`--advisor`, else times 0.97 / 3.06 (the Can't Be Late paper's p3.2xlarge figures: 68% savings, in
the 66-86% the Advisor gives p3 types in us-east/us-west in its 2025-06 snapshot).

Workloads:
- `cant-be-late`: the paper's setting (Wu et al., "Can't Be Late: Optimizing Spot Instance Savings
  under Deadlines", NSDI'24): a 48 h job on p3.2xlarge (V100, relative speed 1), deadlines 52 h and
  70 h, restart overheads 0.05 h and 0.2 h, spot $0.97/h and on-demand $3.06/h (the paper's figures,
  always, whatever `--prices` says), started every 24 h over the p3.2xlarge traces; single-zone, as in
  the paper: each zone is its own market, every zone x setting x start offset is one job.
- `cant-be-late-multi`: the same jobs with every traced zone open to every policy.
- `fleet`: `FLEET_JOBS` jobs, seeded, on every traced pool of the `--traces` directories priced by
  `--prices` (see `fleet`'s docstring for the generator).
- a YAML file: see `load_workload_file`.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotrelay.bench.sim import BenchJob
from spotrelay.catalog import INSTANCE_TYPES, family_of, relative_speed
from spotrelay.field_problems import (
    PROBLEMS_SHOWN,
    Loc,
    SpecFieldError,
    and_more,
    field_path,
    field_problem,
    field_problems,
    one_line,
    shown,
    unknown_key,
)
from spotrelay.market import (
    AvailabilityTrace,
    MarketBuilder,
    PriceFileError,
    SpotMarket,
    TraceFileError,
    load_advisor_bands,
    load_price_history,
    load_price_rows,
    load_trace_dir,
    parse_duration,
)
from spotrelay.models import JobSpec, JobSpecError, PriceQuote, RecoveryStrategyName, parse_job_spec
from spotrelay.models.job_spec import (
    DEFAULT_RESTART_OVERHEAD_MINUTES,
    JOB_SPEC_LIMITS,
    decode_document,
    read_document,
)

# The Can't Be Late paper's setting (NSDI'24, §6): p3.2xlarge, 48 h of work, two deadlines, two
# restart overheads, its spot and on-demand prices.
PAPER_INSTANCE_TYPE = "p3.2xlarge"
PAPER_SPOT_PRICE = 0.97
PAPER_ON_DEMAND_PRICE = 3.06
PAPER_WORK_HOURS = 48.0
PAPER_DEADLINES_HOURS = (52.0, 70.0)
PAPER_RESTART_OVERHEADS_HOURS = (0.05, 0.2)
START_EVERY_HOURS = 24.0
DEFAULT_SPOT_FRACTION = PAPER_SPOT_PRICE / PAPER_ON_DEMAND_PRICE
# The paper's jobs never give up on interruptions; the spec's default (20) would fail some.
UNLIMITED_INTERRUPTIONS = 10_000

FLEET_JOBS = 300
STANDARD_WORKLOADS = ("cant-be-late", "cant-be-late-multi", "fleet")

# The market's clock starts here; only differences of times matter (traces give dates only).
MARKET_START = datetime(2023, 1, 1, tzinfo=UTC)


class WorkloadError(ValueError):
    """A workload we cannot build; the message says which input and why."""


@dataclass(frozen=True, slots=True)
class TracedPool:
    instance_type: str
    trace: AvailabilityTrace

    @property
    def zone(self) -> str:
        return self.trace.zone


@dataclass(frozen=True)
class PriceTable:
    """Spot prices from `--prices`: a price history (timestamped price changes) or a PRICES.csv."""

    source: str
    history: bool
    quotes: tuple[PriceQuote, ...]

    def pools(self) -> set[tuple[str, str]]:
        return {(q.pool.instance_type, q.pool.availability_zone) for q in self.quotes}

    def apply(self, builder: MarketBuilder, pools: set[tuple[str, str]]) -> None:
        kept = [q for q in self.quotes if (q.pool.instance_type, q.pool.availability_zone) in pools]
        untimed = [q for q in kept if q.timestamp is None]
        timed = [q for q in kept if q.timestamp is not None]
        builder.add_quotes(untimed)
        if not timed:
            return
        firsts: dict[tuple[str, str], datetime] = {}
        for q in timed:
            assert q.timestamp is not None
            key = (q.pool.instance_type, q.pool.availability_zone)
            firsts[key] = min(firsts.get(key, q.timestamp), q.timestamp)
        anchor = max(firsts.values()) if self.history else min(firsts.values())
        builder.add_price_history(timed, start_at=anchor)

    def horizon_hours(self) -> float:
        """How far the prices reach: a history to its last change (past it a price would be made up); a
        PRICES.csv snapshot for ever (its prices are constant after its last row: the module docstring)."""
        stamps = [q.timestamp for q in self.quotes if q.timestamp is not None]
        if not stamps or not self.history:
            return math.inf
        return (max(stamps) - min(stamps)).total_seconds() / 3600


@dataclass(frozen=True)
class Advisor:
    """Spot Instance Advisor figures: interruption bands (for one region) and savings per region."""

    source: str
    region: str
    bands: Mapping[str, int]
    savings_pct: Mapping[tuple[str, str], float]  # (region, instance type) -> savings vs on-demand, %


@dataclass(frozen=True)
class BenchInputs:
    traces: tuple[TracedPool, ...]
    prices: PriceTable | None = None
    advisor: Advisor | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    market: SpotMarket
    jobs: tuple[BenchJob, ...]
    notes: tuple[str, ...] = field(default=())


# ------------------------------------------------------------------------------------------ inputs


def instance_type_for_label(label: str) -> str | None:
    """`v100_1` -> p3.2xlarge (the cheapest catalog type with one V100); `p3.2xlarge` -> itself."""
    if label in INSTANCE_TYPES:
        return label
    match = re.fullmatch(r"([A-Za-z0-9-]+)_(\d+)", label)
    if match is None:
        return None
    gpu, count = match.group(1).lower(), int(match.group(2))
    fitting = [
        t
        for t in INSTANCE_TYPES.values()
        if t.gpu_model.lower() == gpu and t.gpu_count == count and t.on_demand_usd_per_hour is not None
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda t: (t.on_demand_usd_per_hour or math.inf, t.name)).name


def load_traces(dirs: Sequence[str | Path]) -> tuple[tuple[TracedPool, ...], tuple[str, ...]]:
    """The traced pools of `dirs` (see the module docstring), and notes on what was skipped."""
    pools: dict[tuple[str, str], TracedPool] = {}
    notes: list[str] = []
    for directory in dirs:
        try:
            traces = load_trace_dir(directory)
        except TraceFileError as e:
            raise WorkloadError(str(e)) from None
        for trace in traces:
            instance_type = instance_type_for_label(trace.label)
            if instance_type is None:
                notes.append(f"skipped {trace.source}: label {trace.label!r} names no GPU type in the catalog")
                continue
            key = (instance_type, trace.zone)
            if key in pools:
                notes.append(f"skipped {trace.source}: {instance_type} in {trace.zone} already traced")
                continue
            pools[key] = TracedPool(instance_type, trace)
    if not pools:
        raise WorkloadError(f"no usable availability trace in {', '.join(map(str, dirs))}")
    return tuple(sorted(pools.values(), key=lambda p: (p.instance_type, p.zone))), tuple(notes)


def load_price_table(path: str | Path) -> PriceTable:
    """A training-on-a-dime price history (header with `timestamp_utc`) or a PRICES.csv."""
    path = Path(path)
    try:
        header = path.read_text().lstrip("\ufeff").split("\n", 1)[0]
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    history = "timestamp_utc" in [c.strip() for c in header.split(",")]
    try:
        quotes = load_price_history(path) if history else load_price_rows(path)
    except PriceFileError as e:
        raise WorkloadError(str(e)) from None
    return PriceTable(str(path), history, tuple(quotes))


def load_advisor(path: str | Path, region: str) -> Advisor:
    path = Path(path)
    try:
        bands = load_advisor_bands(path, region)
        rows = list(csv.DictReader(io.StringIO(path.read_text())))
    except PriceFileError as e:
        raise WorkloadError(str(e)) from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}") from None
    savings: dict[tuple[str, str], float] = {}
    for line, row in enumerate(rows, start=2):
        raw = (row.get("savings_pct_vs_ondemand") or "").strip()
        if not raw:
            continue
        try:
            savings[(row.get("region", ""), row.get("instance_type", ""))] = float(raw)
        except ValueError:
            raise WorkloadError(f"{path}: line {line}: savings_pct_vs_ondemand {raw!r} is not a number") from None
    return Advisor(str(path), region, bands, savings)


def load_inputs(
    trace_dirs: Sequence[str | Path],
    prices: str | Path | None = None,
    advisor: str | Path | None = None,
    region: str = "us-east-1",
) -> BenchInputs:
    traces, notes = load_traces(trace_dirs)
    return BenchInputs(
        traces=traces,
        prices=load_price_table(prices) if prices is not None else None,
        advisor=load_advisor(advisor, region) if advisor is not None else None,
        notes=notes,
    )


def region_of(zone: str) -> str:
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def on_demand_price(instance_type: str) -> float | None:
    itype = INSTANCE_TYPES.get(instance_type)
    return None if itype is None else itype.on_demand_usd_per_hour


def fallback_spot_price(instance_type: str, zone: str, advisor: Advisor | None) -> float | None:
    """On-demand x (1 - the Advisor's savings), or x 0.97/3.06 without the Advisor (module docstring)."""
    od = on_demand_price(instance_type)
    if od is None:
        return None
    if advisor is not None:
        pct = advisor.savings_pct.get((region_of(zone), instance_type))
        if pct is not None:
            return od * (1 - pct / 100)
    return od * DEFAULT_SPOT_FRACTION


def build_market(
    pools: Iterable[TracedPool],
    inputs: BenchInputs,
    *,
    spot_prices: Mapping[str, float] | None = None,
) -> tuple[SpotMarket, list[str]]:
    """A market of `pools`: their traces for capacity; prices from `spot_prices` (constant per type,
    for every pool of that type) if given, else from the price file, else the fallback."""
    pools = list(pools)
    notes: list[str] = []
    builder = MarketBuilder(MARKET_START)
    priced: set[tuple[str, str]] = set()
    if spot_prices is not None:
        kept = [p for p in pools if p.instance_type in spot_prices]
        for p in kept:
            builder.add_price(p.instance_type, p.zone, spot_prices[p.instance_type])
    elif inputs.prices is not None:
        have = inputs.prices.pools()
        kept = [p for p in pools if (p.instance_type, p.zone) in have]
        dropped = [f"{p.instance_type}:{p.zone}" for p in pools if (p.instance_type, p.zone) not in have]
        if dropped:
            notes.append(f"left out (no price in {inputs.prices.source}): {', '.join(dropped)}")
        priced = {(p.instance_type, p.zone) for p in kept}
        if priced:
            inputs.prices.apply(builder, priced)
    else:
        kept = []
        for p in pools:
            price = fallback_spot_price(p.instance_type, p.zone, inputs.advisor)
            if price is not None:
                builder.add_price(p.instance_type, p.zone, price)
                kept.append(p)
    if not kept:
        raise WorkloadError("no traced pool has a spot price")
    for p in kept:
        builder.add_trace(p.trace, p.instance_type)
    return builder.build(), notes


@dataclass(frozen=True, slots=True)
class Span:
    """How long the inputs of a market reach from its start, and which input ends first."""

    hours: float
    limited_by: str  # e.g. "the trace DIR/us-west-2a_v100_1.json", "the prices in FILE (timestamps ...)"
    inputs: str  # what spans it: "traces", or "traces and prices"

    def __str__(self) -> str:
        return f"the {self.inputs} span {self.hours:.1f} h, limited by {self.limited_by}"


def market_span(pools: Iterable[TracedPool], prices: PriceTable | None) -> Span:
    """The span every trace of `pools` covers, and `prices` (the price file the market's prices come from,
    if any; its timestamps' span, as `PriceTable.horizon_hours`) too."""
    pools = list(pools)
    shortest = min(pools, key=lambda p: p.trace.duration_hours)
    span = Span(
        shortest.trace.duration_hours,
        f"the trace {shortest.trace.source or shortest.zone}",
        "traces" if prices is None else "traces and prices",
    )
    if prices is None or prices.horizon_hours() >= span.hours:
        return span
    stamps = [q.timestamp for q in prices.quotes if q.timestamp is not None]
    first, last = min(stamps), max(stamps)
    return Span(
        prices.horizon_hours(),
        f"the prices in {prices.source} (its timestamps run from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC)",
        span.inputs,
    )


# ------------------------------------------------------------------------------------------- jobs


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


# -------------------------------------------------------------------------------------- YAML files


class _Repeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1, le=100_000)
    every: float = 24.0

    @field_validator("every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float:
        return parse_duration(value)


class _JobEntry(BaseModel):
    """One job of a workload file: the bench's keys, and the rest is a job spec."""

    model_config = ConfigDict(extra="allow")

    submit: float = 0.0
    restart_overhead: float | None = None  # None: the spec's placement.restart_overhead_minutes
    checkpoint_on_notice: bool = True
    zones: tuple[str, ...] | None = None
    per_zone: bool = False
    repeat: _Repeat | None = None

    @field_validator("submit", "restart_overhead", mode="before")
    @classmethod
    def _duration(cls, value: object) -> float | None:
        return None if value is None else parse_duration(value)


def _price(value: object, below: Loc, *, zero_allowed: bool) -> float:
    """USD per hour: a finite number, >= 0 (spot: the market takes a free pool) or > 0 (on-demand)."""
    allowed = ">= 0" if zero_allowed else "> 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_allowed)
    ):
        raise SpecFieldError(below, f"{shown(value)} is not a price; allowed: USD per hour, a number {allowed}")
    return float(value)


def _prices_by_type(value: object, *, zero_allowed: bool) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"expected {{instance type: USD per hour}}, got {shown(value)}")
    for name in value:
        if name not in INSTANCE_TYPES:
            raise SpecFieldError((name,), "not an instance type in the catalog")
    return {name: _price(price, (name,), zero_allowed=zero_allowed) for name, price in value.items()}


class _WorkloadFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str = ""
    instance_types: tuple[str, ...] | None = None
    zones: tuple[str, ...] | None = None
    spot_price_usd_per_hour: float | dict[str, float] | None = None
    on_demand_usd_per_hour: dict[str, float] = Field(default_factory=dict)
    jobs: list[_JobEntry] = Field(min_length=1)

    @field_validator("spot_price_usd_per_hour", mode="before")
    @classmethod
    def _spot_prices(cls, value: object) -> float | dict[str, float] | None:
        """One price for every traced type, or one per type (the market takes >= 0: the builder's rule)."""
        if value is None or isinstance(value, dict):
            return None if value is None else _prices_by_type(value, zero_allowed=True)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _price(value, (), zero_allowed=True)
        raise ValueError(f"{shown(value)} is not a price; allowed: a number >= 0, or {{instance type: number}}")

    @field_validator("on_demand_usd_per_hour", mode="before")
    @classmethod
    def _on_demand_prices(cls, value: object) -> dict[str, float]:
        """> 0: a type priced 0 would be left out of the jobs' on-demand choices (as one with no price)."""
        return _prices_by_type(value, zero_allowed=False)


# A workload file is read as a job file is (spotrelay.models.job_spec): bounded before and while it is parsed
WORKLOAD_LIMITS = replace(JOB_SPEC_LIMITS, what="a workload")

# A job entry's own keys: the bench's (`_JobEntry`) next to the job spec's.
SPEC_KEYS = tuple(JobSpec.model_fields)
BENCH_KEYS = tuple(_JobEntry.model_fields)


def _entry_label(index: int, entry: object) -> str:
    """`jobs[0] (train-a)`: the entry's place in the file, and its name if it has one."""
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"jobs[{index}] ({name})" if isinstance(name, str) and name else f"jobs[{index}]"


# A job entry's keys, as an unknown one's message lists them.
ENTRY_KEYS = f"{', '.join(SPEC_KEYS)} (the job spec), {', '.join(BENCH_KEYS)} (the bench)"


def _file_problem(err: Mapping[str, Any], document: object) -> str:
    """One pydantic error of a workload file as `where: what is wrong and what is allowed`; a job entry's
    error as `jobs[0] (name): field: ...`, as the job spec's own errors read."""
    loc = err["loc"]
    if not (len(loc) >= 2 and loc[0] == "jobs" and isinstance(loc[1], int)):
        return field_problem(err, model=_WorkloadFile, show_input=True)
    entries = document.get("jobs") if isinstance(document, dict) else None
    entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
    label, within = _entry_label(loc[1], entry), loc[2:]
    if not within and err["type"] in {"model_type", "model_attributes_type"}:
        return f"{label}: expected a mapping of keys ({ENTRY_KEYS}), got {type(err['input']).__name__}"
    return f"{label}: {field_problem({**err, 'loc': within}, model=_JobEntry, show_input=True)}"


def _entry_spec(index: int, entry: _JobEntry) -> tuple[JobSpec | None, list[str]]:
    """The job spec of a workload file's entry, validated as `spotrelay submit` validates one (the submission
    rules too: `parse_job_spec`), or its problems."""
    raw = dict(entry.model_extra or {})
    label = _entry_label(index, raw)
    problems = [
        one_line(f"{label}: {field_path((key,))}: {unknown_key(key, [*SPEC_KEYS, *BENCH_KEYS], ENTRY_KEYS)}")
        for key in raw
        if key not in SPEC_KEYS
    ]
    raw = {key: value for key, value in raw.items() if key in SPEC_KEYS}
    raw.setdefault("run", {"command": "bench"})
    placement = raw.get("placement")
    if entry.restart_overhead is not None and (placement is None or isinstance(placement, dict)):
        # The job's real d goes into its spec, as a user would write it, unless the spec says otherwise.
        raw["placement"] = {"restart_overhead_minutes": entry.restart_overhead * 60, **(placement or {})}
    checkpoint = raw.get("checkpoint")
    if not entry.checkpoint_on_notice and (checkpoint is None or isinstance(checkpoint, dict)):
        # A job that does not save at the notice has no use for grace to save: its spec says so, which is
        # how place() learns that a preemption may lose a checkpoint interval (unless the spec says otherwise).
        raw["checkpoint"] = {"grace_seconds": 0, **(checkpoint or {})}
    try:
        spec = parse_job_spec(raw, label)
    except JobSpecError as e:
        return None, problems + [f"{label}: {problem}" for problem in e.problems]
    return (spec, []) if not problems else (None, problems)


def _traced_summary(pools: Iterable[TracedPool]) -> str:
    """`p3.16xlarge in us-west-2a, us-west-2b; p3.2xlarge in us-west-2a`: the traced pools, by type."""
    zones_of: dict[str, list[str]] = {}
    for p in pools:
        zones_of.setdefault(p.instance_type, []).append(p.zone)
    return "; ".join(f"{name} in {', '.join(sorted(zones))}" for name, zones in sorted(zones_of.items()))


def _deadline_problem(spec: JobSpec, types: Sequence[str], overhead: float) -> str | None:
    """`spotrelay submit` checks the deadline against the fastest GPU of the whole catalog; here the job may
    use `types` only, and pays its restart overhead before it makes progress: a deadline shorter than that
    is missed by every policy, the omniscient one too."""
    work, deadline = spec.work_hours, spec.limits.deadline_hours
    assert work is not None  # checked by the caller
    assert deadline is not None
    fastest = max(types, key=lambda t: (relative_speed(INSTANCE_TYPES[t]), t))
    shortest = work / relative_speed(INSTANCE_TYPES[fastest]) + overhead
    if deadline >= shortest:
        return None
    return (
        f"limits.deadline_hours: {deadline:g} h is shorter than the work: work_hours {work:g} and the {overhead:g} h "
        f"restart overhead of its first start take at least {shortest:.2f} h on {INSTANCE_TYPES[fastest].gpu_model}, "
        f"the fastest GPU of the types this workload lets the job use ({', '.join(types)}); allow more time or "
        f"less work, or faster types in instance_types"
    )


def _span_problem(entry: _JobEntry, spec: JobSpec, span: Span) -> str | None:
    """Why the entry's copies do not fit in the traces (and price history), if they do not.

    A job submitted at or after the end has no market at all. One whose deadline ends after it is refused
    too, not noted: past its last tick a trace's last value holds (`MarketBuilder.add_trace`), so the replay
    would run the job on capacity nobody observed, and its cost and misses would say nothing about spot.
    cant-be-late and fleet draw their starts so that every deadline ends within the traces; a file's jobs
    are held to the same rule."""
    deadline = spec.limits.deadline_hours
    assert deadline is not None
    end = span.hours + 1e-9  # a deadline may fall at the end itself, a submission may not
    copies = entry.repeat.count if entry.repeat is not None else 1
    every = entry.repeat.every if entry.repeat is not None else 0.0
    if entry.submit >= span.hours - 1e-9:
        return f"submit: {entry.submit:g} h is not before the end of the market: {span}"
    if entry.submit + deadline > end:
        return (
            f"limits.deadline_hours: the deadline falls at {entry.submit + deadline:g} h (submit {entry.submit:g} h "
            f"+ {deadline:g} h), after the end of the market: {span}; past it the replay would make up "
            f"capacity: submit by {span.hours - deadline:.1f} h or shorten the deadline"
        )
    last = entry.submit + (copies - 1) * every
    if last + deadline > end:
        fitting = math.floor((span.hours - deadline - entry.submit) / every + 1e-9) + 1
        return (
            f"repeat: copy {copies} is submitted at {last:g} h and its deadline falls at {last + deadline:g} h, "
            f"after the end of the market: {span}; at most {fitting} copies every {every:g} h fit"
        )
    return None


def load_workload_file(path: str | Path, inputs: BenchInputs) -> Workload:
    """A workload from YAML (or JSON):

    ```yaml
    name: nightly-training            # default: the file name
    description: what it is
    instance_types: [p3.2xlarge]      # the types jobs may use (default: every traced type's family)
    zones: [us-east-1c, us-west-2a]   # the traced zones to use (default: all)
    spot_price_usd_per_hour: 0.97     # or {p3.2xlarge: 0.97}: constant spot prices (>= 0) instead of --prices
    on_demand_usd_per_hour: {p3.2xlarge: 3.06}   # overrides (> 0) of the catalog's on-demand prices
    jobs:
      - name: train-a                 # the rest of the entry is a job spec (spotrelay submit's format;
        resources: {gpus: 1}          #   `run` may be left out), and needs work_hours and a deadline
        work_hours: 24                #   that the fastest type the job may use meets (with its overhead)
        limits: {deadline_hours: 36, max_price_per_hour: 1.5}
        recovery: same-pool-first
        checkpoint: {interval_minutes: 30}
        submit: 2h                    # after the traces' start (default 0); every copy's deadline must end
                                      #   within the traces (and a --prices history): no made-up capacity
        restart_overhead: 6m          # d, paid at every (re)start, also put in the spec for place()
                                      #   (default: placement.restart_overhead_minutes, 6 min unless set;
                                      #   set both to replay a job whose spec misjudges its overhead)
        checkpoint_on_notice: false   # default true: nothing is lost at a preemption; false also puts
                                      #   checkpoint.grace_seconds 0 in the spec (unless set): see place()
        zones: [us-east-1c]           # this job's zones (default: the workload's)
        per_zone: true                # one copy per zone, each limited to it (the paper's single-zone runs)
        repeat: {count: 10, every: 24h}   # copies submitted every 24 h
    ```

    Errors name the file, the job entry (`jobs[0] (train-a)`) and the field.
    """
    path = Path(path)
    try:
        document = decode_document(read_document(path, WORKLOAD_LIMITS), str(path), WORKLOAD_LIMITS)
        parsed = _WorkloadFile.model_validate(document)
    except JobSpecError as e:
        raise WorkloadError(str(e)) from None
    except ValidationError as e:
        file_problems = field_problems(e, describe=lambda err: _file_problem(err, document))
        raise WorkloadError(f"{path}: {'; '.join(file_problems)}") from None
    specs: list[JobSpec] = []
    problems: list[str] = []
    for index, entry in enumerate(parsed.jobs):
        spec, entry_problems = _entry_spec(index, entry)
        problems.extend(entry_problems)
        if spec is not None:
            specs.append(spec)
    if problems:
        raise WorkloadError(f"{path}: {'; '.join(and_more(problems[:PROBLEMS_SHOWN], len(problems)))}")

    traced_zones = sorted({p.zone for p in inputs.traces})
    untraced = [z for z in parsed.zones or () if z not in traced_zones]
    if untraced:
        raise WorkloadError(f"{path}: zones: {', '.join(untraced)} not traced; traced zones: {', '.join(traced_zones)}")
    pools = [p for p in inputs.traces if parsed.zones is None or p.zone in parsed.zones]
    if parsed.instance_types is not None:
        unknown = [t for t in parsed.instance_types if t not in INSTANCE_TYPES]
        if unknown:
            raise WorkloadError(f"{path}: instance_types: unknown type(s) {', '.join(unknown)}")
        pools = [p for p in pools if p.instance_type in parsed.instance_types]
    if not pools:
        raise WorkloadError(
            f"{path}: no traced pool matches its zones ({', '.join(parsed.zones or ['all'])}) and instance_types "
            f"({', '.join(parsed.instance_types or ['all'])}); traced: {_traced_summary(inputs.traces)}"
        )
    spot: Mapping[str, float] | None = None
    if isinstance(parsed.spot_price_usd_per_hour, float):
        spot = {p.instance_type: parsed.spot_price_usd_per_hour for p in pools}
    elif isinstance(parsed.spot_price_usd_per_hour, dict):
        spot = parsed.spot_price_usd_per_hour
    unpriced = sorted({p.instance_type for p in pools} - set(spot)) if spot is not None else []
    if unpriced and len(unpriced) == len({p.instance_type for p in pools}):
        raise WorkloadError(f"{path}: spot_price_usd_per_hour: no price for a traced type ({', '.join(unpriced)})")
    market, notes = build_market(pools, inputs, spot_prices=spot)
    if unpriced:
        notes.append(f"left out (no spot_price_usd_per_hour for their type): {', '.join(unpriced)}")
    traced = {(p.instance_type, p.zone): p for p in pools}
    market_pools = [traced[(p.instance_type, p.availability_zone)] for p in market.pools()]
    price_file = inputs.prices if spot is None else None  # the market's prices come from --prices
    allowed = (
        sorted(parsed.instance_types)
        if parsed.instance_types is not None
        else sorted(n for n in INSTANCE_TYPES if family_of(n) in {family_of(p.instance_type) for p in market_pools})
    )
    all_zones = tuple(market.zones())
    jobs: list[BenchJob] = []
    for index, (entry, spec) in enumerate(zip(parsed.jobs, specs, strict=True)):
        where = f"{path}: {_entry_label(index, {'name': spec.name})}"
        overhead = (
            entry.restart_overhead if entry.restart_overhead is not None else spec.placement.restart_overhead_hours
        )
        types = fitting_types(spec, allowed)
        prices = {t: p for t in types if (p := parsed.on_demand_usd_per_hour.get(t, on_demand_price(t) or -1)) > 0}
        zones = entry.zones or all_zones
        missing = [z for z in zones if z not in all_zones]
        if missing:
            raise WorkloadError(f"{where}: zones: {', '.join(missing)} are not on the market ({', '.join(all_zones)})")
        if not types:
            raise WorkloadError(
                f"{where}: resources: no allowed instance type fits the job (allowed: {', '.join(allowed)})"
            )
        if spec.work_hours is None or spec.limits.deadline_hours is None:
            raise WorkloadError(f"{where}: a bench job needs work_hours and limits.deadline_hours")
        if (problem := _deadline_problem(spec, types, overhead)) is not None:
            raise WorkloadError(f"{where}: {problem}")
        zone_sets = [(z,) for z in zones] if entry.per_zone else [tuple(zones)]
        copies = entry.repeat.count if entry.repeat is not None else 1
        every = entry.repeat.every if entry.repeat is not None else 0.0
        for zone_set in zone_sets:
            usable = [p for p in market_pools if p.zone in zone_set and p.instance_type in types] or market_pools
            if (problem := _span_problem(entry, spec, market_span(usable, price_file))) is not None:
                raise WorkloadError(f"{where}: {problem}")
            for k in range(copies):
                # train-a, train-a-3 (the 4th copy), train-a-us-east-1c (per_zone), train-a-us-east-1c-3
                name = spec.name + (f"-{zone_set[0]}" if entry.per_zone else "") + (f"-{k}" if copies > 1 else "")
                jobs.append(
                    BenchJob(
                        name=name[:63],
                        spec=spec,
                        submit_hours=entry.submit + k * every,
                        restart_overhead_hours=overhead,
                        zones=zone_set,
                        instance_types=types,
                        on_demand_prices=prices,
                        checkpoint_on_notice=entry.checkpoint_on_notice,
                        group=spec.name,
                    )
                )
    name = parsed.name or path.stem
    description = parsed.description or f"{len(jobs)} jobs from {path}"
    return Workload(name, description, market, tuple(jobs), tuple(notes))


def build_workload(name_or_file: str, inputs: BenchInputs, *, seed: int = 1) -> list[Workload]:
    """A named workload, or the workload of a YAML file."""
    if name_or_file == "cant-be-late":
        return [cant_be_late(inputs)]
    if name_or_file == "cant-be-late-multi":
        return [cant_be_late(inputs, multi_zone=True)]
    if name_or_file == "fleet":
        return [fleet(inputs, seed=seed)]
    path = Path(name_or_file)
    if path.suffix.lower() in {".yaml", ".yml", ".json"} or path.exists():
        return [load_workload_file(path, inputs)]
    raise WorkloadError(
        f"--workload {name_or_file!r}: not a workload name ({', '.join(STANDARD_WORKLOADS)}) nor a YAML file"
    )
