"""A scenario's `expect:` entries checked against a replay's report (`check`), and the scenario's names
of jobs checked before it is replayed (`_check_jobs_named`).

The report's models: spotrelay.local.replay_report; the engine that calls these: spotrelay.local.replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from spotrelay.local.replay_report import ExpectationResult, JobReport, ReplayResult
from spotrelay.local.scenario import Expectation, Injection, Scenario, ScenarioError, submissions


def _check_jobs_named(scenario: Scenario, events: Sequence[Injection]) -> None:
    """An expectation about, or an event bound to, a job the scenario never submits is a mistake in the
    scenario (a typo in a name): say so before replaying hours of it, not in its result."""
    names = {name for s in submissions(scenario) for name in (s.name, s.entry)}
    its_jobs = f"(its jobs: {', '.join(sorted(names)) or 'none'})"
    faults = sorted({f.job for f in scenario.faults if f.job not in names})
    if faults:
        raise ScenarioError(f"scenario {scenario.name}: faults name no job it submits: {', '.join(faults)} {its_jobs}")
    unknown = sorted({e.job for e in scenario.expect if e.job is not None and e.job not in names})
    if unknown:
        raise ScenarioError(
            f"scenario {scenario.name}: expect names no job it submits: {', '.join(unknown)} {its_jobs}"
        )
    bound = sorted({(i.source, i.job) for i in events if i.job is not None and i.job not in names})
    if bound:
        listed = ", ".join(f"{source} to {job}" for source, job in bound)
        raise ScenarioError(f"scenario {scenario.name}: events bound to a job it never submits: {listed} {its_jobs}")


def _matching(expectation: Expectation, jobs: Sequence[JobReport]) -> list[JobReport]:
    if expectation.job is None:
        return []
    return [j for j in jobs if j.name == expectation.job or j.entry == expectation.job]


def _max_overlap(spans: Sequence[tuple[datetime, datetime]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def _problems(e: Expectation, job: JobReport) -> list[str]:
    problems: list[str] = []
    attempts = len(job.attempts)

    def bound(ok: bool, text: str) -> None:
        if not ok:
            problems.append(text)

    if e.state is not None:
        bound(job.state == str(e.state), f"state {job.state}, expected {e.state}")
    if e.min_attempts is not None:
        bound(attempts >= e.min_attempts, f"{attempts} attempts < {e.min_attempts}")
    if e.max_attempts is not None:
        bound(attempts <= e.max_attempts, f"{attempts} attempts > {e.max_attempts}")
    if e.min_interruptions is not None:
        bound(job.interruptions >= e.min_interruptions, f"{job.interruptions} interruptions < {e.min_interruptions}")
    if e.max_interruptions is not None:
        bound(job.interruptions <= e.max_interruptions, f"{job.interruptions} interruptions > {e.max_interruptions}")
    if e.max_cost is not None:
        bound(job.cost <= e.max_cost, f"cost ${job.cost:.4f} > ${e.max_cost:g}")
    if e.max_lost_work_hours is not None:
        bound(
            job.lost_work_hours <= e.max_lost_work_hours, f"lost {job.lost_work_hours:.3f} h > {e.max_lost_work_hours}"
        )
    last = job.attempts[-1] if job.attempts else None
    if e.last_pool is not None:
        where = f"{last.instance_type}:{last.availability_zone}" if last else "none"
        bound(where == e.last_pool, f"last pool {where}, expected {e.last_pool}")
    if e.last_market is not None:
        market = last.market if last else "none"
        bound(market == str(e.last_market), f"last market {market}, expected {e.last_market}")
    if e.reason_contains is not None:
        reason = job.failure_reason or ""
        bound(e.reason_contains in reason, f"reason {reason!r} lacks {e.reason_contains!r}")
    if e.in_dlq is not None:
        bound(job.in_dlq == e.in_dlq, f"in the DLQ: {job.in_dlq}, expected {e.in_dlq}")
    if e.max_wait is not None:
        if not job.attempts:
            problems.append("never launched")
        else:
            waited = (job.attempts[0].start - job.submitted_at).total_seconds() / 3600
            bound(waited <= e.max_wait + 1e-9, f"waited {waited:.2f} h > {e.max_wait:g} h for its first launch")
    if e.max_notice_to_checkpoint_seconds is not None:
        for number, a in enumerate(job.attempts, start=1):
            took = a.notice_to_final_checkpoint_seconds
            noticed = any(event["event"] == "notice" for event in a.agent)
            if noticed and took is None:
                problems.append(f"attempt {number}: no final checkpoint after the notice")
            elif took is not None:
                bound(
                    took <= e.max_notice_to_checkpoint_seconds,
                    f"attempt {number}: final checkpoint {took:.0f} s after the notice > "
                    f"{e.max_notice_to_checkpoint_seconds:g} s",
                )
    if e.finished_within is not None:
        if job.ended_at is None:
            problems.append("not finished")
        else:
            took = (job.ended_at - job.submitted_at).total_seconds() / 3600
            bound(took <= e.finished_within + 1e-9, f"took {took:.2f} h > {e.finished_within:g} h")
    return problems


def check(
    expectation: Expectation, result: ReplayResult, spans: Sequence[tuple[datetime, datetime]]
) -> ExpectationResult:
    problems: list[str] = []
    if expectation.max_running_instances is not None:
        most = _max_overlap(spans)
        if most > expectation.max_running_instances:
            problems.append(f"{most} instances at once > {expectation.max_running_instances}")
    if expectation.job is not None:
        jobs = _matching(expectation, result.jobs)
        if not jobs:
            problems.append(f"no job named {expectation.job}")
        for job in jobs:
            problems.extend(f"{job.name}: {p}" for p in _problems(expectation, job))
    what = expectation.model_dump(exclude_none=True)
    label = ", ".join(f"{k}={v}" for k, v in what.items())
    return ExpectationResult(expectation, not problems, label if not problems else f"{label}: " + "; ".join(problems))


__all__ = ["check"]
