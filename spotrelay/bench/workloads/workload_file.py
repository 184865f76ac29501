"""A workload from a YAML (or JSON) file: its format and checks are `load_workload_file`'s docstring.

Its jobs are held to the same rules as the standard ones (spotrelay.bench.workloads.standard): every job
spec as `spotrelay submit` validates one, every deadline within the traces (and a price history). The
overview of the workloads is spotrelay.bench.workloads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotrelay.bench.sim import BenchJob
from spotrelay.bench.workloads.common import Workload, WorkloadError
from spotrelay.bench.workloads.inputs import BenchInputs, TracedPool
from spotrelay.bench.workloads.standard import fitting_types
from spotrelay.bench.workloads.traced_market import Span, build_market, market_span, on_demand_price
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
from spotrelay.market import parse_duration
from spotrelay.models import JobSpec, JobSpecError, parse_job_spec
from spotrelay.models.job_spec import JOB_SPEC_LIMITS, decode_document, read_document


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
