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
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from spotrelay.local.ec2_market import Ec2Error, insufficient_capacity
from spotrelay.local.faults import Fault, FaultKind
from spotrelay.local.lambdas import ASYNC_RETRY_WAITS, AsynchronousInvocations, InvocationFault
from spotrelay.local.patches import STORE_CONFLICT, STORE_THROTTLED, Undeliverable, versioned_attribute
from spotrelay.models import Pool

BOOT_SECONDS = 60.0  # spotrelay.local.workers.BOOT: launch -> `running`, the agent starts
# Errors a Step Functions Lambda task gets when the Lambda service fails the invocation: both in the
# tasks' Retry (stacks/lifecycle_construct.LAMBDA_SERVICE_ERRORS)
THROTTLED = "Lambda.TooManyRequestsException"  # never ran
SERVICE_ERROR = "Lambda.ServiceException"  # ran; its answer was lost
ASYNC_CRASH = "Runtime.ExitError"  # the function's process ended mid-invocation (nobody matches on it)
REQUEST_LIMIT_EXCEEDED = Ec2Error("RequestLimitExceeded", "Request limit exceeded.", 503)
TASK_FUNCTIONS = frozenset({"place", "launch", "recover", "finalize"})  # invoked by JobLifecycle's tasks
STREAMS = ("delivery", "invocation", "ec2", "interruption", "store", "agent")
SHOWN = 8  # injections listed in the text report


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


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    "ASYNC_RETRY_WAITS",
    "Chaos",
    "ChaosKind",
    "ChaosOdds",
    "ChaosReport",
    "Injected",
    "SeedRun",
    "delivery_delays",
    "interruption_offset",
    "invocation_fault",
    "launch_refusal",
    "main",
    "parse_seeds",
    "run_seed",
    "summary",
]

if __name__ == "__main__":
    sys.exit(main())
