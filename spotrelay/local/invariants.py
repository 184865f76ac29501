"""What must hold after every step of every replay, whatever its scenario (the replay's `invariants`).

    monitor = InvariantMonitor(reconcile_period=timedelta(minutes=5))
    monitor.check(peek(runtime, stack), now, agents=workers)       # after a step: moto's backends, read directly
    monitor.check(read(runtime, stack), now, agents=workers, finished=True)   # at the end: through the API
    monitor.violations                                               # each broken invariant once, when first seen

The checks are one pure function, `check_invariants(Snapshot) -> [Violation]`, of what the table, EC2 and
Step Functions hold at one instant, plus what the replay has seen so far (the checkpoints committed, the
checkpoint each agent resumed from, the terminal state each job first reached):

- outcome: every job reaches one terminal state and keeps it (FAILED and CANCELLED with a
  `failure_reason`), or is visibly progressing: not terminal and its execution RUNNING (a QUEUED job
  waits for admission, without one); at the end of a replay that finished, every job is terminal;
- instances: no managed instance (`TAG_MANAGED`) pending or running without a live attempt naming it,
  nor for an ended job, for longer than one reconcile period plus reconcile's own grace for a fresh
  instance (`ORPHAN_GRACE_SECONDS`): the safety net must have terminated it by then;
- resume: an agent starts the job from the newest checkpoint committed before it (an attempt record's
  `work_done_hours_at_start` is no less than the newest committed before the attempt started);
- one runner: at most one live attempt per job that is not a standby (a make-before-break standby,
  `Attempt.is_standby`, runs beside the attempt it replaces);
- readable: every job, attempt, checkpoint pointer and blocked-pool record reads back with this
  version's models;
- billing: every managed instance pending or running is named by exactly one attempt record, and no two
  attempt records name the same instance; every settled bill (`Attempt.cost_usd`) is the price in effect:
  the scenario's spot prices integrated from the attempt's launch to its `billed_until`, as EC2 would
  bill it (spotrelay.models.billing); and no instance still pending or running has had its bill ended.

`peek` reads moto's in-process backends (asking moto's API for a Scan, a DescribeInstances and a
ListExecutions after every step would take longer than most replay steps); `read` asks the same of the API, and
the replay uses it for its last check. Both read the same state (tests/local/test_invariants.py).

The code, one concern a module: spotrelay.local.invariants_snapshot (the state snapshot and the
`Violation`), spotrelay.local.invariants_checks (the checks), spotrelay.local.invariants_reads (`read`,
`peek`), and this module: the monitor that keeps a replay's history, and the reports. Every name is
importable from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from spotrelay.config import SCHEDULE_MINUTES
from spotrelay.local.invariants_checks import (
    BILL_TOLERANCE_USD,
    check_bills,
    check_instances,
    check_invariants,
    check_one_runner,
    check_outcomes,
    check_readable,
    check_resumes,
    scenario_bill,
)
from spotrelay.local.invariants_reads import ReadCache, peek, read
from spotrelay.local.invariants_snapshot import (
    RUNNING_STATES,
    WORK_EPSILON,
    CommittedCheckpoint,
    InstanceView,
    JobStart,
    Observed,
    Snapshot,
    UnreadableRecord,
    Violation,
    _iso,
)
from spotrelay.models import JobState

if TYPE_CHECKING:
    from spotrelay.market import SpotMarket


class AgentActivity(Protocol):
    """What a simulated instance (spotrelay.local.workers.InstanceWorker) reports of its agent."""

    job_id: str
    attempt: int

    @property
    def instance_id(self) -> str: ...

    @property
    def events(self) -> Sequence[Any]: ...  # AgentEvent: at, event, details


def _checkpoint_order(text: Any) -> tuple[int, int] | None:
    attempt, _, seq = str(text).partition("-")
    return (int(attempt), int(seq)) if attempt.isdigit() and seq.isdigit() else None


class InvariantMonitor:
    """Checks each snapshot of a replay; keeps the history the checks need and each violation once."""

    def __init__(
        self, *, reconcile_period: timedelta = timedelta(minutes=SCHEDULE_MINUTES), market: SpotMarket | None = None
    ) -> None:
        self.reconcile_period = reconcile_period
        self.market = market
        self.cache = ReadCache()
        self.checked = 0
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str | None, str | None, int | None, str]] = set()
        self._first_terminal: dict[str, tuple[int, JobState]] = {}
        self._commits: dict[tuple[str, int, int], CommittedCheckpoint] = {}
        self._starts: list[JobStart] = []
        self._read: dict[str, int] = {}  # instance id -> agent events taken
        self._restored: dict[str, tuple[int, int] | None] = {}  # instance id -> the agent's latest restore
        self._restored_at: dict[str, datetime] = {}

    def _take_agent_events(self, agents: Iterable[AgentActivity]) -> None:
        for agent in agents:
            events = agent.events
            start = self._read.get(agent.instance_id, 0)
            for event in events[start:]:
                details = event.details
                if event.event == "checkpoint" and details.get("committed") and isinstance(details.get("seq"), int):
                    key = (agent.job_id, agent.attempt, int(details["seq"]))
                    work = details.get("work_done_hours")
                    self._commits.setdefault(
                        key, CommittedCheckpoint(*key, float(work) if work is not None else None, event.at)
                    )
                elif event.event == "restored":
                    self._restored[agent.instance_id] = _checkpoint_order(details.get("checkpoint"))
                    self._restored_at[agent.instance_id] = event.at
                elif event.event == "job-started":
                    restored = self._restored.pop(agent.instance_id, None)
                    at = self._restored_at.pop(agent.instance_id, event.at)
                    self._starts.append(JobStart(agent.job_id, agent.attempt, at, restored))
            self._read[agent.instance_id] = len(events)

    def check(
        self,
        observed: Observed,
        now: datetime,
        *,
        agents: Iterable[AgentActivity] = (),
        finished: bool = False,
        final: bool = False,
        submitted: Mapping[str, datetime] | None = None,
    ) -> list[Violation]:
        """Check one snapshot; returns the violations not seen before (also added to `violations`)."""
        self._take_agent_events(agents)
        for pointer in observed.pointers.values():  # the pointer as observed, for a commit no agent reported
            key = (pointer.job_id, pointer.attempt, pointer.seq)
            self._commits.setdefault(
                key, CommittedCheckpoint(*key, pointer.work_done_hours, min(pointer.committed_at, now))
            )
        snapshot = Snapshot(
            now=now,
            jobs=observed.jobs,
            attempts=observed.attempts,
            instances=observed.instances,
            executions=observed.executions,
            unreadable=observed.unreadable,
            commits=list(self._commits.values()),
            starts=self._starts,
            first_terminal=self._first_terminal,
            finished=finished,
            final=final,
            submitted=submitted or {},
            reconcile_period=self.reconcile_period,
            market=self.market,
        )
        new = [v for v in check_invariants(snapshot) if v.key not in self._seen]
        for violation in new:
            self._seen.add(violation.key)
        self.violations.extend(new)
        self.checked += 1
        for job_id, job in observed.jobs.items():
            known = self._first_terminal.get(job_id)
            if job.state.is_terminal and (known is None or known[0] < job.run):
                self._first_terminal[job_id] = (job.run, job.state)
        return new


def report_json(checked: int, violations: Sequence[Violation]) -> dict[str, Any]:
    """The replay's JSON `invariants`."""
    return {"checked": checked, "violations": [v.to_json() for v in violations]}


def summary(checked: int, violations: Sequence[Violation]) -> list[str]:
    """The replay's text report: one line, and one more per violation."""
    if not violations:
        return [f"invariants: {checked} checks, no violation"]
    count = len(violations)
    lines = [f"invariants: {checked} checks, {count} violation{'s' if count > 1 else ''}"]
    lines += [f"  {_iso(v.at)}  {v.kind}  {v.job_id or '-'}: {v.detail}" for v in violations]
    return lines


__all__ = [
    "BILL_TOLERANCE_USD",
    "RUNNING_STATES",
    "WORK_EPSILON",
    "AgentActivity",
    "CommittedCheckpoint",
    "InstanceView",
    "InvariantMonitor",
    "JobStart",
    "Observed",
    "ReadCache",
    "Snapshot",
    "UnreadableRecord",
    "Violation",
    "check_bills",
    "check_instances",
    "check_invariants",
    "check_one_runner",
    "check_outcomes",
    "check_readable",
    "check_resumes",
    "peek",
    "read",
    "report_json",
    "scenario_bill",
    "summary",
]
