"""A workload's inputs, read from the files given to `spotrelay bench`.

Inputs (`BenchInputs`): availability traces (`--traces DIR`, repeatable: one `<zone>_<label>.json` per
pool, the Can't Be Late spot-traces format), optionally a price file (`--prices`: a training-on-a-dime
price history, or a PRICES.csv of `spotrelay place`) and a Spot Instance Advisor CSV (`--advisor`).

A trace's instance type comes from its label: `v100_1` is the catalog type with one V100 (p3.2xlarge),
`v100_8` the one with eight (p3.16xlarge); a label that is a catalog type name is that type. Traces of
types the catalog does not hold (K80 `k80_*`, CPU `intel_64`) are skipped with a note. When several
directories hold the same (type, zone) pool, the first directory given wins.

The market built from them is spotrelay.bench.workloads.traced_market; the overview of the workloads is
spotrelay.bench.workloads.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from spotrelay.bench.workloads.common import WorkloadError
from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.market import (
    AvailabilityTrace,
    MarketBuilder,
    PriceFileError,
    TraceFileError,
    load_advisor_bands,
    load_price_history,
    load_price_rows,
    load_trace_dir,
)
from spotrelay.models import PriceQuote


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
        PRICES.csv snapshot for ever (its prices are constant after its last row: see traced_market)."""
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
