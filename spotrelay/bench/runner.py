"""Run workloads x policies: every job under every selected policy (plus the on-demand reference and
the omniscient bound, which the ratios need), over processes, with a progress bar on stderr."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from spotrelay.bench.omniscient import Bound, omniscient_bound
from spotrelay.bench.policies import ALL_POLICIES, OMNISCIENT, PolicyClass
from spotrelay.bench.sim import JobContext, JobResult, MarketView, simulate
from spotrelay.bench.workloads import Workload

REFERENCE_POLICY = "on-demand"
CHUNK_JOBS = 24


@dataclass
class WorkloadRun:
    workload: Workload
    policies: tuple[str, ...]  # as selected (omniscient included if it was)
    results: dict[str, list[JobResult]]  # online policy -> one result per job, in job order
    bounds: list[Bound]
    timelines: dict[str, JobResult] = field(default_factory=dict)  # the plotted job, per online policy
    timeline_job: int = 0  # its index in the workload's jobs

    @property
    def online(self) -> tuple[str, ...]:
        return tuple(p for p in self.policies if p != OMNISCIENT)


@dataclass(frozen=True)
class _Setup:
    workloads: tuple[Workload, ...]
    policies: Mapping[str, PolicyClass]
    bands: Mapping[str, int]


_SETUP: _Setup | None = None
_VIEWS: dict[int, MarketView] = {}


def _view(index: int) -> MarketView:
    assert _SETUP is not None
    found = _VIEWS.get(index)
    if found is None:
        found = MarketView(_SETUP.workloads[index].market, _SETUP.bands)
        _VIEWS[index] = found
    return found


def _run_chunk(index: int, start: int, end: int) -> tuple[int, int, dict[str, list[JobResult]], list[Bound]]:
    assert _SETUP is not None
    view = _view(index)
    results: dict[str, list[JobResult]] = {name: [] for name in _SETUP.policies}
    bounds: list[Bound] = []
    for job in _SETUP.workloads[index].jobs[start:end]:
        ctx = JobContext(job, view)
        for name, policy in _SETUP.policies.items():
            results[name].append(simulate(ctx, policy))
        bounds.append(omniscient_bound(ctx))
    return index, start, results, bounds


def run_workloads(
    workloads: Sequence[Workload],
    policies: Sequence[str],
    *,
    advisor_bands: Mapping[str, int] | None = None,
    processes: int | None = None,
    progress: bool = True,
    timeline_job: int | None = 0,
    policy_classes: Mapping[str, PolicyClass] | None = None,
) -> list[WorkloadRun]:
    """Every job of every workload under each online policy of `policies` (and `on-demand`, the
    reference of `cost_vs_on_demand`), and its omniscient bound."""
    global _SETUP
    classes = dict(policy_classes or ALL_POLICIES)
    unknown = [p for p in policies if p not in classes and p != OMNISCIENT]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)}; known: {', '.join([*classes, OMNISCIENT])}")
    run_names = list(dict.fromkeys([*(p for p in policies if p != OMNISCIENT), REFERENCE_POLICY]))
    _SETUP = _Setup(tuple(workloads), {n: classes[n] for n in run_names}, dict(advisor_bands or {}))
    _VIEWS.clear()
    tasks = [
        (i, start, min(start + CHUNK_JOBS, len(w.jobs)))
        for i, w in enumerate(workloads)
        for start in range(0, len(w.jobs), CHUNK_JOBS)
    ]
    collected: dict[tuple[int, int], tuple[dict[str, list[JobResult]], list[Bound]]] = {}
    total = sum(len(w.jobs) for w in workloads)
    workers = processes if processes is not None else min(2, os.cpu_count() or 1)
    console = Console(stderr=True)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=False,
    ) as bar:
        bound = " and the omniscient bound" if OMNISCIENT in policies else ""
        task = bar.add_task(f"replaying {total} jobs x {len(run_names)} policies{bound}", total=total)

        def done(index: int, start: int, results: dict[str, list[JobResult]], bounds: list[Bound]) -> None:
            collected[(index, start)] = (results, bounds)
            bar.advance(task, len(bounds))

        _execute(tasks, workers, done)
    runs = []
    for i, w in enumerate(workloads):
        results: dict[str, list[JobResult]] = {n: [] for n in run_names}
        bounds: list[Bound] = []
        for start in range(0, len(w.jobs), CHUNK_JOBS):
            chunk_results, chunk_bounds = collected[(i, start)]
            for name in run_names:
                results[name].extend(chunk_results[name])
            bounds.extend(chunk_bounds)
        run = WorkloadRun(w, tuple(policies), results, bounds)
        if timeline_job is not None and w.jobs:
            run.timeline_job = min(timeline_job, len(w.jobs) - 1)
            job = w.jobs[run.timeline_job]
            ctx = JobContext(job, _view(i))
            for name in run.online:
                run.timelines[name] = simulate(ctx, classes[name], keep_timeline=True)
        runs.append(run)
    return runs


def _execute(
    tasks: list[tuple[int, int, int]],
    workers: int,
    done: Callable[[int, int, dict[str, list[JobResult]], list[Bound]], None],
) -> None:
    if workers <= 1 or len(tasks) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for task in tasks:
            done(*_run_chunk(*task))
        return
    # fork: the workers inherit the workloads (markets, jobs) instead of pickling them.
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = [pool.submit(_run_chunk, *task) for task in tasks]
        for future in as_completed(futures):
            done(*future.result())
