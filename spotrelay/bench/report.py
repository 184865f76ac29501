"""Figures per workload and policy, the cost targets for spotrelay, and how they are shown: a rich table,
JSON, and the Markdown of BENCHMARKS.md.

Per workload and policy:
- `cost`: mean USD per job;
- `cost_vs_on_demand`, `cost_vs_omniscient`: the policy's total cost over the on-demand policy's, and
  over the omniscient bound's (a ratio of sums, over the same jobs);
- `deadline_misses`: jobs finished after their deadline (rescued jobs included);
- `mean_completion_hours`, `p95_completion_hours`: from submission to the end of the work (nearest
  rank); for `omniscient`, when the schedule with foresight built with the bound ends;
- `interruptions`: spot preemptions, summed over the jobs; `lost_gpu_hours`: work done since the last
  checkpoint and lost at a preemption, in GPU-hours, summed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from spotrelay.bench.omniscient import Bound
from spotrelay.bench.policies import NO_ON_DEMAND_WITHIN_CAP, OMNISCIENT
from spotrelay.bench.runner import REFERENCE_POLICY, WorkloadRun
from spotrelay.bench.sim import BenchJob, JobResult

OURS = "spotrelay"
OTHER_ONLINE = ("on-demand", "greedy", "uniform-progress", "skypilot-eager")
OMNISCIENT_TARGET = 1.2
FIGURE_KEYS = (
    "cost",
    "cost_vs_on_demand",
    "cost_vs_omniscient",
    "deadline_misses",
    "mean_completion_hours",
    "p95_completion_hours",
    "interruptions",
    "lost_gpu_hours",
)


@dataclass(frozen=True)
class Figures:
    cost: float
    cost_vs_on_demand: float
    cost_vs_omniscient: float
    deadline_misses: int
    mean_completion_hours: float | None
    p95_completion_hours: float | None
    interruptions: int
    lost_gpu_hours: float
    jobs: int
    rescued: int

    def as_json(self) -> dict[str, float | int | None]:
        return {key: _json_number(getattr(self, key)) for key in FIGURE_KEYS}


def _json_number(value: float | int | None) -> float | int | None:
    if value is None or isinstance(value, int):
        return value
    return round(value, 6) if math.isfinite(value) else None


def _p95(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def figures(run: WorkloadRun) -> dict[str, Figures]:
    """The figures of every selected policy of `run`, in the order selected."""
    od_total = sum(r.cost for r in run.results[REFERENCE_POLICY])
    bound_total = sum(b.cost for b in run.bounds)
    out: dict[str, Figures] = {}
    for name in run.policies:
        if name == OMNISCIENT:
            out[name] = _bound_figures(run.bounds, od_total, bound_total)
            continue
        results = run.results[name]
        total = sum(r.cost for r in results)
        completions = [r.completion_hours for r in results]
        out[name] = Figures(
            cost=total / len(results) if results else 0.0,
            cost_vs_on_demand=_ratio(total, od_total),
            cost_vs_omniscient=_ratio(total, bound_total),
            deadline_misses=sum(not r.deadline_met for r in results),
            mean_completion_hours=_mean(completions),
            p95_completion_hours=_p95(completions),
            interruptions=sum(r.interruptions for r in results),
            lost_gpu_hours=sum(r.lost_gpu_hours for r in results),
            jobs=len(results),
            rescued=sum(r.rescued is not None for r in results),
        )
    return out


def _bound_figures(bounds: Sequence[Bound], od_total: float, bound_total: float) -> Figures:
    completions = [b.completion_hours for b in bounds]
    return Figures(
        cost=bound_total / len(bounds) if bounds else 0.0,
        cost_vs_on_demand=_ratio(bound_total, od_total),
        cost_vs_omniscient=1.0,
        deadline_misses=sum(not b.within_deadline for b in bounds),
        mean_completion_hours=_mean(completions),
        p95_completion_hours=_p95(completions),
        interruptions=0,
        lost_gpu_hours=0.0,
        jobs=len(bounds),
        rescued=0,
    )


def to_json(runs: Sequence[WorkloadRun]) -> dict[str, object]:
    """`{"workloads": {NAME: {"policies": {POLICY: {cost, cost_vs_on_demand, ...}}}}}`."""
    return {
        "workloads": {
            run.workload.name: {"policies": {name: f.as_json() for name, f in figures(run).items()}} for run in runs
        }
    }


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _row(name: str, f: Figures) -> list[str]:
    misses = f"{f.deadline_misses}/{f.jobs}"
    if f.rescued:
        misses += f" ({f.rescued} rescued)"
    return [
        name,
        _fmt(f.cost),
        _fmt(f.cost_vs_on_demand, 3),
        _fmt(f.cost_vs_omniscient, 3),
        misses,
        _fmt(f.mean_completion_hours, 1),
        _fmt(f.p95_completion_hours, 1),
        f"{f.interruptions:,}",
        _fmt(f.lost_gpu_hours, 1),
    ]


COLUMNS = (
    ("policy", "left"),
    ("$/job", "right"),
    ("vs on-demand", "right"),
    ("vs omniscient", "right"),
    ("deadline misses", "right"),
    ("mean h", "right"),
    ("p95 h", "right"),
    ("interruptions", "right"),
    ("lost GPU-h", "right"),
)


def print_tables(console: Console, runs: Sequence[WorkloadRun]) -> None:
    for run in runs:
        table = Table(title=f"{run.workload.name}", title_justify="left", caption=run.workload.description)
        table.caption_justify = "left"
        for column, justify in COLUMNS:
            table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for name, f in figures(run).items():
            table.add_row(*_row(name, f))
        console.print(table)
        for check in check_targets(run):
            mark = f"[green]{check.verdict}[/green]" if check.met else f"[red]{check.verdict.upper()}[/red]"
            console.print(f"  {mark}: {check.target} — {check.detail}", soft_wrap=True)
        notes = miss_notes(run)
        if notes:
            console.print("  deadline misses:")
        for note in notes:
            console.print(f"    {note.replace('`', '')}", soft_wrap=True, markup=False)
        console.print()


def markdown_table(run: WorkloadRun) -> str:
    head = "| " + " | ".join(c for c, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if j == "left" else "---:" for _, j in COLUMNS) + "|"
    rows = ["| " + " | ".join(_row(name, f)) + " |" for name, f in figures(run).items()]
    return "\n".join([head, rule, *rows])


def group_table(run: WorkloadRun, policies: Sequence[str]) -> str:
    """Cost vs on-demand and misses per job group (e.g. per deadline x restart overhead)."""
    groups = sorted(dict.fromkeys(j.group for j in run.workload.jobs), key=_natural)
    shown = [p for p in policies if p in run.results or p == OMNISCIENT]
    head = "| group | jobs | " + " | ".join(shown) + " |"
    rule = "|---|---:|" + "---:|" * len(shown)
    rows = []
    for group in groups:
        idx = [i for i, j in enumerate(run.workload.jobs) if j.group == group]
        od = sum(run.results[REFERENCE_POLICY][i].cost for i in idx)
        cells = []
        for p in shown:
            if p == OMNISCIENT:
                cells.append(_fmt(_ratio(sum(run.bounds[i].cost for i in idx), od), 3))
                continue
            res = [run.results[p][i] for i in idx]
            misses = sum(not r.deadline_met for r in res)
            cell = _fmt(_ratio(sum(r.cost for r in res), od), 3)
            cells.append(cell + (f" ({misses} late)" if misses else ""))
        rows.append(f"| {group} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


@dataclass(frozen=True)
class TargetCheck:
    target: str
    met: bool
    detail: str
    # False: no schedule that meets every deadline could meet it here (the omniscient bound proves it)
    reachable: bool = True

    @property
    def verdict(self) -> str:
        if self.met:
            return "met"
        return "not met" if self.reachable else "not met, out of reach of any schedule that meets every deadline"


def _lateness(job_deadline: float, result: JobResult) -> float:
    return result.completion_hours - job_deadline


def _how_late(missed: Sequence[tuple[BenchJob, JobResult]], *, given_up: bool = True) -> str:
    """How late the missed jobs ended: the latest, and how many were given up (rescued) yet ended in time
    (a rescued job counts as late however soon it ends)."""
    late = [_lateness(job.deadline_hours, r) for job, r in missed if _lateness(job.deadline_hours, r) > 1e-9]
    finite = [hours for hours in late if math.isfinite(hours)]
    parts = [f"latest by {_describe_hours(max(finite))}"] if finite else []
    if len(finite) < len(late):
        parts.append(f"{len(late) - len(finite)} never finished (no on-demand type has a price)")
    in_time = len(missed) - len(late)
    if in_time and given_up:
        parts.append(f"{in_time} given up and rescued on on-demand before the deadline")
    return ", ".join(parts)


def check_targets(run: WorkloadRun) -> list[TargetCheck]:
    """The cost targets for `spotrelay` on this workload (those whose policies were run): it meets every
    deadline the on-demand policy meets, costs less than every other online policy, and costs at most
    OMNISCIENT_TARGET times the omniscient bound."""
    if OURS not in run.results:
        return []
    ours = run.results[OURS]
    jobs = run.workload.jobs
    checks = []
    od = run.results[REFERENCE_POLICY]
    missed = [(job, r) for job, r, ref in zip(jobs, ours, od, strict=True) if ref.deadline_met and not r.deadline_met]
    if missed:
        detail = f"{len(missed)} of {len(jobs)} jobs missed a deadline on-demand met ({_how_late(missed)})"
    elif not any(r.deadline_met for r in od):
        detail = f"on-demand met none of the {len(jobs)} deadlines, so there is none to keep"
    else:
        detail = f"all {sum(r.deadline_met for r in od)} deadlines on-demand met"
    checks.append(TargetCheck("meets every deadline the on-demand policy meets", not missed, detail))
    total = sum(r.cost for r in ours)
    others = [p for p in OTHER_ONLINE if p in run.results]
    ratios = {p: _ratio(total, sum(r.cost for r in run.results[p])) for p in others}
    cheaper = all(r < 1 for r in ratios.values())
    detail = ", ".join(
        f"{r:.3f}x {p}"
        + (
            f" (which misses {sum(not x.deadline_met for x in run.results[p])})"
            if any(not x.deadline_met for x in run.results[p])
            else ""
        )
        for p, r in ratios.items()
    )
    keeping = [
        p
        for p in others
        if p != REFERENCE_POLICY
        and all(x.deadline_met or not ref.deadline_met for x, ref in zip(run.results[p], od, strict=True))
    ]
    if keeping and not missed:  # spotrelay keeps them too: is it the cheapest that does?
        cheapest = max(keeping, key=lambda p: ratios[p])  # the highest ratio: the cheapest other policy
        among = (
            "the cheapest of the policies that keep every deadline the on-demand policy keeps"
            if ratios[cheapest] < 1
            else f"not the cheapest of the policies that keep every deadline the on-demand policy keeps ({cheapest} is)"
        )
        detail = f"{detail}; {among}"
    bound = sum(b.cost for b in run.bounds)
    # A policy that misses deadlines may cost less than any schedule that meets them can: the omniscient bound
    # (a lower bound on every deadline-meeting schedule) says when.
    out_of_reach = [
        p
        for p in others
        if ratios[p] >= 1
        and any(not x.deadline_met for x in run.results[p])
        and bound > sum(r.cost for r in run.results[p])
    ]
    for p in out_of_reach:
        cost = sum(r.cost for r in run.results[p])
        detail = (
            f"{detail}; no schedule that meets every deadline can cost as little as {p}: the omniscient lower "
            f"bound is {_ratio(bound, cost):.3f}x its cost"
        )
    reachable = cheaper or not all(p in out_of_reach for p, r in ratios.items() if r >= 1)
    not_run = [p for p in OTHER_ONLINE if p not in run.results]
    if not_run:
        detail = f"{detail}; not compared with {', '.join(not_run)}, which were not run (--policies)"
    checks.append(
        TargetCheck("costs less than every other online policy", cheaper, f"spotrelay costs {detail}", reachable)
    )
    ratio = _ratio(total, bound)
    detail = f"{ratio:.3f}x the omniscient lower bound"
    foresight = sum(b.schedule_cost for b in run.bounds)
    if math.isfinite(foresight) and bound > 0:
        detail = (
            f"{detail}; the schedule with foresight built with the bound costs {foresight / bound - 1:.2%} more than "
            "it, so the true optimum is at most that much above the bound"
        )
    checks.append(TargetCheck(f"within {OMNISCIENT_TARGET}x of omniscient", ratio <= OMNISCIENT_TARGET, detail))
    return checks


def _natural(text: str) -> tuple[object, ...]:
    """Sort "8 GPU" after "4 GPU" and "D=52h" before "D=70h"."""
    return tuple(
        float(part) if part.replace(".", "", 1).isdigit() else part for part in re.split(r"(\d+(?:\.\d+)?)", text)
    )


def miss_notes(run: WorkloadRun) -> list[str]:
    """Per online policy with deadline misses: how many, how late, and which kind of job."""
    notes = []
    jobs = run.workload.jobs
    for name in run.online:
        missed = [(j, r) for j, r in zip(jobs, run.results[name], strict=True) if not r.deadline_met]
        if not missed:
            continue
        rescued = Counter(_rescue_kind(r.rescued) for _, r in missed if r.rescued is not None)
        periodic = sum(not j.checkpoint_on_notice for j, _ in missed)
        overheads = sorted({j.restart_overhead_hours for j, _ in missed})
        how = _how_late(missed, given_up=False)
        parts = [f"{len(missed)} late" + (f" ({how})" if how else "")]
        if rescued:
            kinds = ", ".join(f"{n} {kind}" for kind, n in rescued.most_common())
            parts.append(f"{rescued.total()} rescued, finished on on-demand ({kinds})")
        if periodic:
            parts.append(f"{periodic} of them checkpoint only periodically")
        parts.append("restart overhead " + "/".join(f"{d:g}" for d in overheads) + " h")
        notes.append(f"`{name}`: " + "; ".join(parts))
    return notes


def _rescue_kind(reason: str) -> str:
    """Why a policy's job was rescued, without the per-job figures ("TooManyInterruptions: 21 ..." ->
    "given up: TooManyInterruptions")."""
    if reason.startswith("idle "):
        return reason
    if reason == NO_ON_DEMAND_WITHIN_CAP:
        return f"{reason}: on on-demand above it"
    return f"given up: {reason.split(':', 1)[0]}"


def on_demand_share(results: Sequence[JobResult]) -> float:
    """The share of billed instance-hours on on-demand."""
    od = sum(r.on_demand_hours for r in results)
    total = od + sum(r.spot_hours for r in results)
    return od / total if total else 0.0


def _describe_hours(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.3g} s"
    if hours < 1:
        return f"{hours * 60:.1f} min"
    return f"{hours:.2f} h"
