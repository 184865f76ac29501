"""Benchmark: how long `place` takes to decide a 100-type x 6-AZ price table.

    python -m spotrelay.policy.bench_placement [--repeat N]

The table holds every catalog GPU type plus non-GPU types up to 100 names, each priced in 6 zones
(600 spot quotes); the job accepts any GPU with >= 16 GiB, so most pools are feasible and ranked.
Prints the median and p95 of the compute time of `place` (not process start-up or file parsing).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.models import Market, Pool, PriceQuote, parse_job_spec
from spotrelay.policy import place

ZONES = [f"us-east-1{z}" for z in "abcdef"]


def price_table(types: int = 100, seed: int = 1) -> list[PriceQuote]:
    rng = random.Random(seed)
    names = list(INSTANCE_TYPES)
    names += [f"m9.size{i}" for i in range(types - len(names))]
    return [
        PriceQuote(
            pool=Pool(instance_type=name, availability_zone=zone, market=Market.SPOT),
            usd_per_hour=round(rng.uniform(0.1, 40.0), 4),
        )
        for name in names[:types]
        for zone in ZONES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    spec = parse_job_spec(
        {
            "name": "bench",
            "run": {"command": "python train.py"},
            "resources": {"gpus": 1, "gpu_memory_gib": 16},
            "limits": {"deadline_hours": 24},
            "work_hours": 6,
        }
    )
    quotes = price_table()
    place(spec, quotes)  # warm up imports and caches
    samples = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        placement = place(spec, quotes)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * len(samples)) - 1)]
    print(
        f"place(): {len(quotes)} quotes ({len(quotes) // len(ZONES)} types x {len(ZONES)} AZs), "
        f"{len(placement.ranked)} ranked, {len(placement.rejected)} rejected; "
        f"median {statistics.median(samples):.1f} ms, p95 {p95:.1f} ms over {args.repeat} runs"
    )


if __name__ == "__main__":
    main()
