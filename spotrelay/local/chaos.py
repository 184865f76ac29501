"""Chaos for a replay: faults injected at random, reproducibly by a seed (`spotrelay replay SCENARIO
--chaos SEED`, `make chaos`).

    result = replay(load_scenario("events/scenarios/happy-path.yaml"), chaos=3)
    result.chaos.injected             # [Injected(at, kind, target, detail)]: the same for the same seed
    python -m spotrelay.local.chaos --seeds 1-200 --processes 2 events/scenarios/happy-path.yaml ...

Each fault is decided at its decision point by a `random.Random` seeded from the chaos seed, one stream
per kind of decision (so that one more delivery does not change which launch is refused), never by
global randomness or wall time; the replay itself is deterministic, so a seed replays the same way.

- EventBridge deliveries to Lambda targets (the hook of `patches._deliver`): duplicated (a second copy
  0-60 s later: delivery is at least once), delayed 1-120 s on the virtual clock (so reordered), or,
  rarely, dropped (a delivery whose retries all failed). Deliveries to reconcile, the safety net whose
  period the invariants allow an orphan, are only duplicated or failed after their handler ran.
- A Lambda invocation failing before its handler runs or after it returned (the hook of
  `InProcessLambdas.invoke`): after, its work is done, and the retry repeats it: what idempotency must
  survive. An asynchronous invocation (EventBridge's) that fails, on purpose or not, is retried as
  Lambda does (spotrelay.local.lambdas.AsynchronousInvocations: 1 and 2 minutes later, then the function's
  DLQ if it has one); a retry may fail again. The Step Functions tasks' synchronous invocations (place,
  launch, recover, finalize) fail with a Lambda service error, which the tasks' Retry covers
  (stacks/lifecycle_construct.py): Lambda.TooManyRequestsException before the handler,
  Lambda.ServiceException after it.
- EC2 refusing a spot launch the market would let through (the hook of `Ec2Market.refusal`):
  InsufficientInstanceCapacity, and, rarer, RequestLimitExceeded (throttling).
- DynamoDB writes (the hook of `patches.StoreFaults`, as moto handles a PutItem or UpdateItem): throttled
  (ProvisionedThroughputExceededException: the functions' SDK makes one attempt here, AWS_MAX_ATTEMPTS=1 in
  spotrelay.local.lambdas, so each reaches its handler as a throttle that outlasted the SDK's retries
  would: the Step Functions tasks retry it as AwsThrottled, Lambda retries an asynchronous invocation;
  the agents' SDK retries it), or, for a write
  conditioned on the version its writer read, beaten by a concurrent writer: the item's version moves on
  first, so the condition fails for real and the writer must read again (what every read-modify-write
  of the store must survive).
- A fault of a launched instance's agent, IMDS, S3 or job (spotrelay.local.faults, what a scenario's
  `faults:` inject), at a random time of its run: the agent dying without a word (the Run task's
  heartbeat times out) or restarting (it re-attaches through its state file), IMDS answering late or
  with 503, S3 uploads failing or stalling for a while, the job ignoring SIGTERM.
- A spot interruption warning for a launched spot instance, in one of its phases chosen at random
  (launching, restoring, running, checkpointing, finishing): the replay's own notice path (EventBridge
  and the instance's IMDS, the instance terminated two minutes later).

Under chaos only the invariants (spotrelay.local.invariants) decide whether a replay passed: a scenario's
expectations (its cost, its number of attempts) may fail because of what was injected.

The code, one concern a module: spotrelay.local.chaos_decisions (the kinds of fault, their odds, the
seeded decisions), spotrelay.local.chaos_engine (`Chaos`, the hooks that inject them into a replay, and the
record of what it injected), and this module: the runner of many seeds (`run_all`, `python -m
spotrelay.local.chaos`) and its report. Every name is importable from here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from spotrelay.local.chaos_decisions import (
    AGENT_FAULT_KINDS,
    BOOT_SECONDS,
    CRASHES,
    DELIVERY_FAULTS,
    PHASES,
    ChaosKind,
    ChaosOdds,
    agent_fault,
    delivery_delays,
    interruption_offset,
    invocation_fault,
    launch_refusal,
    store_fault,
)
from spotrelay.local.chaos_engine import (
    ASYNC_CRASH,
    REQUEST_LIMIT_EXCEEDED,
    SERVICE_ERROR,
    SHOWN,
    STREAMS,
    TASK_FUNCTIONS,
    THROTTLED,
    Chaos,
    ChaosHost,
    ChaosReport,
    Injected,
    function_name,
    summary,
)
from spotrelay.local.lambdas import ASYNC_RETRY_WAITS

# --------------------------------------------------------------------------------------------- runner


@dataclass(frozen=True)
class SeedRun:
    """One replay of one scenario under one chaos seed, as the runner reports it."""

    scenario: str  # the path given
    name: str
    seed: int
    wall_seconds: float
    injected: Mapping[str, int] = field(default_factory=dict)
    jobs: Mapping[str, int] = field(default_factory=dict)  # state -> jobs
    violations: tuple[str, ...] = ()
    error: str | None = None  # the replay itself failed (a stall, a crash of the replay)

    @property
    def failed(self) -> bool:
        return bool(self.violations) or self.error is not None

    @property
    def command(self) -> str:
        return f"spotrelay replay {self.scenario} --chaos {self.seed}"

    def line(self) -> str:
        verdict = "ERROR" if self.error else "FAIL" if self.violations else "ok"
        injected = sum(self.injected.values())
        jobs = ", ".join(f"{state} {count}" for state, count in sorted(self.jobs.items()))
        text = f"{self.name} seed {self.seed}: {verdict:<5} {injected:3d} injected, jobs {jobs or '-'}"
        text += f" ({self.wall_seconds:.1f} s)"
        if self.error:
            text += f"\n    {self.error}"
        text += "".join(f"\n    {v}" for v in self.violations)
        return text


def run_seed(scenario: str, seed: int) -> SeedRun:
    """Replay `scenario` under chaos `seed` (in this process)."""
    from spotrelay.local.replay import replay
    from spotrelay.local.scenario import load_scenario

    started = time.perf_counter()
    loaded = load_scenario(scenario)
    try:
        result = replay(loaded, chaos=seed)
    except Exception as e:  # the replay could not run to its end: as bad as a violation
        return SeedRun(scenario, loaded.name, seed, time.perf_counter() - started, error=f"{type(e).__name__}: {e}")
    report = result.chaos or ChaosReport(seed)
    return SeedRun(
        scenario=scenario,
        name=loaded.name,
        seed=seed,
        wall_seconds=time.perf_counter() - started,
        injected=report.counts(),
        jobs=dict(Counter(job.state for job in result.jobs)),
        violations=tuple(f"{v.kind} {v.job_id or '-'}: {v.detail}" for v in result.violations),
    )


def run_pair(run: tuple[str, int]) -> SeedRun:
    return run_seed(*run)


def parse_seeds(text: str) -> list[int]:
    """ "1-200", "3,7,10-12" -> the seeds, in order, each once."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"--seeds {text!r}: {part!r} is not N or N-M")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"--seeds {text!r}: {part!r} counts down")
        seeds.extend(s for s in range(low, high + 1) if s not in seeds)
    if not seeds:
        raise ValueError(f"--seeds {text!r}: no seed")
    return seeds


