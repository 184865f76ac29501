"""Chaos for a replay (spotrelay.local.chaos): the injector of one seed, and its record of what it injected.

`Chaos` is the replay's fault hooks (EventBridge deliveries, Lambda invocations, EC2's refusals, DynamoDB
writes, the agents' faults, the interruptions), each asking its decision of spotrelay.local.chaos_decisions
from its own seeded stream and recording each injection (`Injected`, `ChaosReport`, `summary`). Siblings:
spotrelay.local.chaos_decisions (the decisions), spotrelay.local.chaos (the overview, the multi-seed runner
and its CLI).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from spotrelay.local.chaos_decisions import (
    CRASHES,
    DELIVERY_FAULTS,
    ChaosKind,
    ChaosOdds,
    agent_fault,
    delivery_delays,
    interruption_offset,
    invocation_fault,
    launch_refusal,
    store_fault,
)
from spotrelay.local.ec2_market import Ec2Error, insufficient_capacity
from spotrelay.local.faults import Fault
from spotrelay.local.lambdas import AsynchronousInvocations, InvocationFault
from spotrelay.local.patches import STORE_CONFLICT, STORE_THROTTLED, Undeliverable, versioned_attribute
from spotrelay.models import Pool

# Errors a Step Functions Lambda task gets when the Lambda service fails the invocation: both in the
# tasks' Retry (stacks/lifecycle_construct.LAMBDA_SERVICE_ERRORS)
THROTTLED = "Lambda.TooManyRequestsException"  # never ran
SERVICE_ERROR = "Lambda.ServiceException"  # ran; its answer was lost
ASYNC_CRASH = "Runtime.ExitError"  # the function's process ended mid-invocation (nobody matches on it)
REQUEST_LIMIT_EXCEEDED = Ec2Error("RequestLimitExceeded", "Request limit exceeded.", 503)
TASK_FUNCTIONS = frozenset({"place", "launch", "recover", "finalize"})  # invoked by JobLifecycle's tasks
STREAMS = ("delivery", "invocation", "ec2", "interruption", "store", "agent")
SHOWN = 8  # injections listed in the text report


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Injected:
    at: datetime
    kind: ChaosKind
    target: str  # the function (its handler module), the pool or the instance
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"at": _iso(self.at), "kind": str(self.kind), "target": self.target, "detail": self.detail}


@dataclass(frozen=True)
class ChaosReport:
    seed: int
    injected: tuple[Injected, ...] = ()

    def counts(self) -> dict[str, int]:
        counted = Counter(str(i.kind) for i in self.injected)
        return {str(kind): counted[str(kind)] for kind in ChaosKind if counted[str(kind)]}

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "injected": [i.to_json() for i in self.injected]}


def summary(report: ChaosReport, *, shown: int = SHOWN) -> list[str]:
    """The replay's text report of what was injected: the counts, then the first few."""
    counts = ", ".join(f"{kind} {count}" for kind, count in report.counts().items())
    total = len(report.injected)
    head = f"chaos (seed {report.seed}): {total} injection{'' if total == 1 else 's'}"
    lines = [head + (f": {counts}" if counts else "")]
    lines += [f"  {_iso(i.at)}  {i.kind}  {i.target}: {i.detail}" for i in report.injected[:shown]]
    if total > shown:
        lines.append(f"  ... {total - shown} more (--json lists them all)")
    return lines


# --------------------------------------------------------------------------------------------- engine


class ChaosHost(Protocol):
    """What the chaos needs of the replay: its clock's now, its agenda, its timeline."""

    def now(self) -> datetime: ...

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None: ...

    def note(self, job: str, text: str, when: datetime | None = None) -> None: ...


def function_name(arn: str) -> str:
    """arn:aws:lambda:REGION:ACCOUNT:function:NAME[:QUALIFIER] -> NAME."""
    parts = arn.split(":")
    return parts[6] if len(parts) > 6 else arn


