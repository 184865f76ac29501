"""Replay speed: simulated hours per wall-clock second for the flagship scenario and the 50-job burst.

    python -m spotrelay.local.bench_replay [--repeat 1] [--calls] [SCENARIO.yaml ...]

Exits 1 if a replay of any scenario fails (an expectation or an invariant): `make scenarios` replays
every scenario of events/scenarios so.

`--calls` also counts the AWS API calls of the last replay of each scenario and the wall time spent in
them, by who made them: the worker agents (their threads) or the control plane and the replay.

Each scenario is replayed `--repeat` times in this process; the figures are the median. "wall" counts
everything (moto's mock, the patches, deploying the template, the replay, the report); "loop" leaves
out the deploy (about a second). The first replay in a process also pays the handlers' cold imports.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotrelay.local.lambdas import REPO_ROOT
from spotrelay.local.replay import replay
from spotrelay.local.scenario import load_scenario

DEFAULT_SCENARIOS = ("flagship", "burst-50")
# The threads of a simulated instance (spotrelay.local.workers and the agent name them so)
AGENT_THREADS = ("agent ", "heartbeat", "checkpoint ", "attempt-record ", "job pid ")


@dataclass
class ApiCalls:
    """AWS API calls by (who, operation): how many, and the wall seconds spent in them."""

    count: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    seconds: collections.defaultdict[tuple[str, str], float] = field(
        default_factory=lambda: collections.defaultdict(float)
    )

    def print(self, top: int = 8) -> None:
        for who in ("agent", "control plane + replay"):
            mine = sorted((key for key in self.count if key[0] == who), key=lambda key: -self.seconds[key])
            total = sum(self.seconds[key] for key in mine)
            print(f"  {who}: {sum(self.count[key] for key in mine)} calls, {total:.1f} s")
            for key in mine[:top]:
                print(f"    {key[1]:<28} {self.count[key]:>6} {self.seconds[key]:>6.1f} s")


@contextmanager
def counted_calls() -> Iterator[ApiCalls]:
    """Count botocore's API calls while it is open, by who made them (the agents' threads or not)."""
    import botocore.client

    calls = ApiCalls()
    original: Callable[..., Any] = getattr(botocore.client.BaseClient, "_make_api_call")  # noqa: B009

    def make_api_call(client: Any, operation: str, params: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(client, operation, params)
        finally:
            name = threading.current_thread().name
            key = ("agent" if name.startswith(AGENT_THREADS) else "control plane + replay", operation)
            calls.count[key] += 1
            calls.seconds[key] += time.perf_counter() - started

    setattr(botocore.client.BaseClient, "_make_api_call", make_api_call)  # noqa: B010
    try:
        yield calls
    finally:
        setattr(botocore.client.BaseClient, "_make_api_call", original)  # noqa: B010


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--calls", action="store_true", help="count the AWS API calls by who made them")
    args = parser.parse_args(argv)
    paths = args.scenarios or [REPO_ROOT / "events" / "scenarios" / f"{name}.yaml" for name in DEFAULT_SCENARIOS]
    header = ("scenario", "jobs", "sim h", "wall s", "sim h/s", "loop h/s", "lambdas", "ok")
    print(f"{header[0]:<24} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], (4, 7, 7, 8, 9, 8, 3), strict=True)))
    failed: list[str] = []
    for path in paths:
        scenario = load_scenario(path)
        runs = [replay(scenario) for _ in range(max(1, args.repeat) - (1 if args.calls else 0))]
        if args.calls:
            with counted_calls() as calls:
                runs.append(replay(scenario))
        wall = statistics.median(r.wall_seconds for r in runs)
        loop = statistics.median(r.wall_seconds - r.deploy_seconds for r in runs)
        last = runs[-1]
        hours = last.simulated_hours
        print(
            f"{scenario.name:<24} {len(last.jobs):>4} {hours:>7.2f} {wall:>7.1f} {hours / wall:>8.2f} "
            f"{hours / loop:>9.2f} {last.lambda_invocations:>8} {'yes' if last.passed else 'no':>3}"
        )
        if args.calls:
            calls.print()
        if not all(r.passed for r in runs):
            failed.append(scenario.name)
    if failed:
        print(f"failed (an expectation or an invariant): {', '.join(failed)}; `spotrelay replay` on one says why")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
