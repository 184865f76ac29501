"""Chaos for a replay (spotrelay.local.chaos): the fault decisions, pure functions of a seeded stream.

The kinds of fault (`ChaosKind`), which a delivery to each rule target may meet (`DELIVERY_FAULTS`), how
likely each is (`ChaosOdds`), and one function per decision point, each drawing from the
`random.Random` it is given a fixed number of times. Siblings: spotrelay.local.chaos_engine (the `Chaos`
that asks these at the replay's hooks and records what it injected), spotrelay.local.chaos (the overview,
the multi-seed runner and its CLI).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spotrelay.local.faults import Fault, FaultKind

BOOT_SECONDS = 60.0  # spotrelay.local.workers.BOOT: launch -> `running`, the agent starts


class ChaosKind(StrEnum):
    DUPLICATE = "duplicate"
    DELAY = "delay"
    DROP = "drop"
    CRASH_BEFORE = "crash-before"
    CRASH_AFTER = "crash-after"
    INSUFFICIENT_CAPACITY = "insufficient-capacity"
    REQUEST_LIMIT_EXCEEDED = "request-limit-exceeded"
    INTERRUPTION = "interruption"
    STORE_THROTTLED = "dynamodb-throttled"
    STORE_CONFLICT = "dynamodb-conflict"
    AGENT_FAULT = "agent-fault"


CRASHES = frozenset({ChaosKind.CRASH_BEFORE, ChaosKind.CRASH_AFTER})
_EVERY_DELIVERY_FAULT = frozenset({ChaosKind.DUPLICATE, ChaosKind.DELAY, ChaosKind.DROP}) | CRASHES
# What may happen to a delivery to each rule target (by handler module); other targets: nothing
DELIVERY_FAULTS: Mapping[str, frozenset[ChaosKind]] = {
    "ec2_events": _EVERY_DELIVERY_FAULT,
    "dispatcher": _EVERY_DELIVERY_FAULT,
    "reconcile": frozenset({ChaosKind.DUPLICATE, ChaosKind.CRASH_AFTER}),
}
PHASES = ("launching", "restoring", "running", "checkpointing", "finishing")


@dataclass(frozen=True)
class ChaosOdds:
    """How likely each fault is, per decision (modest: a replay still finishes within its horizon)."""

    drop: float = 0.03  # per delivery: drop, duplicate and delay exclude each other
    duplicate: float = 0.10
    delay: float = 0.15
    crash: float = 0.10  # per asynchronous invocation, half of them before the handler
    task_crash: float = 0.20  # per invocation by a Step Functions task (its Retry makes up to 6 attempts)
    insufficient_capacity: float = 0.12  # per spot launch the market allows
    request_limit_exceeded: float = 0.02
    interruption: float = 0.20  # per spot instance launched
    store_throttled: float = 0.02  # per DynamoDB write
    store_conflict: float = 0.05  # per DynamoDB write conditioned on the version read
    agent_fault: float = 0.15  # per instance launched: one fault of its agent, IMDS, S3 or job
    max_delay_seconds: float = 120.0
    max_duplicate_lag_seconds: float = 60.0


# ------------------------------------------------------------------------------------------ decisions


def delivery_delays(
    rng: random.Random, odds: ChaosOdds, allowed: frozenset[ChaosKind]
) -> tuple[tuple[float, ...], ChaosKind | None]:
    """When each copy of one delivery arrives, in seconds from now, and the fault: () dropped, (0,) as
    sent, (0, lag) duplicated, (delay,) delayed. A fault the target does not allow is no fault. Two draws
    every time, whatever the outcome."""
    draw, amount = rng.random(), rng.random()
    kind: ChaosKind | None = None
    if draw < odds.drop:
        kind = ChaosKind.DROP
    elif draw < odds.drop + odds.duplicate:
        kind = ChaosKind.DUPLICATE
    elif draw < odds.drop + odds.duplicate + odds.delay:
        kind = ChaosKind.DELAY
    if kind is None or kind not in allowed:
        return (0.0,), None
    if kind is ChaosKind.DROP:
        return (), kind
    if kind is ChaosKind.DUPLICATE:
        return (0.0, round(amount * odds.max_duplicate_lag_seconds, 3)), kind
    return (round(1.0 + amount * (odds.max_delay_seconds - 1.0), 3),), kind


def invocation_fault(rng: random.Random, chance: float, allowed: frozenset[ChaosKind]) -> ChaosKind | None:
    """Whether one invocation fails (at `chance`), half the time before its handler, half after it (one
    draw)."""
    draw = rng.random()
    kind = ChaosKind.CRASH_BEFORE if draw < chance / 2 else ChaosKind.CRASH_AFTER if draw < chance else None
    return kind if kind in allowed else None


def launch_refusal(rng: random.Random, odds: ChaosOdds) -> ChaosKind | None:
    """Whether EC2 refuses one spot launch that the market would let through (one draw)."""
    draw = rng.random()
    if draw < odds.insufficient_capacity:
        return ChaosKind.INSUFFICIENT_CAPACITY
    if draw < odds.insufficient_capacity + odds.request_limit_exceeded:
        return ChaosKind.REQUEST_LIMIT_EXCEEDED
    return None


def store_fault(rng: random.Random, odds: ChaosOdds, *, versioned: bool) -> ChaosKind | None:
    """Whether one DynamoDB write is throttled, or (`versioned`: conditioned on the version its writer
    read) loses to a concurrent writer (one draw)."""
    draw = rng.random()
    if draw < odds.store_throttled:
        return ChaosKind.STORE_THROTTLED
    if versioned and draw < odds.store_throttled + odds.store_conflict:
        return ChaosKind.STORE_CONFLICT
    return None


AGENT_FAULT_KINDS = (
    FaultKind.AGENT_DIES,
    FaultKind.AGENT_RESTARTS,
    FaultKind.IMDS_SLOW,
    FaultKind.IMDS_ERROR,
    FaultKind.S3_FAIL,
    FaultKind.S3_STALL,
    FaultKind.IGNORE_SIGTERM,
)


def agent_fault(
    rng: random.Random, odds: ChaosOdds, *, job: str, attempt: int, launched_hours: float, run_seconds: float
) -> Fault | None:
    """Whether one launched instance meets a fault of its agent, IMDS, S3 or job, and which, when (hours
    from the scenario's start, as a scenario's `faults:` give it) and for how long (four draws when it
    does, one when it does not)."""
    if rng.random() >= odds.agent_fault:
        return None
    kind = rng.choice(AGENT_FAULT_KINDS)
    at = launched_hours + (BOOT_SECONDS + rng.uniform(0.0, max(run_seconds, 1.0))) / 3600
    window = rng.uniform(60.0, 1200.0) / 3600  # 1 to 20 minutes
    amount = rng.random()
    fields: dict[str, Any] = {"job": job, "attempt": attempt, "kind": kind, "at": round(at, 6)}
    if kind is FaultKind.AGENT_RESTARTS:
        fields["after"] = round((10.0 + amount * 110.0) / 3600, 6)
    elif kind in (FaultKind.IMDS_SLOW, FaultKind.S3_STALL):
        fields["seconds"] = round(1.0 + amount * (4.0 if kind is FaultKind.IMDS_SLOW else 299.0), 3)
        fields["for"] = round(window, 6)
    elif kind in (FaultKind.IMDS_ERROR, FaultKind.S3_FAIL):
        fields["for"] = round(window, 6)
    elif kind is FaultKind.IGNORE_SIGTERM:
        fields["at"] = 0.0
    return Fault.model_validate(fields)


def interruption_offset(
    rng: random.Random, odds: ChaosOdds, *, run_seconds: float, checkpoint_seconds: float
) -> tuple[str, float] | None:
    """Whether a spot instance gets an interruption warning, in which phase, how many seconds after its
    launch. `run_seconds`: how long its job should run on it; `checkpoint_seconds`: its job's interval."""
    if rng.random() >= odds.interruption:
        return None
    phase = rng.choice(PHASES)
    run = max(run_seconds, 1.0)
    if phase == "launching":  # booting: the agent is not there yet
        offset = rng.uniform(0.0, BOOT_SECONDS)
    elif phase == "restoring":  # the agent restores the checkpoint, starts the job
        offset = BOOT_SECONDS + rng.uniform(0.0, 120.0)
    elif phase == "running":
        offset = BOOT_SECONDS + rng.uniform(0.0, run)
    elif phase == "checkpointing":  # around one of the periodic checkpoints
        periods = max(1, int(run // max(checkpoint_seconds, 1.0)))
        offset = BOOT_SECONDS + rng.randint(1, periods) * checkpoint_seconds + rng.uniform(-5.0, 30.0)
    else:  # finishing: the job's last minutes, its report, Finalize
        offset = BOOT_SECONDS + run + rng.uniform(-300.0, 60.0)
    return phase, round(max(0.0, offset), 3)


__all__ = [
    "AGENT_FAULT_KINDS",
    "BOOT_SECONDS",
    "CRASHES",
    "DELIVERY_FAULTS",
    "PHASES",
    "ChaosKind",
    "ChaosOdds",
    "agent_fault",
    "delivery_delays",
    "interruption_offset",
    "invocation_fault",
    "launch_refusal",
    "store_fault",
]
