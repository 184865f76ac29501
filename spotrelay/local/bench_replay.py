"""Replay speed: simulated hours per wall-clock second for the flagship scenario and the 50-job burst.

    python -m spotrelay.local.bench_replay [--repeat 1] [SCENARIO.yaml ...]

Each scenario is replayed `--repeat` times in this process; the figures are the median. "wall" counts
everything (moto's mock, the patches, deploying the template, the replay, the report); "loop" leaves
out the deploy (about a second). The first replay in a process also pays the handlers' cold imports.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from spotrelay.local.lambdas import REPO_ROOT
from spotrelay.local.replay import replay
from spotrelay.local.scenario import load_scenario

DEFAULT_SCENARIOS = ("flagship", "burst-50")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    paths = args.scenarios or [REPO_ROOT / "events" / "scenarios" / f"{name}.yaml" for name in DEFAULT_SCENARIOS]
    header = ("scenario", "jobs", "sim h", "wall s", "sim h/s", "loop h/s", "lambdas", "ok")
    print(f"{header[0]:<24} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], (4, 7, 7, 8, 9, 8, 3), strict=True)))
    for path in paths:
        scenario = load_scenario(path)
        runs = [replay(scenario) for _ in range(max(1, args.repeat))]
        wall = statistics.median(r.wall_seconds for r in runs)
        loop = statistics.median(r.wall_seconds - r.deploy_seconds for r in runs)
        last = runs[-1]
        hours = last.simulated_hours
        print(
            f"{scenario.name:<24} {len(last.jobs):>4} {hours:>7.2f} {wall:>7.1f} {hours / wall:>8.2f} "
            f"{hours / loop:>9.2f} {last.lambda_invocations:>8} {'yes' if last.passed else 'no':>3}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
