"""The names every workload module shares: the Can't Be Late paper's setting (its prices also give the
fallback spot price, spotrelay.bench.workloads.traced_market), the standard workloads, the market's clock,
`WorkloadError`, and `Workload`, what each workload builder returns.

The overview of the workloads is spotrelay.bench.workloads; its modules: .inputs (the traces, prices and
Advisor figures), .traced_market (the market built from them), .standard (cant-be-late, fleet),
.workload_file (a YAML workload).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from spotrelay.bench.sim import BenchJob
from spotrelay.market import SpotMarket

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


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    market: SpotMarket
    jobs: tuple[BenchJob, ...]
    notes: tuple[str, ...] = field(default=())