MAX_REPLAYS_PER_PROCESS = 40  # then a fresh process: what a replay leaves behind in one stays bounded


def run_all(
    scenarios: Sequence[str], seeds: Sequence[int], *, processes: int, out: Callable[[str], None] = print
) -> list[SeedRun]:
    """Every scenario under every seed, on `processes` processes (1: in this one); a line per replay."""
    runs = [(scenario, seed) for seed in seeds for scenario in scenarios]
    done: list[SeedRun] = []
    if processes <= 1:
        for scenario, seed in runs:
            done.append(run_seed(scenario, seed))
            out(done[-1].line())
        return done
    from spotrelay.local import chaos as module  # by its own name, not __main__: what the workers import

    # multiprocessing's Pool, not ProcessPoolExecutor: with max_tasks_per_child, Python 3.11's executor hung
    # here once its first worker retired. Fresh processes (spawn): nothing of this one's moto is inherited.
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes, maxtasksperchild=MAX_REPLAYS_PER_PROCESS) as pool:
        for run in pool.imap_unordered(module.run_pair, runs):
            done.append(run)
            out(run.line())
    order = {run: index for index, run in enumerate(runs)}
    return sorted(done, key=lambda r: order[(r.scenario, r.seed)])


def report_lines(done: Sequence[SeedRun], *, wall_seconds: float, processes: int) -> list[str]:
    failed = [r for r in done if r.failed]
    scenarios = sorted({r.name for r in done})
    seeds = len({r.seed for r in done})
    injected: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    for run in done:
        injected.update(run.injected)
        jobs.update(run.jobs)
    lines = [
        "",
        f"chaos: {len(done)} replays ({seeds} seeds x {len(scenarios)} scenarios: {', '.join(scenarios)}) "
        f"in {wall_seconds:.0f} s on {processes} process{'es' if processes > 1 else ''}: "
        f"{len(failed)} with a violation or an error",
        "  injected: " + (", ".join(f"{k} {injected[str(k)]}" for k in ChaosKind if injected[str(k)]) or "none"),
        "  jobs ended: "
        + ", ".join(f"{state} {count}" for state, count in sorted(jobs.items()))
        + " (a job FAILED with its reason is no violation)",
    ]
    if failed:
        lines.append("failing seeds (reproduce each with its command):")
        for run in failed:
            first = run.error or run.violations[0]
            lines.append(f"  {run.command}    # {first}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spotrelay.local.chaos",
        description="Replay scenarios under chaos seeds (spotrelay/local/chaos.py); exit 1 if any replay breaks "
        "an invariant or cannot finish. The scenarios' expectations are not checked.",
    )
    parser.add_argument("scenarios", nargs="+", metavar="SCENARIO.yaml")
    parser.add_argument("--seeds", default="1-20", help="N, N-M or a comma-separated list of them (default 1-20)")
    parser.add_argument("--processes", type=int, default=2, help="replays at once (default 2; 1: in this process)")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        parser.error(str(e))
    started = time.perf_counter()
    done = run_all(args.scenarios, seeds, processes=args.processes, out=lambda line: print(line, flush=True))
    for line in report_lines(done, wall_seconds=time.perf_counter() - started, processes=max(1, args.processes)):
        print(line)
    return 1 if any(r.failed for r in done) else 0


__all__ = [
    "AGENT_FAULT_KINDS",
    "ASYNC_CRASH",
    "ASYNC_RETRY_WAITS",
    "BOOT_SECONDS",
    "CRASHES",
    "DELIVERY_FAULTS",
    "MAX_REPLAYS_PER_PROCESS",
    "PHASES",
    "REQUEST_LIMIT_EXCEEDED",
    "SERVICE_ERROR",
    "SHOWN",
    "STREAMS",
    "TASK_FUNCTIONS",
    "THROTTLED",
    "Chaos",
    "ChaosHost",
    "ChaosKind",
    "ChaosOdds",
    "ChaosReport",
    "Injected",
    "SeedRun",
    "agent_fault",
    "delivery_delays",
    "function_name",
    "interruption_offset",
    "invocation_fault",
    "launch_refusal",
    "main",
    "parse_seeds",
    "report_lines",
    "run_all",
    "run_pair",
    "run_seed",
    "store_fault",
    "summary",
]

if __name__ == "__main__":
    sys.exit(main())
