"""The benchmark as one call (`run_suite`, behind `spotrelay bench`), and the standard set that
`make bench` runs against ../shared/data and writes up in BENCHMARKS.md:

    python -m spotrelay.bench.suite [--data ../shared/data] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from spotrelay.bench.policies import ALL_POLICIES, DEFAULT_POLICIES, OMNISCIENT, SPOTRELAY_VARIANTS
from spotrelay.bench.report import (
    OTHER_ONLINE,
    check_targets,
    figures,
    group_table,
    markdown_table,
    miss_notes,
    on_demand_share,
    print_tables,
)
from spotrelay.bench.runner import WorkloadRun, run_workloads
from spotrelay.bench.workloads import (
    STANDARD_WORKLOADS,
    BenchInputs,
    Workload,
    WorkloadError,
    build_workload,
    load_inputs,
)

LONG_RUN_JOBS = 200  # show a progress bar from this many jobs on
# `make bench` also replays fleet on these seeds: the targets on one draw of 300 jobs could be luck
OTHER_FLEET_SEEDS = (2, 3, 4)
OTHER_SEED_POLICIES = ("on-demand", "greedy", "uniform-progress", "skypilot-eager", "spotrelay", OMNISCIENT)


@dataclass(frozen=True)
class SuiteResult:
    runs: list[WorkloadRun]
    inputs: BenchInputs
    notes: tuple[str, ...]
    seconds: float


def parse_policies(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    known = [*ALL_POLICIES, OMNISCIENT]
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise WorkloadError(f"--policies: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return names


def run_suite(
    traces: Sequence[str | Path],
    *,
    prices: str | Path | None = None,
    workload: str | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    seed: int = 1,
    advisor: str | Path | None = None,
    region: str = "us-east-1",
    processes: int | None = None,
    progress: bool | None = None,
) -> SuiteResult:
    """Load the inputs, build the workload(s) (`workload` None: the standard set, leaving out those the
    traces cannot feed), replay every job under every policy."""
    started = time.perf_counter()
    inputs = load_inputs(traces, prices, advisor, region)
    notes = list(inputs.notes)
    workloads: list[Workload] = []
    if workload is not None:
        workloads.extend(build_workload(workload, inputs, seed=seed))
    else:
        for name in STANDARD_WORKLOADS:
            try:
                workloads.extend(build_workload(name, inputs, seed=seed))
            except WorkloadError as e:
                notes.append(f"left out {name}: {e}")
        if not workloads:
            raise WorkloadError("no standard workload can run on these traces: " + "; ".join(notes))
    for w in workloads:
        notes.extend(f"{w.name}: {note}" for note in w.notes)
    jobs = sum(len(w.jobs) for w in workloads)
    runs = run_workloads(
        workloads,
        policies,
        advisor_bands=inputs.advisor.bands if inputs.advisor is not None else None,
        processes=processes,
        progress=jobs >= LONG_RUN_JOBS if progress is None else progress,
    )
    return SuiteResult(runs, inputs, tuple(notes), time.perf_counter() - started)


# ----------------------------------------------------------------------------------------- make bench

TRACE_DIRS = (
    "cant-be-late-spot-traces/availability/1-node/aws-02-15-2023",
    "cant-be-late-spot-traces/availability/1-node/aws-10-26-2022",
)
PRICE_HISTORY = "training-on-a-dime-aws-2020/aws_spot_price_history_p2_p3_2019-12_2020-03.csv"
STANDARD_POLICIES = (*DEFAULT_POLICIES[:-1], *SPOTRELAY_VARIANTS, OMNISCIENT)


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count() or "?"),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def other_seeds(inputs: BenchInputs, seeds: Sequence[int]) -> list[WorkloadRun]:
    """`fleet` drawn with each of `seeds` (the other policies and the bound only: it is about spotrelay)."""
    workloads = [w for seed in seeds for w in build_workload("fleet", inputs, seed=seed)]
    return run_workloads(workloads, OTHER_SEED_POLICIES, progress=True)


def seeds_section(runs: Sequence[tuple[int, WorkloadRun]]) -> list[str]:
    """The fleet figures of every seed, and the targets on each: how much the standard seed's say."""
    if not runs:
        return []
    shown = [p for p in OTHER_SEED_POLICIES if p != "on-demand"]
    lines = [
        "## fleet, drawn with other seeds",
        "",
        "The same workload with other draws of its 300 jobs (`--seed`): $/job, and for spotrelay its cost vs the "
        "omniscient bound (target: within 1.2x) and which of the cost targets it meets there.",
        "",
        "| seed | " + " | ".join(shown) + " | spotrelay vs omniscient | targets not met |",
        "|---:|" + "---:|" * len(shown) + "---:|---|",
    ]
    for seed, run in runs:
        f = figures(run)
        cells = [
            f"{f[p].cost:.2f}" + (f" ({f[p].deadline_misses} late)" if f[p].deadline_misses else "") for p in shown
        ]
        unmet = [c.target + ("" if c.reachable else " (out of reach)") for c in check_targets(run) if not c.met]
        lines.append(
            f"| {seed} | "
            + " | ".join(cells)
            + f" | {f['spotrelay'].cost_vs_omniscient:.3f}x | {'; '.join(unmet) or 'none'} |"
        )
    return [*lines, ""]