class Chaos:
    """The faults of one chaos seed: the delivery hook (patches.DeliveryFaults), the invocation hook
    (lambdas.InvocationFaults), EC2's refusal hook and the interruptions the replay asks for."""

    def __init__(self, seed: int, odds: ChaosOdds | None = None) -> None:
        self.seed = seed
        self.odds = odds or ChaosOdds()
        self.injected: list[Injected] = []
        self._rngs = {stream: random.Random(f"spotrelay-chaos:{seed}:{stream}") for stream in STREAMS}
        self._host: ChaosHost | None = None
        self._roles: dict[str, str] = {}  # function name -> handler module
        self._asynchronous: str | None = None  # the function an asynchronous delivery is invoking now
        self._asynchronous_invocations: AsynchronousInvocations | None = None
        self._lock = threading.RLock()

    def attach(self, host: ChaosHost, functions: Mapping[str, str]) -> None:
        """Start injecting into a deployed stack (`functions`: handler module -> function name)."""
        self._host = host
        self._roles = {name: module for module, name in functions.items()}

    def report(self) -> ChaosReport:
        return ChaosReport(self.seed, tuple(self.injected))

    def record(self, kind: ChaosKind, target: str, detail: str) -> None:
        host = self._require_host()
        self.injected.append(Injected(host.now(), kind, target, detail))
        host.note("chaos", f"{kind} {target}: {detail}")

    def _require_host(self) -> ChaosHost:
        if self._host is None:
            raise RuntimeError("the chaos is not attached to a replay")
        return self._host

    def _later(self, seconds: float, label: str, action: Callable[[], None]) -> None:
        host = self._require_host()
        host.schedule(host.now() + timedelta(seconds=seconds), label, action)

    # --- EventBridge -> Lambda ---------------------------------------------------------------------

    def deliver(
        self,
        rule: str,
        target_arn: str,
        event: Mapping[str, Any],
        send: Callable[[], str | None],
        undeliverable: Undeliverable,
    ) -> None:
        name = function_name(target_arn)
        module = self._roles.get(name, name)
        allowed = DELIVERY_FAULTS.get(module, frozenset())
        with self._lock:
            delays, kind = delivery_delays(self._rngs["delivery"], self.odds, allowed)
        if kind is not None:
            what = str(event.get("detail-type", "event"))
            detail = event.get("detail")
            instance = detail.get("instance-id") if isinstance(detail, Mapping) else None
            what += f" for {instance}" if instance else ""
            how = {
                ChaosKind.DROP: (
                    "never delivered: every retry failed, EventBridge sends it to the target's DLQ "
                    f"{undeliverable.after_seconds:.0f} s later"
                ),
                ChaosKind.DUPLICATE: f"delivered twice, the copy {delays[-1]:.0f} s later" if delays else "",
                ChaosKind.DELAY: f"delivered {delays[0]:.0f} s late" if delays else "",
            }
            self.record(kind, module, f"{what} {how.get(kind, '')}")
        if kind is ChaosKind.DROP:
            self._later(
                undeliverable.after_seconds,
                f"chaos: {name}'s undelivered event to its target DLQ",
                lambda: undeliverable.give_up("THROTTLING", f"chaos: every delivery to {name} was throttled"),
            )
        for delay in delays:
            if delay <= 0:
                self._invoke_async(name, send, event)
            else:
                self._later(delay, f"chaos: delivery to {name}", lambda: self._invoke_async(name, send, event))

    def _invoke_async(self, name: str, send: Callable[[], str | None], event: Mapping[str, Any]) -> None:
        """An asynchronous invocation, retried as Lambda does (lambdas.AsynchronousInvocations)."""

        def attempt() -> str | None:
            self._asynchronous = name  # fault_for: this invocation is the asynchronous one
            try:
                return send()
            finally:
                self._asynchronous = None

        self.asynchronous().invoke(name, attempt, dict(event))

    def asynchronous(self) -> AsynchronousInvocations:
        """Lambda's asynchronous invocations, as this chaos delivers them (the replay sets `dead_letter`)."""
        if self._asynchronous_invocations is None:
            self._asynchronous_invocations = AsynchronousInvocations(
                self._require_host(), label="chaos", who=lambda name: self._roles.get(name, name)
            )
        return self._asynchronous_invocations

    # --- Lambda invocations (lambdas.InvocationFaults) ---------------------------------------------

    def fault_for(self, function_name: str) -> InvocationFault | None:
        module = self._roles.get(function_name, "")
        with self._lock:
            asynchronous = self._asynchronous == function_name
            if asynchronous:
                self._asynchronous = None  # its own invocation only, not one it makes
                allowed, chance = DELIVERY_FAULTS.get(module, frozenset()) & CRASHES, self.odds.crash
            elif module in TASK_FUNCTIONS:
                allowed, chance = CRASHES, self.odds.task_crash
            else:
                return None
            kind = invocation_fault(self._rngs["invocation"], chance, allowed)
        if kind is None:
            return None
        after = kind is ChaosKind.CRASH_AFTER
        error_type = ASYNC_CRASH if asynchronous else SERVICE_ERROR if after else THROTTLED
        how = "asynchronous invocation" if asynchronous else "invocation by its Step Functions task"
        when = "after its handler returned" if after else "before its handler ran"
        self.record(kind, module or function_name, f"{how} failed {when} ({error_type})")
        return InvocationFault(error_type, after_handler=after)

    # --- EC2 ---------------------------------------------------------------------------------------

    def refuse_launch(self, pool: Pool) -> Ec2Error | None:
        """Ec2Market.refusal_faults: a spot launch the market would let through, refused."""
        with self._lock:
            kind = launch_refusal(self._rngs["ec2"], self.odds)
        if kind is None:
            return None
        error = insufficient_capacity(pool) if kind is ChaosKind.INSUFFICIENT_CAPACITY else REQUEST_LIMIT_EXCEEDED
        self.record(kind, pool.offering, f"RunInstances refused: {error.code} (HTTP {error.status})")
        return error

    # --- DynamoDB (patches.StoreFaults) -------------------------------------------------------------

    def store_fault(self, operation: str, request: Mapping[str, Any]) -> str | None:
        versioned = versioned_attribute(request) is not None
        with self._lock:
            kind = store_fault(self._rngs["store"], self.odds, versioned=versioned)
        if kind is None:
            return None
        key = request.get("Key") or request.get("Item") or {}
        item = "/".join(str(next(iter(value.values()), "")) for name, value in key.items() if name in ("pk", "sk"))
        if kind is ChaosKind.STORE_THROTTLED:
            self.record(kind, "dynamodb", f"{operation} {item}: ProvisionedThroughputExceededException")
            return STORE_THROTTLED
        self.record(kind, "dynamodb", f"{operation} {item}: a concurrent writer moved its version on first")
        return STORE_CONFLICT

    # --- agents (spotrelay.local.faults) -----------------------------------------------------------

    def agent_fault(
        self, instance_id: str, *, job: str, attempt: int, launched_hours: float, run_seconds: float
    ) -> Fault | None:
        """A fault for the instance just launched for `job`'s `attempt` (None: none); recorded now."""
        with self._lock:
            fault = agent_fault(
                self._rngs["agent"],
                self.odds,
                job=job,
                attempt=attempt,
                launched_hours=launched_hours,
                run_seconds=run_seconds,
            )
        if fault is not None:
            self.record(ChaosKind.AGENT_FAULT, instance_id, _fault_text(fault))
        return fault

    # --- interruptions -----------------------------------------------------------------------------

    def interruption(
        self, launched_at: datetime, *, run_seconds: float, checkpoint_seconds: float
    ) -> tuple[datetime, str] | None:
        """When a spot instance launched at `launched_at` gets a warning, and in which phase (None: never);
        the replay records it (`record`) when it gives it, if the instance still runs."""
        with self._lock:
            planned = interruption_offset(
                self._rngs["interruption"], self.odds, run_seconds=run_seconds, checkpoint_seconds=checkpoint_seconds
            )
        if planned is None:
            return None
        phase, offset = planned
        return launched_at + timedelta(seconds=offset), phase


def _fault_text(fault: Fault) -> str:
    text = f"{fault.kind} at +{fault.at * 60:.0f} min" if fault.at else f"{fault.kind} (the whole run)"
    if fault.for_hours is not None:
        text += f" for {fault.for_hours * 60:.0f} min"
    if fault.seconds is not None:
        text += f", {fault.seconds:.0f} s an answer"
    if fault.after is not None:
        text += f", back {fault.after * 3600:.0f} s later"
    return text


__all__ = [
    "ASYNC_CRASH",
    "REQUEST_LIMIT_EXCEEDED",
    "SERVICE_ERROR",
    "SHOWN",
    "STREAMS",
    "TASK_FUNCTIONS",
    "THROTTLED",
    "Chaos",
    "ChaosHost",
    "ChaosReport",
    "Injected",
    "function_name",
    "summary",
]
