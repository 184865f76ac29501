"""What a replay returns: the models of its report (`ReplayResult`, its jobs, their attempts, its timeline, its
expectations and operator steps), and what `spotrelay replay --json` prints of them (`ReplayResult.to_json`).

The engine that fills them is spotrelay.local.replay (the report itself: spotrelay.local.replay_observe); the
expectations are checked in spotrelay.local.replay_expectations; spotrelay.local.replay_render prints them as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spotrelay.local.chaos import ChaosReport
from spotrelay.local.invariants import Violation, report_json
from spotrelay.local.recorded import iso
from spotrelay.local.scenario import Expectation, Scenario

REFUSED = "EC2 refused"  # how the timeline notes a launch EC2 refused


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    seq: int
    job: str
    text: str


@dataclass(frozen=True)
class AttemptReport:
    instance_type: str
    availability_zone: str
    market: str
    start: datetime
    end: datetime | None
    outcome: str | None
    hourly_price: float
    agent: tuple[dict[str, Any], ...] = ()  # what the instance's agent did, and when (InstanceWorker.summary)
    notice_to_final_checkpoint_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "availability_zone": self.availability_zone,
            "market": self.market,
            "start": iso(self.start),
            "end": iso(self.end) if self.end is not None else None,
            "outcome": self.outcome,
            "notice_to_final_checkpoint_seconds": self.notice_to_final_checkpoint_seconds,
            "agent": list(self.agent),
        }


@dataclass(frozen=True)
class JobReport:
    name: str
    entry: str
    job_id: str
    state: str
    attempts: tuple[AttemptReport, ...]
    cost: float
    on_demand_cost: float
    lost_work_hours: float
    interruptions: int
    failure_reason: str | None
    submitted_at: datetime
    ended_at: datetime | None
    in_dlq: bool

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "job_id": self.job_id,
            "state": self.state,
            "attempts": [a.to_json() for a in self.attempts],
            "cost": round(self.cost, 4),
            "on_demand_cost": round(self.on_demand_cost, 4),
            "lost_work_hours": round(self.lost_work_hours, 4),
        }


@dataclass(frozen=True)
class ExpectationResult:
    expectation: Expectation
    passed: bool
    detail: str


@dataclass(frozen=True)
class OperatorReport:
    """One `operator:` step as it ran: redrive-dlq (per DLQ: found, handled, failed, depth before and
    after) or replay-archive (the replay's name, window, and the deliveries it made)."""

    at: datetime
    run: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "run": self.run, **self.detail}


@dataclass
class ReplayResult:
    scenario: Scenario
    seed: int
    jobs: list[JobReport]
    timeline: list[TimelineEntry]
    expectations: list[ExpectationResult]
    ended_at: datetime
    wall_seconds: float
    deploy_seconds: float
    launches: int = 0
    refusals: int = 0
    events_injected: int = 0
    lambda_invocations: int = 0
    checkpoints: int = 0
    invariant_checks: int = 0  # spotrelay.local.invariants: after each step where something happened, at the end
    violations: list[Violation] = field(default_factory=list)
    chaos: ChaosReport | None = None  # what a chaos seed injected (spotrelay.local.chaos)
    operator: list[OperatorReport] = field(default_factory=list)  # the scenario's operator: steps, as they ran
    dead_lettered: dict[str, int] = field(default_factory=dict)  # function -> events Lambda sent to its DLQ
    failed_by_outage: dict[str, int] = field(default_factory=dict)  # function -> invocations an outage failed

    @property
    def passed(self) -> bool:
        """No invariant broken, and (without chaos, which may legitimately break them) every expectation met."""
        if self.violations:
            return False
        return self.chaos is not None or all(e.passed for e in self.expectations)

    @property
    def simulated_hours(self) -> float:
        return (self.ended_at - self.scenario.start).total_seconds() / 3600

    def to_json(self) -> dict[str, Any]:
        passed = sum(1 for e in self.expectations if e.passed)
        return {
            "jobs": [j.to_json() for j in self.jobs],
            "expectations": {"passed": passed, "failed": len(self.expectations) - passed},
            "invariants": report_json(self.invariant_checks, self.violations),
            **({"chaos": self.chaos.to_json()} if self.chaos is not None else {}),
            **({"operator": [o.to_json() for o in self.operator]} if self.operator else {}),
        }


__all__ = [
    "REFUSED",
    "AttemptReport",
    "ExpectationResult",
    "JobReport",
    "OperatorReport",
    "ReplayResult",
    "TimelineEntry",
]
