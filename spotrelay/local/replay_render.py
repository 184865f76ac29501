"""A replay's report as text (`spotrelay replay` without --json): the timeline, the cost report, the
expectations, what a chaos seed injected and the invariants' summary.

The report's models: spotrelay.local.replay_report; the engine that makes it: spotrelay.local.replay.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotrelay.local.chaos import summary as chaos_summary
from spotrelay.local.invariants import summary
from spotrelay.local.recorded import iso
from spotrelay.local.replay_report import REFUSED, ReplayResult


def _offset(start: datetime, when: datetime) -> str:
    seconds = int((when - start).total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"+{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def render_text(result: ReplayResult, *, timeline_limit: int = 400) -> str:
    scenario = result.scenario
    chaos = f", chaos seed {result.chaos.seed}" if result.chaos is not None else ""
    lines = [
        f"scenario {scenario.name} (seed {result.seed}{chaos}), start {iso(scenario.start)}, "
        f"{result.simulated_hours:.2f} simulated hours in {result.wall_seconds:.1f} s",
        "",
        "timeline",
    ]
    entries = result.timeline
    width = max([len(e.job) for e in entries] + [3])
    # A pool refusing a job's every retry through an outage is one line per pool with a count, until the job
    # has anything else to say; --json keeps every entry
    shown: list[list[Any]] = []  # [at, job, text, times, last at]
    refusing: dict[str, dict[str, int]] = {}  # job -> refusal text -> its shown line
    for entry in entries:
        burst = refusing.setdefault(entry.job, {})
        if not entry.text.startswith(REFUSED):
            burst.clear()
        elif entry.text in burst:
            line = shown[burst[entry.text]]
            line[3] += 1
            line[4] = entry.at
            continue
        else:
            burst[entry.text] = len(shown)
        shown.append([entry.at, entry.job, entry.text, 1, entry.at])
    for at, job, text, times, last in shown[:timeline_limit]:
        again = f"  (x{times}, the last at {_offset(scenario.start, last)})" if times > 1 else ""
        lines.append(f"  {_offset(scenario.start, at)}  {job:<{width}}  {text}{again}")
    if len(shown) > timeline_limit:
        lines.append(f"  ... {len(shown) - timeline_limit} more lines (--json for the data)")
    lines += ["", "cost report"]
    header = (
        f"  {'job':<{width}}  {'state':<10} {'att':>3}  {'cost':>9}  {'on-demand':>9}  {'savings':>14}  {'lost h':>6}"
    )
    lines.append(header)
    total_cost = total_od = total_lost = 0.0
    for job in result.jobs:
        share = f"{job.savings / job.on_demand_cost:.0%}" if job.on_demand_cost > 0 else "-"
        lines.append(
            f"  {job.name:<{width}}  {job.state:<10} {len(job.attempts):>3}  {job.cost:>9.2f}  "
            f"{job.on_demand_cost:>9.2f}  {job.savings:>8.2f} {share:>5}  {job.lost_work_hours:>6.2f}"
        )
        total_cost += job.cost
        total_od += job.on_demand_cost
        total_lost += job.lost_work_hours
    if len(result.jobs) > 1:
        share = f"{(total_od - total_cost) / total_od:.0%}" if total_od > 0 else "-"
        lines.append(
            f"  {'total':<{width}}  {'':<10} {'':>3}  {total_cost:>9.2f}  {total_od:>9.2f}  "
            f"{total_od - total_cost:>8.2f} {share:>5}  {total_lost:>6.2f}"
        )
    lines.append("  (USD; on-demand: the same instance hours at on-demand prices; lost: reference-GPU hours redone)")
    lines += ["", "expectations" + (" (not binding under chaos: only the invariants are)" if chaos else "")]
    for e in result.expectations:
        lines.append(f"  {'PASS' if e.passed else 'FAIL'}  {e.detail}")
    passed = sum(1 for e in result.expectations if e.passed)
    lines.append(f"  {passed} passed, {len(result.expectations) - passed} failed")
    if result.chaos is not None:
        lines += ["", *chaos_summary(result.chaos)]
    lines += ["", *summary(result.invariant_checks, result.violations)]
    return "\n".join(lines)


__all__ = ["render_text"]