def write_markdown(
    path: Path,
    result: SuiteResult,
    command: str,
    equivalent: str,
    wall_seconds: float,
    seeds: Sequence[tuple[int, WorkloadRun]] = (),
    data: Path = Path("../shared/data"),
) -> None:
    m = machine()
    lines = [
        "# Cost benchmark: spotrelay vs other spot policies on real spot traces",
        "",
        "Written by `make bench` (spotrelay/bench/suite.py); do not edit by hand. How the replay, the policies, "
        "the workloads and the omniscient bound work: the docstrings of `spotrelay/bench/*.py`, summarised "
        "at the end.",
        "",
        f"- Command: `{command}` (the same as `{equivalent}`)",
        f"- Machine: {m['nproc']} CPUs (`nproc`), {m['cpu']}, Python {m['python']}, {m['platform']}",
        f"- Date: {m['date']}; wall time of the whole run: {wall_seconds:.1f} s",
        "",
        f"Data (read from {data}, not copied): the Can't Be Late availability traces (Wu et al., NSDI'24, "
        "skypilot-org/spot-traces, no license file: cite the paper), the training-on-a-dime p3 spot price history "
        "(stanford-futuredata/training_on_a_dime, MIT), and the catalog's on-demand prices.",
        "",
    ]
    for run in result.runs:
        lines += [f"## {run.workload.name}", "", run.workload.description + ".", "", markdown_table(run), ""]
        checks = check_targets(run)
        if checks:
            lines.append("The cost targets for `spotrelay` here:")
            lines.append("")
            lines += [f"- {c.verdict if c.met else f'**{c.verdict}**'}: {c.target} — {c.detail}" for c in checks]
            lines.append("")
        misses = miss_notes(run)
        if misses:
            lines += ["Deadline misses:", "", *(f"- {m}" for m in misses), ""]
        groups = {j.group for j in run.workload.jobs}
        if 1 < len(groups) <= 12:
            lines += [
                "Cost vs on-demand per group of jobs (late: deadline misses):",
                "",
                group_table(run, run.policies),
                "",
            ]
    lines += seeds_section(seeds)
    lines += gap_analysis(result.runs)
    if result.notes:
        lines += ["## Notes on the inputs", ""] + [f"- {n}" for n in result.notes] + [""]
    lines += [ABOUT, ""]
    path.write_text("\n".join(lines))


def _ratio_of(run: WorkloadRun, policy: str, other: str) -> str:
    a = sum(r.cost for r in run.results[policy])
    b = sum(r.cost for r in run.results[other])
    return f"{a / b:.3f}x" if b else "-"


