"""Benchmark: how fast the spot market answers `interruption_time` and `available` on real traces.

    python -m spotrelay.market.bench_market TRACE_DIR [--calls N] [--instance-type TYPE] [--seed N]

TRACE_DIR is a directory of availability traces in the spot-traces JSON format, e.g.
`../shared/data/cant-be-late-spot-traces/availability/1-node/aws-02-15-2023` (9 zones x 20,158 ticks).
Builds a market from it (a constant price per pool, plus an hourly price step in every pool so that
`max_price` interruptions are exercised too), then times N calls, half `interruption_time` (half of
those with a max price) and half `available`, at seeded random pools and times — through `SpotMarket`
(pool lookup included) and through the per-pool `PoolTimeline` handles a hot loop can hold.
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime

from spotrelay.market.model import MarketBuilder, SpotMarket
from spotrelay.market.traces import load_trace_dir
from spotrelay.models import Pool


def build_market(trace_dir: str, instance_type: str) -> SpotMarket:
    traces = load_trace_dir(trace_dir)
    builder = MarketBuilder(datetime(2023, 2, 15, tzinfo=UTC)).add_traces(
        traces, instance_type, spot_price_usd_per_hour=0.97
    )
    horizon = int(max(t.duration_hours for t in traces))
    for trace in traces:
        for hour in range(0, horizon, 6):
            builder.add_price(instance_type, trace.zone, 0.97 if hour % 12 else 1.20, at=float(hour))
    return builder.build()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace_dir")
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--instance-type", default="p3.2xlarge")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    started = time.perf_counter()
    market = build_market(args.trace_dir, args.instance_type)
    build_ms = (time.perf_counter() - started) * 1000
    rng = random.Random(args.seed)
    pools = market.pools()
    queries: list[tuple[Pool, float, float | None]] = [
        (rng.choice(pools), rng.uniform(0, market.horizon), rng.choice((None, 1.0))) for _ in range(args.calls)
    ]
    half = args.calls // 2

    def via_market() -> int:
        interrupted = 0
        interruption_time, available = market.interruption_time, market.available
        for pool, t, max_price in queries[:half]:
            if interruption_time(pool, t, max_price) is not None:
                interrupted += 1
        for pool, t, max_price in queries[half:]:
            if available(pool, t, max_price):
                interrupted += 1
        return interrupted

    handles = {pool: market.timeline(pool) for pool in pools}
    timed_queries = [(handles[pool], t, max_price) for pool, t, max_price in queries]

    def via_handles() -> int:
        interrupted = 0
        for timeline, t, max_price in timed_queries[:half]:
            if timeline.interruption_time(t, max_price) is not None:
                interrupted += 1
        for timeline, t, max_price in timed_queries[half:]:
            if timeline.available(t, max_price):
                interrupted += 1
        return interrupted

    print(
        f"market: {len(pools)} pools, {len(market.change_times())} change points, horizon {market.horizon:.1f} h, "
        f"built in {build_ms:.0f} ms (files read included)"
    )
    for name, run in (("SpotMarket.interruption_time/available", via_market), ("PoolTimeline handles", via_handles)):
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        print(
            f"{name}: {args.calls:,} calls in {seconds:.2f} s "
            f"({seconds / args.calls * 1e6:.2f} us/call, {args.calls / seconds / 1e6:.2f} M calls/s)"
        )


if __name__ == "__main__":
    main()
