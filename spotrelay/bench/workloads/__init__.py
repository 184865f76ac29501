"""Workloads: the jobs a benchmark replays, and the market they run on.

Inputs (`BenchInputs`): availability traces (`--traces DIR`), optionally a price file (`--prices`) and a
Spot Instance Advisor CSV (`--advisor`); the market of the traced pools, priced by the price file or from
on-demand prices.

Workloads:
- `cant-be-late`: the Can't Be Late paper's setting (NSDI'24), single-zone: each zone is its own market.
- `cant-be-late-multi`: the same jobs with every traced zone open to every policy.
- `fleet`: `FLEET_JOBS` jobs, seeded, on every traced pool priced by `--prices`.
- a YAML file: see `load_workload_file`.

The package, one concern a module (this one picks the workload by name, `build_workload`, and re-exports
the modules' names):
- .common: the paper's setting, the standard names, the market's clock, `WorkloadError`, `Workload`;
- .inputs: reading the traces (a label's instance type), the price file and the Advisor CSV;
- .traced_market: the market of traced pools (spot prices from the price file or the fallback) and its span;
- .standard: the cant-be-late and fleet workloads, and the bench job spec;
- .workload_file: a workload from a YAML file, its format and checks.
"""

from __future__ import annotations

from pathlib import Path

from spotrelay.bench.workloads.common import (
    DEFAULT_SPOT_FRACTION,
    FLEET_JOBS,
    MARKET_START,
    PAPER_DEADLINES_HOURS,
    PAPER_INSTANCE_TYPE,
    PAPER_ON_DEMAND_PRICE,
    PAPER_RESTART_OVERHEADS_HOURS,
    PAPER_SPOT_PRICE,
    PAPER_WORK_HOURS,
    STANDARD_WORKLOADS,
    START_EVERY_HOURS,
    UNLIMITED_INTERRUPTIONS,
    Workload,
    WorkloadError,
)
from spotrelay.bench.workloads.inputs import (
    Advisor,
    BenchInputs,
    PriceTable,
    TracedPool,
    instance_type_for_label,
    load_advisor,
    load_inputs,
    load_price_table,
    load_traces,
)
from spotrelay.bench.workloads.standard import (
    FLEET_CHECKPOINT_MINUTES,
    FLEET_DEADLINE_FACTOR,
    FLEET_GPU_MIX,
    FLEET_PERIODIC_ONLY,
    FLEET_RESTART_OVERHEADS,
    FLEET_SAME_POOL_FIRST,
    FLEET_WORK_HOURS,
    cant_be_late,
    fitting_types,
    fleet,
    job_spec,
)
from spotrelay.bench.workloads.traced_market import (
    Span,
    build_market,
    fallback_spot_price,
    market_span,
    on_demand_price,
    region_of,
)
from spotrelay.bench.workloads.workload_file import (
    BENCH_KEYS,
    ENTRY_KEYS,
    SPEC_KEYS,
    WORKLOAD_LIMITS,
    load_workload_file,
)

__all__ = [
    "BENCH_KEYS",
    "DEFAULT_SPOT_FRACTION",
    "ENTRY_KEYS",
    "FLEET_CHECKPOINT_MINUTES",
    "FLEET_DEADLINE_FACTOR",
    "FLEET_GPU_MIX",
    "FLEET_JOBS",
    "FLEET_PERIODIC_ONLY",
    "FLEET_RESTART_OVERHEADS",
    "FLEET_SAME_POOL_FIRST",
    "FLEET_WORK_HOURS",
    "MARKET_START",
    "PAPER_DEADLINES_HOURS",
    "PAPER_INSTANCE_TYPE",
    "PAPER_ON_DEMAND_PRICE",
    "PAPER_RESTART_OVERHEADS_HOURS",
    "PAPER_SPOT_PRICE",
    "PAPER_WORK_HOURS",
    "SPEC_KEYS",
    "STANDARD_WORKLOADS",
    "START_EVERY_HOURS",
    "UNLIMITED_INTERRUPTIONS",
    "WORKLOAD_LIMITS",
    "Advisor",
    "BenchInputs",
    "PriceTable",
    "Span",
    "TracedPool",
    "Workload",
    "WorkloadError",
    "build_market",
    "build_workload",
    "cant_be_late",
    "fallback_spot_price",
    "fitting_types",
    "fleet",
    "instance_type_for_label",
    "job_spec",
    "load_advisor",
    "load_inputs",
    "load_price_table",
    "load_traces",
    "load_workload_file",
    "market_span",
    "on_demand_price",
    "region_of",
]


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