def gap_analysis(runs: Sequence[WorkloadRun]) -> list[str]:
    """How `spotrelay` stands against the targets, why it misses those it does, with the figures of this run."""
    runs = [r for r in runs if "spotrelay" in r.results]
    if not runs:
        return []
    lines = ["## How spotrelay stands against the targets, and why", ""]
    rows = []
    for run in runs:
        f = figures(run)
        late_jobs = [j for j, r in zip(run.workload.jobs, run.results["spotrelay"], strict=True) if not r.deadline_met]
        late_d = sorted({j.restart_overhead_hours for j in late_jobs})
        periodic = sum(not j.checkpoint_on_notice for j in late_jobs)
        share = on_demand_share(run.results["spotrelay"])
        up_share = on_demand_share(run.results["uniform-progress"]) if "uniform-progress" in run.results else None
        online_ok = [
            (fig.cost_vs_omniscient, name)
            for name, fig in f.items()
            if name in OTHER_ONLINE and fig.deadline_misses == 0 and name != "on-demand"
        ]
        best = min(online_ok) if online_ok else None
        up = _ratio_of(run, "spotrelay", "uniform-progress") if "uniform-progress" in run.results else "-"
        sees = (
            _ratio_of(run, "spotrelay-sees-capacity", "uniform-progress")
            if {"uniform-progress", "spotrelay-sees-capacity"} <= run.results.keys()
            else "-"
        )
        greedy = _ratio_of(run, "spotrelay", "greedy") if "greedy" in run.results else "-"
        details = [f"d = {'/'.join(f'{d:g}' for d in late_d)} h"] if late_jobs else []
        if periodic:
            details.append(f"{periodic} checkpoint only periodically")
        rows.append(
            f"| {run.workload.name} | {len(late_jobs)}"
            + (f" ({'; '.join(details)})" if details else "")
            + f" | {greedy} | {share:.0%}"
            + f" | {'-' if up_share is None else f'{up_share:.0%}'}"
            + f" | {up} | {sees}"
            + f" | {'-' if best is None else f'{best[1]} {best[0]:.3f}x'} |"
        )
    lines += [
        "| workload | spotrelay late | spotrelay cost / greedy | spotrelay on-demand share of billed hours "
        "| uniform-progress on-demand share | spotrelay cost / uniform-progress | spotrelay-sees-capacity cost / "
        "uniform-progress | best other online policy meeting every deadline, vs omniscient |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "1. **Deadlines.** The restart overhead is part of the job spec (`placement.restart_overhead_minutes`, "
        "default 6 min); the workloads put each job's real d there and the control plane's `place()` uses it, so "
        "Uniform Progress's safety net keeps two of the job's own restarts of slack. Its guarantee assumes that a "
        "preemption loses no work; a job that checkpoints only periodically can lose up to an interval. Such a job "
        "says so in its spec (no grace to save at the notice, `checkpoint.grace_seconds: 0`; the workloads set it "
        "for their periodic-only jobs), and `place()`'s net then keeps the checkpoint interval on top of the two "
        "restarts. A job that can no longer meet its deadline anyway is placed on on-demand at once (no pool is "
        "rejected for a deadline none can meet) instead of waiting until `max_wait_hours` fails it.",
        "2. **Cost.** `place()`'s market choice is Uniform Progress's four rules with two changes "
        "(`spotrelay.policy.market_choice`). Rule 3: a job on on-demand goes back to spot when it is two restarts "
        "ahead of the uniform line (the paper's hysteresis) or, behind it, when a spot run is expected to pay for "
        "the switch (`spotrelay.policy.placement.spot_run_pays_off`: a run of T hours costs T x spot and makes "
        "(T - d)+ of progress, the shortfall bought back on on-demand at worst; T from the job's own interrupted "
        "runs in that pool, else from the pool's interruption rate). The paper keeps such a job on on-demand until "
        "it has caught up, which on a 52 h deadline for 48 h of work takes 13 h of on-demand per hour of work "
        "behind. Rule 1: an idle "
        "job with no spot catches up on on-demand only once it is behind the line by more than a band, (1 - u) x S "
        "hours (u = W / (k D), S the slack it would have on the line); within it, it waits for spot. The paper's "
        "rule fires at any deficit, so a job a minute behind after a spot start lost in its overhead pays an "
        "on-demand start and the hysteresis keeps it there, though the fleet's p3.16xlarge pools are back within "
        "minutes. The band costs the tight single-zone Can't Be Late jobs (D = 52 h, a band of minutes) a little "
        "and saves more on the loose ones and on fleet (multi-zone: about even); the net is untouched, so the "
        "deadline guarantee is the paper's. "
        "Rule 1 (catching up at all) pays off only with rule 3, which reconcile provides: every 5 minutes it "
        "re-places jobs running on on-demand and moves them back make-before-break (the spot instance first, "
        "then the handover through a checkpoint), so a pool without capacity never costs the job a restart. "
        "`spotrelay-no-migrate` is the control plane without that path (on-demand is for good, so Place cannot "
        "use rule 1 and an idle job waits for spot until the net).",
        "3. **What the other policies get for free: capacity, at once.** They are told which pools have capacity "
        "at every moment (`spot_choices`) and act on it the moment it changes. A deployment finds out by "
        "launching (a refused pool is skipped for 3 minutes, Karpenter's ICE-cache TTL), a waiting job tries "
        "again after Place's backoff (1, 2, then every 3 minutes) and a job on on-demand is looked at when "
        "reconcile runs (every 5 minutes); the replay models all three. `spotrelay-sees-capacity` is spotrelay "
        "told which pools have capacity (no deployment can be), with the same timing: the difference between the "
        "two (the table above) is what finding capacity out by launching costs.",
        "4. **1.2x of omniscient.** The bound is the Lagrangian relaxation of the work constraint, solved exactly "
        "over the job's market with perfect foresight: every restart takes its time and is paid in full, only the "
        "work constraint is relaxed (spotrelay/bench/omniscient.py). A schedule with foresight built from its "
        "solution meets every deadline and costs a fraction of a percent more (the targets' lines say how much), "
        "so the bound is that close to the true optimum. The last column shows how far the best other online "
        "policy that meets every deadline is from it; the section above, spotrelay's ratio on other draws of "
        "fleet's jobs. Most of what is left is the 8-GPU jobs on the two p3.16xlarge pools, whose capacity "
        "comes and goes within minutes: foresight uses the runs that pay for their restart and skips the "
        "others; an online policy cannot tell them apart in advance.",
        "5. **Cheaper than skypilot-eager.** It never pays for on-demand, so it misses deadlines (the tables "
        "above). Where the omniscient bound is above its cost, no schedule that meets every deadline can cost "
        "as little, and the target is out of reach for any policy that keeps them (the targets' lines say where). "
        "Elsewhere a schedule with foresight could; spotrelay, online, does not.",
        "",
    ]
    return lines


ABOUT = """## How to read this

- `$/job` is the mean cost per job; `vs on-demand` and `vs omniscient` are ratios of total costs over the
  same jobs; `deadline misses` counts jobs finished after their deadline (`rescued`: jobs a policy gave up on
  or left idle 24 h past the deadline, then finished on on-demand and counted late: giving up never looks
  cheap); completion times are from submission; interruptions and lost GPU-hours are totals.
- The replay (spotrelay/bench/sim.py) is event-driven: market changes of the job's pools, preemptions
  (`SpotMarket.interruption_time`), completions, and the times a policy's rule flips (a safety net, the
  uniform line, a block lapsing). Every (re)start pays the restart overhead d, billed, no progress. Progress
  = wall hours x the GPU's relative speed. Spot is billed at the price as it changes, on-demand at the
  catalog's (or the workload's) price. A preemption loses no work when the job checkpoints at the 2-minute
  notice (the traces have no notices: the final checkpoint is assumed to succeed; d is still paid); `fleet`
  has 20% of jobs that checkpoint only periodically and lose the work since their last checkpoint.
- `omniscient` is a provable lower bound on what any schedule that meets the deadline pays, knowing the
  whole future of the market: the Lagrangian relaxation of the work constraint (for a multiplier lam, the
  cheapest schedule of cost - lam x progress in the window, an exact dynamic programme over the market's
  change points, where every restart takes d and is paid in full), and at least one whole restart on top
  of the schedule without overheads; proof in spotrelay/bench/omniscient.py. The programme's own schedule,
  cut to the job's work, is a schedule with foresight that meets the deadline: the true optimum lies between
  the two, and the targets' lines give the distance. The omniscient row's completion times are that
  schedule's. It bounds deadline-meeting schedules only: a policy
  that misses deadlines (skypilot-eager) can cost less.
- Policies (spotrelay/bench/policies.py): `on-demand` the cheapest on-demand pool; `greedy` spot when
  available, else wait, on-demand for good once the slack is under d (a spot restart only with 2d of
  slack); `uniform-progress` the paper's rules (`spotrelay.policy.uniform_progress`, told the job's d),
  returning to spot from on-demand; `skypilot-eager` the cheapest available spot pool, the lost zone blocked
  for the next launch, waits for spot (never on-demand, no deadline).
- `spotrelay` is the control plane as it is: `place()` (with the restart overhead of the job spec, which
  the workloads set to the job's real d; the interruption model sharpened by the job's own preemptions;
  `migrates`, so an idle job behind schedule by more than rule 1's band catches up on on-demand), launch
  in rank order (refused pools blocked 3 min, Karpenter's ICE-cache TTL), recovery by the job's strategy
  (eager-next-pool blocks a lost pool for `recovery.block_minutes`, 3 by default, when the job's last
  placement offered another spot pool; neither strategy blocks a job's only spot pool), and a job on
  on-demand moved back to spot when rule 3 (refined) allows (reconcile's make-before-break:
  the spot instance is launched first, so a pool without capacity leaves the job on on-demand). Its
  safety net keeps a checkpoint interval of slack more for jobs whose spec gives no grace to save at the
  notice (the fleet's periodic-only jobs). Its timing is production's: a waiting job is re-placed after
  the Wait state's backoff (1, 2, then every 3 min, sooner for the safety net), never woken by capacity
  returning, and a job on on-demand when reconcile runs (every 5 min). Idealisation in its favour: a move
  back to spot costs d on the spot instance, as a restart does, where production also bills the
  on-demand instance for the standby's boot (it keeps working meanwhile). Against it: the other policies
  see a pool's capacity the moment it returns; spotrelay finds out by launching (a refused pool is
  skipped for 3 min). `spotrelay-no-migrate` is the control plane without moving jobs back to spot (a
  job on on-demand stays there; no `migrates`), for comparison.
- Misses of jobs that checkpoint only periodically come from the work a preemption loses (up to an hour),
  which a policy's fixed margin (d or 2d) does not cover; spotrelay's net keeps that interval for them.

## Workloads

- `cant-be-late`: the setting of Wu et al., "Can't Be Late: Optimizing Spot Instance Savings under
  Deadlines" (NSDI'24): 48 h of work on p3.2xlarge, deadlines 52 h and 70 h, restart overheads 0.05 h and
  0.2 h, spot $0.97/h and on-demand $3.06/h (the paper's figures), a start every 24 h over the p3.2xlarge
  availability traces; single-zone as in the paper (each zone its own market, results summed over zones).
  `cant-be-late-multi`: the same jobs with every zone open to every policy.
- `fleet`: 300 jobs (`--seed`), each alone on the market (no shared capacity): 1, 4 or 8 GPUs (60/15/25%),
  work log-uniform in 2..48 h, deadline work x U(1.1, 2.5) (at least work + 4d), d in {0.05, 0.1, 0.2} h,
  eager-next-pool (75%) or same-pool-first, 20% periodic-only checkpoints (15/30/60 min), submitted uniformly
  over the traces; every traced pool with a price: p3.2xlarge in 8 zones (2023 traces) and p3.16xlarge in
  us-west-2a/b (2022 traces), priced by the 2019-20 history replayed from its start. Capacity and prices are
  each real; their alignment in time is ours.
- A YAML file (`spotrelay bench --workload my.yaml`), e.g.:

```yaml
name: nightly
instance_types: [p3.2xlarge]          # optional: the types jobs may use
zones: [us-east-1c, us-west-2a]       # optional: the traced zones to use
spot_price_usd_per_hour: 0.97         # optional: constant spot prices instead of --prices
on_demand_usd_per_hour: {p3.2xlarge: 3.06}   # optional: instead of the catalog's
jobs:
  - name: train                       # the rest of an entry is a job spec (`run` may be left out)
    resources: {gpus: 1, gpu_models: [V100]}
    work_hours: 24
    limits: {deadline_hours: 36}
    recovery: same-pool-first
    submit: 2h                        # bench keys: when (after the traces' start), the restart overhead
    restart_overhead: 6m              #   (also the spec's placement.restart_overhead_minutes unless set),
    checkpoint_on_notice: true        #   checkpoint at the notice or not, zones, one copy per zone, repeats
    per_zone: true
    repeat: {count: 10, every: 24h}
```"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data", help="the shared data directory")
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    data = Path(args.data)
    traces = [data / d for d in TRACE_DIRS]
    prices = data / PRICE_HISTORY
    missing = [str(p) for p in (*traces, prices) if not p.exists()]
    if missing:
        # One line, as every command's error (`make bench DATA=...` passes --data)
        sys.stderr.write(
            f"error: --data {data}: not the shared data directory (no {missing[0]}); give it with "
            "--data DIR (make bench DATA=DIR)\n"
        )
        raise SystemExit(2)
    try:
        result = run_suite(traces, prices=prices, policies=STANDARD_POLICIES, seed=args.seed, progress=True)
    except WorkloadError as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
    seeds = [s for s in OTHER_FLEET_SEEDS if s != args.seed]
    seed_runs = list(zip(seeds, other_seeds(result.inputs, seeds), strict=True)) if seeds else []
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)  # a log gets the whole table
    print_tables(console, result.runs)
    for line in seeds_section(seed_runs):
        console.print(line, markup=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    wall = time.perf_counter() - started
    argv_shown = shlex.join(["python", "-m", "spotrelay.bench.suite", *(sys.argv[1:] if argv is None else argv)])
    equivalent = shlex.join(
        [
            "spotrelay",
            "bench",
            *(arg for d in traces for arg in ("--traces", str(d))),
            "--prices",
            str(prices),
            "--policies",
            ",".join(STANDARD_POLICIES),
            "--seed",
            str(args.seed),
        ]
    )
    write_markdown(Path(args.out), result, argv_shown, equivalent, wall, seed_runs, data)
    console.print(f"wrote {args.out} ({wall:.1f} s)")


if __name__ == "__main__":
    main()
