"""Load: many jobs at once and a storm of EC2 events, replayed on the deployed stack (`make load`).

    python -m spotrelay.local.load [--jobs 1000] [--events 10000] [--json]

One replay (spotrelay.local.replay: the synthesized stack in moto, the real handlers and agents on the
virtual clock) of a scenario built here: `--jobs` jobs submitted in the same second, a tenth of them
high priority, three tenths normal, the rest low, each a few minutes of work, against a spot quota of
32 vCPUs in the G family (eight one-GPU instances at a time); and `--events` EC2 events within its
first hour (state changes, rebalance recommendations and interruption warnings for instances that are
not spotrelay's: what an account with other fleets sends the rule), on top of the jobs' own.

It reports, and fails (exit 1) when one does not hold:
- every job SUCCEEDED, no invariant broken (spotrelay.local.invariants), never more than eight
  instances at once (the quota);
- each dispatcher run's work is bounded: at most MAX_MESSAGES_PER_RUN messages received, and its
  admissions in priority order (high before normal before low);
- the high-priority jobs wait less than the low ones (the longest high wait under the median low one);
- every EC2 event is handled by one invocation that does not fail (a storm acknowledged, not retried);
and the wall time, the simulated hours and the functions' invocations.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from spotrelay.control.dispatcher import MAX_MESSAGES_PER_RUN
from spotrelay.local.lambdas import REPO_ROOT
from spotrelay.local.replay import Replay, ReplayResult
from spotrelay.local.scenario import Scenario, parse_scenario

START = datetime(2026, 11, 30, tzinfo=UTC)
QUOTA_INSTANCES = 8  # spot_vcpu_quotas g: 32, one-GPU instances of 4 vCPUs
PRIORITY_ORDER = {"high": 0, "normal": 1, "low": 2}
SHARES = (("high", 0.1), ("normal", 0.3), ("low", 0.6))
WORK_HOURS = 0.1  # per job, on the reference GPU
RECORDED = REPO_ROOT / "events" / "recorded"
# The EC2 events of other fleets: (recorded event, share of the storm)
STORM = (
    ("instance-state-change-pending.json", 0.3),
    ("instance-state-change-running.json", 0.3),
    ("instance-state-change-terminated.json", 0.2),
    ("rebalance-recommendation.json", 0.1),
    ("spot-interruption-warning.json", 0.1),
)


def counts(jobs: int) -> dict[str, int]:
    """Jobs per priority, summing to `jobs` (the low ones take the rounding)."""
    made = {name: int(jobs * share) for name, share in SHARES[:-1]}
    made[SHARES[-1][0]] = jobs - sum(made.values())
    return {name: count for name, count in made.items() if count > 0}


def write_storm(path: Path, events: int, *, seed: int = 7, within: timedelta = timedelta(hours=1)) -> set[str]:
    """`events` EC2 events for instances that are not spotrelay's, spread over `within`, as a .jsonl of
    recorded events (each keeps its offset from the first): the recorded shapes, new ids and times.
    Returns the instance ids."""
    instances: set[str] = set()
    rng = random.Random(seed)
    templates = [(json.loads((RECORDED / name).read_text()), share) for name, share in STORM]
    weights = [share for _, share in templates]
    with path.open("w", encoding="utf-8") as out:
        for n in range(events):
            template = rng.choices([t for t, _ in templates], weights)[0]
            event = json.loads(json.dumps(template))
            at = START + timedelta(seconds=within.total_seconds() * n / max(1, events))
            event["id"] = f"{rng.getrandbits(128):032x}"
            event["time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
            instance = f"i-{rng.getrandbits(60):015x}f"  # 17 hex digits: no id moto hands out here
            event["detail"]["instance-id"] = instance
            instances.add(instance)
            event["resources"] = [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance}"]
            out.write(json.dumps(event, separators=(",", ":")) + "\n")
    return instances


def load_scenario_for(jobs: int, events: int, scratch: Path, storm_minutes: float = 60.0) -> tuple[Scenario, set[str]]:
    """The scenario, and the instance ids of its storm. The storm starts ten minutes in and lasts
    `storm_minutes` (the replay ends when its last job does: a storm longer than the jobs is cut short)."""
    storm = scratch / "storm.jsonl"
    foreign = write_storm(storm, events, within=timedelta(minutes=storm_minutes)) if events else set()
    horizon_hours = 12 + 2 * jobs * WORK_HOURS / QUOTA_INSTANCES  # twice the work at the quota, and some
    scenario = parse_scenario(
        {
            "name": f"load-{jobs}-jobs-{events}-events",
            "region": "us-east-1",
            "start": START.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "seed": 7,
            "horizon": f"{int(horizon_hours)}h",
            "schedule_minutes": 15,
            "stack": {"max_concurrent_jobs": jobs, "spot_vcpu_quotas": {"g": 4 * QUOTA_INSTANCES}},
            "market": {
                "prices": [
                    {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "spot_price_usd_per_hour": 0.35},
                    {"instance_type": "g6.xlarge", "availability_zone": "us-east-1b", "spot_price_usd_per_hour": 0.40},
                ]
            },
            "jobs": [
                {
                    "at": "0m",
                    "name": name,
                    "count": count,
                    "priority": name,
                    "work_hours": WORK_HOURS,
                    "spec": {"file": "../jobs/resnet50.yaml"},
                }
                for name, count in counts(jobs).items()
            ],
            "events": [{"at": "10m", "file": str(storm)}] if events else [],
            "expect": [{"max_running_instances": QUOTA_INSTANCES}],
        },
        REPO_ROOT / "events" / "scenarios",
        "load",
    )
    return scenario, foreign


@dataclass
class LoadReport:
    jobs: int
    events: int
    wall_seconds: float
    simulated_hours: float
    states: dict[str, int]
    dispatcher_runs: int
    most_received_in_a_run: int
    most_admitted_in_a_run: int
    runs_admitting_out_of_priority: int
    wait_hours: dict[str, dict[str, float]]  # priority -> median, max (submitted -> first launch)
    ec2_event_invocations: int
    storm_invocations: int  # ec2_events invocations for the storm's instances
    failed_invocations: dict[str, int]  # function -> invocations that failed
    invocations: int  # of every function
    violations: list[str]
    expectations_failed: list[str]
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def measure(replay: Replay, result: ReplayResult, *, jobs: int, events: int, foreign: set[str]) -> LoadReport:
    """The figures of a finished load replay, and what did not hold."""
    modules = {name: module for module, name in replay.stack.functions.items()}
    invocations = replay.runtime.lambdas.invocations
    priority_of = {j.job_id: j.entry for j in result.jobs}
    runs = [i for i in invocations if modules.get(i.function_name) == "dispatcher" and isinstance(i.result, dict)]
    out_of_order = 0
    for run in runs:
        ranks = [PRIORITY_ORDER.get(priority_of.get(job_id, ""), 9) for job_id in run.result.get("admitted", [])]
        out_of_order += ranks != sorted(ranks)
    waits: dict[str, list[float]] = {}
    for job in result.jobs:
        if job.attempts:
            waits.setdefault(job.entry, []).append((job.attempts[0].start - job.submitted_at).total_seconds() / 3600)
    wait_hours = {
        p: {"median": round(statistics.median(w), 3), "max": round(max(w), 3)} for p, w in sorted(waits.items())
    }
    failed = Counter(modules.get(i.function_name, i.function_name) for i in invocations if i.error_type)
    report = LoadReport(
        jobs=jobs,
        events=events,
        wall_seconds=round(result.wall_seconds, 1),
        simulated_hours=round(result.simulated_hours, 2),
        states=dict(Counter(j.state for j in result.jobs)),
        dispatcher_runs=len(runs),
        most_received_in_a_run=max((r.result.get("received", 0) for r in runs), default=0),
        most_admitted_in_a_run=max((len(r.result.get("admitted", [])) for r in runs), default=0),
        runs_admitting_out_of_priority=out_of_order,
        wait_hours=wait_hours,
        ec2_event_invocations=sum(1 for i in invocations if modules.get(i.function_name) == "ec2_events"),
        storm_invocations=sum(1 for i in invocations if _instance_of(i.event) in foreign),
        failed_invocations=dict(failed),
        invocations=len(invocations),
        violations=[f"{v.kind}: {v.detail}" for v in result.violations],
        expectations_failed=[e.detail for e in result.expectations if not e.passed],
    )
    report.problems = _problems(report)
    return report


def _instance_of(event: Any) -> str | None:
    detail = event.get("detail") if isinstance(event, dict) else None
    instance = detail.get("instance-id") if isinstance(detail, dict) else None
    return instance if isinstance(instance, str) else None


def _problems(report: LoadReport) -> list[str]:
    problems: list[str] = []
    if report.states != {"SUCCEEDED": report.jobs}:
        problems.append(f"not every job SUCCEEDED: {report.states}")
    problems += [f"invariant broken: {v}" for v in report.violations]
    problems += [f"expectation failed: {e}" for e in report.expectations_failed]
    if report.most_received_in_a_run > MAX_MESSAGES_PER_RUN:
        problems.append(f"a dispatcher run received {report.most_received_in_a_run} > {MAX_MESSAGES_PER_RUN}")
    if report.runs_admitting_out_of_priority:
        problems.append(f"{report.runs_admitting_out_of_priority} dispatcher run(s) admitted out of priority order")
    high, low = report.wait_hours.get("high"), report.wait_hours.get("low")
    if high is not None and low is not None and high["max"] > low["median"]:
        problems.append(f"a high-priority job waited {high['max']} h, more than the median low one ({low['median']} h)")
    if report.failed_invocations:
        problems.append(f"failed invocations: {report.failed_invocations}")
    if report.storm_invocations != report.events:
        problems.append(f"{report.storm_invocations} invocations for the storm's {report.events} events")
    return problems


def run(jobs: int, events: int, *, storm_minutes: float = 60.0, template: Path | None = None) -> LoadReport:
    with tempfile.TemporaryDirectory(prefix="spotrelay-load-") as scratch:
        scenario, foreign = load_scenario_for(jobs, events, Path(scratch), storm_minutes)
        replay = Replay(scenario, template=template)
        result = replay.run()
        return measure(replay, result, jobs=jobs, events=events, foreign=foreign)


def lines(report: LoadReport) -> list[str]:
    out = [
        f"load: {report.jobs} jobs at once, {report.events} foreign EC2 events: "
        f"{report.simulated_hours} simulated hours in {report.wall_seconds} s",
        f"  jobs: {', '.join(f'{state} {n}' for state, n in sorted(report.states.items()))}",
        f"  dispatcher: {report.dispatcher_runs} runs, at most {report.most_received_in_a_run} messages received "
        f"and {report.most_admitted_in_a_run} admitted in one; {report.runs_admitting_out_of_priority} out of "
        "priority order",
        "  wait to launch (h): "
        + "; ".join(f"{p} median {w['median']}, max {w['max']}" for p, w in report.wait_hours.items()),
        f"  functions: {report.invocations} invocations, {report.ec2_event_invocations} of them ec2_events "
        f"({report.storm_invocations} for the storm); failed: {report.failed_invocations or 'none'}",
        f"  invariants: {len(report.violations)} broken",
    ]
    out += [f"  PROBLEM {p}" for p in report.problems] or ["  every check held"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--storm-minutes", type=float, default=60.0, help="how long the events take to arrive")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.events < 0 or not 0 < args.storm_minutes <= 24 * 60:
        parser.error("--jobs is at least 1, --events at least 0, --storm-minutes more than 0 and at most a day")
    started = time.perf_counter()
    report = run(args.jobs, args.events, storm_minutes=args.storm_minutes)
    if args.json:
        print(json.dumps(asdict(report) | {"passed": report.passed}, indent=2))
    else:
        print("\n".join(lines(report)))
        print(f"  ({time.perf_counter() - started:.0f} s in all)")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
