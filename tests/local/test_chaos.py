"""Chaos (spotrelay.local.chaos): the seeded decisions, the mechanics of a duplicated, delayed or dropped
delivery and of Lambda's asynchronous retries (on a fake agenda, no replay), the invocation hook, and a
few chaos seeds replayed whole: no invariant broken, and a seed injects the same faults every time."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from spotrelay.local.chaos import (
    AGENT_FAULT_KINDS,
    ASYNC_CRASH,
    ASYNC_RETRY_WAITS,
    BOOT_SECONDS,
    CRASHES,
    DELIVERY_FAULTS,
    PHASES,
    SERVICE_ERROR,
    THROTTLED,
    Chaos,
    ChaosKind,
    ChaosOdds,
    ChaosReport,
    Injected,
    SeedRun,
    agent_fault,
    delivery_delays,
    interruption_offset,
    invocation_fault,
    launch_refusal,
    parse_seeds,
    report_lines,
    store_fault,
    summary,
)
from spotrelay.local.lambdas import InProcessLambdas
from spotrelay.local.patches import Undeliverable
from spotrelay.local.workers import BOOT
from spotrelay.models import Market, Pool

from .conftest import REPO_ROOT, START
from .test_lambdas import ProbeFunction

EVERY = frozenset(ChaosKind)
FUNCTIONS = {m: f"SpotRelay-{m}-X" for m in ("dispatcher", "ec2_events", "reconcile", "place", "launch", "cancel")}
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.SPOT)


def arn(module: str) -> str:
    return f"arn:aws:lambda:us-east-1:123456789012:function:{FUNCTIONS[module]}"


class Agenda:
    """The replay's part the chaos uses: a clock's now, timed actions, a timeline."""

    def __init__(self) -> None:
        self.at = START
        self.actions: list[tuple[datetime, int, Callable[[], None]]] = []
        self.notes: list[str] = []

    def now(self) -> datetime:
        return self.at

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None:
        self.actions.append((max(when, self.at), len(self.actions), action))

    def note(self, job: str, text: str, when: datetime | None = None) -> None:
        self.notes.append(text)

    def run(self) -> None:
        while self.actions:
            self.actions.sort(key=lambda a: (a[0], a[1]))
            when, _, action = self.actions.pop(0)
            self.at = when
            action()


class Sends:
    """A delivery's `send`: when it was made, failing the first `failures` times."""

    def __init__(self, agenda: Agenda, failures: int = 0) -> None:
        self.agenda, self.failures, self.at = agenda, failures, list[float]()

    def __call__(self) -> str | None:
        self.at.append((self.agenda.now() - START).total_seconds())
        return "function error: boom" if len(self.at) <= self.failures else None


def attached(odds: ChaosOdds, seed: int = 1) -> tuple[Chaos, Agenda]:
    chaos, agenda = Chaos(seed, odds), Agenda()
    chaos.attach(agenda, FUNCTIONS)
    return chaos, agenda


NO_FAULTS = ChaosOdds(
    drop=0, duplicate=0, delay=0, crash=0, task_crash=0, insufficient_capacity=0, request_limit_exceeded=0
)
EVENT = {"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {"instance-id": "i-0abc"}}
NOWHERE = Undeliverable(give_up=lambda code, message: None, after_seconds=3600)  # a delivery never given up on


# ------------------------------------------------------------------------------------------ decisions


def test_the_same_seed_makes_the_same_decisions_and_another_seed_others() -> None:
    def decisions(seed: int) -> list[Any]:
        rng, odds = random.Random(seed), ChaosOdds()
        return [delivery_delays(rng, odds, EVERY) for _ in range(200)]

    assert decisions(3) == decisions(3)
    assert decisions(3) != decisions(4)


def test_delivery_faults_come_at_their_odds_within_their_bounds() -> None:
    # Given the default odds, When 20 000 deliveries are decided
    rng, odds = random.Random(11), ChaosOdds()
    decided = [delivery_delays(rng, odds, EVERY) for _ in range(20_000)]
    # Then each fault comes about as often as its odds say, and its copies arrive within its bounds
    share = {kind: sum(1 for _, k in decided if k is kind) / len(decided) for kind in ChaosKind}
    assert share[ChaosKind.DROP] == pytest.approx(odds.drop, abs=0.01)
    assert share[ChaosKind.DUPLICATE] == pytest.approx(odds.duplicate, abs=0.01)
    assert share[ChaosKind.DELAY] == pytest.approx(odds.delay, abs=0.01)
    for delays, kind in decided:
        if kind is None:
            assert delays == (0.0,)
        elif kind is ChaosKind.DROP:
            assert delays == ()
        elif kind is ChaosKind.DUPLICATE:
            assert delays[0] == 0.0
            assert 0.0 <= delays[1] <= odds.max_duplicate_lag_seconds
        else:
            (delay,) = delays
            assert 1.0 <= delay <= odds.max_delay_seconds


def test_a_fault_the_target_does_not_allow_is_no_fault() -> None:
    always = ChaosOdds(drop=0.5, duplicate=0.0, delay=0.5)
    rng = random.Random(5)
    reconcile = DELIVERY_FAULTS["reconcile"]
    assert {delivery_delays(rng, always, reconcile) for _ in range(100)} == {((0.0,), None)}
    assert not {ChaosKind.DROP, ChaosKind.DELAY, ChaosKind.CRASH_BEFORE} & reconcile  # its timing is the net's


def test_invocation_faults_split_before_and_after_and_respect_what_is_allowed() -> None:
    rng = random.Random(2)
    kinds = [invocation_fault(rng, 1.0, CRASHES) for _ in range(2_000)]
    assert set(kinds) == CRASHES
    assert kinds.count(ChaosKind.CRASH_BEFORE) / len(kinds) == pytest.approx(0.5, abs=0.05)
    only_after = frozenset({ChaosKind.CRASH_AFTER})
    assert {invocation_fault(rng, 1.0, only_after) for _ in range(200)} == {ChaosKind.CRASH_AFTER, None}
    assert sum(invocation_fault(rng, 0.2, CRASHES) is not None for _ in range(5_000)) / 5_000 == pytest.approx(
        0.2, abs=0.02
    )


def test_launch_refusals_come_at_their_odds() -> None:
    rng, odds = random.Random(9), ChaosOdds()
    kinds = [launch_refusal(rng, odds) for _ in range(20_000)]
    share = {kind: kinds.count(kind) / len(kinds) for kind in ChaosKind}
    assert share[ChaosKind.INSUFFICIENT_CAPACITY] == pytest.approx(odds.insufficient_capacity, abs=0.01)
    assert share[ChaosKind.REQUEST_LIMIT_EXCEEDED] == pytest.approx(odds.request_limit_exceeded, abs=0.005)


def test_dynamodb_faults_come_at_their_odds_and_conflicts_only_on_versioned_writes() -> None:
    rng, odds = random.Random(5), ChaosOdds()
    versioned = [store_fault(rng, odds, versioned=True) for _ in range(20_000)]
    other = [store_fault(rng, odds, versioned=False) for _ in range(20_000)]
    assert versioned.count(ChaosKind.STORE_THROTTLED) / 20_000 == pytest.approx(odds.store_throttled, abs=0.005)
    assert versioned.count(ChaosKind.STORE_CONFLICT) / 20_000 == pytest.approx(odds.store_conflict, abs=0.006)
    assert other.count(ChaosKind.STORE_THROTTLED) / 20_000 == pytest.approx(odds.store_throttled, abs=0.005)
    assert ChaosKind.STORE_CONFLICT not in other  # a write with no version to lose to (a create, a block)


def test_agent_faults_come_at_their_odds_of_every_kind_within_the_instances_run() -> None:
    from spotrelay.local.faults import FaultKind

    rng, odds = random.Random(3), ChaosOdds()
    faults = [
        agent_fault(rng, odds, job="train", attempt=2, launched_hours=1.0, run_seconds=3600.0) for _ in range(4000)
    ]
    chosen = [f for f in faults if f is not None]
    assert len(chosen) / len(faults) == pytest.approx(odds.agent_fault, abs=0.02)
    assert {f.kind for f in chosen} == set(AGENT_FAULT_KINDS)  # each kind comes up
    # never a crash or a hang of the job itself: those fail it on purpose
    assert set(AGENT_FAULT_KINDS) == set(FaultKind) - {FaultKind.JOB_CRASH, FaultKind.JOB_HANG}
    for f in chosen:
        assert (f.job, f.attempt) == ("train", 2)
        assert f.kind is FaultKind.IGNORE_SIGTERM or 1.0 + BOOT_SECONDS / 3600 <= f.at <= 2.0 + BOOT_SECONDS / 3600


def test_interruptions_fall_in_every_phase_within_the_instances_life() -> None:
    rng, odds = random.Random(4), ChaosOdds(interruption=1.0)
    run, interval = 2 * 3600.0, 900.0
    planned = [interruption_offset(rng, odds, run_seconds=run, checkpoint_seconds=interval) for _ in range(1_000)]
    assert all(p is not None for p in planned)
    by_phase: dict[str, list[float]] = {}
    for phase, offset in (p for p in planned if p is not None):
        by_phase.setdefault(phase, []).append(offset)
    assert set(by_phase) == set(PHASES)
    assert BOOT.total_seconds() == BOOT_SECONDS
    assert max(by_phase["launching"]) <= BOOT_SECONDS  # before the agent starts
    assert all(BOOT_SECONDS <= o <= BOOT_SECONDS + 120 for o in by_phase["restoring"])
    assert all(BOOT_SECONDS + run - 300 <= o <= BOOT_SECONDS + run + 60 for o in by_phase["finishing"])
    for offset in by_phase["checkpointing"]:  # around a periodic checkpoint
        since = (offset - BOOT_SECONDS) % interval
        assert since <= 30 or since >= interval - 5
    never = ChaosOdds(interruption=0.0)
    assert interruption_offset(rng, never, run_seconds=run, checkpoint_seconds=interval) is None


def test_seeds_are_read_as_ranges_and_lists() -> None:
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    assert parse_seeds("5") == [5]
    for bad in ("", "3-1", "a", "1-"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)


# ------------------------------------------------------------------------------------------ mechanics


def test_a_dropped_delivery_is_never_made_and_goes_to_the_target_dlq_when_its_retries_run_out() -> None:
    chaos, agenda = attached(ChaosOdds(drop=1.0))
    send = Sends(agenda)
    given_up: list[tuple[float, str, str]] = []
    undeliverable = Undeliverable(
        give_up=lambda code, message: given_up.append(((agenda.now() - START).total_seconds(), code, message)),
        after_seconds=3600,
    )
    chaos.deliver("rule", arn("ec2_events"), EVENT, send, undeliverable)
    agenda.run()
    assert send.at == []
    ((injected),) = chaos.injected
    assert (injected.kind, injected.target) == (ChaosKind.DROP, "ec2_events")
    assert "i-0abc" in injected.detail
    assert "target's DLQ 3600 s later" in injected.detail
    [(at, code, _)] = given_up
    assert (at, code) == (3600.0, "THROTTLING")


def test_a_duplicated_delivery_is_made_now_and_once_more_later() -> None:
    chaos, agenda = attached(ChaosOdds(drop=0, duplicate=1.0))
    send = Sends(agenda)
    chaos.deliver("rule", arn("dispatcher"), EVENT, send, NOWHERE)
    assert send.at == [0.0]
    agenda.run()
    assert len(send.at) == 2
    assert 0.0 <= send.at[1] <= ChaosOdds().max_duplicate_lag_seconds
    assert [i.kind for i in chaos.injected] == [ChaosKind.DUPLICATE]


def test_a_delayed_delivery_is_made_later_on_the_clock_and_so_after_one_sent_meanwhile() -> None:
    chaos, agenda = attached(ChaosOdds(drop=0, duplicate=0, delay=1.0, max_delay_seconds=120))
    late = Sends(agenda)
    chaos.deliver("rule", arn("ec2_events"), EVENT, late, NOWHERE)
    assert late.at == []
    on_time = Sends(agenda)
    chaos.deliver("rule", arn("reconcile"), EVENT, on_time, NOWHERE)  # reconcile's deliveries are never delayed
    agenda.run()
    assert on_time.at == [0.0]
    assert len(late.at) == 1
    assert 1.0 <= late.at[0] <= 120.0


def test_a_failed_asynchronous_invocation_is_retried_one_then_two_minutes_later_then_given_up() -> None:
    chaos, agenda = attached(NO_FAULTS)
    always_failing = Sends(agenda, failures=10)
    chaos.deliver("rule", arn("ec2_events"), EVENT, always_failing, NOWHERE)
    agenda.run()
    first, second = ASYNC_RETRY_WAITS
    assert always_failing.at == [0.0, first, first + second]  # three attempts in all, as Lambda makes them
    assert "discards" in agenda.notes[-1]


def test_a_retry_that_succeeds_is_the_last() -> None:
    chaos, agenda = attached(NO_FAULTS)
    failing_once = Sends(agenda, failures=1)
    chaos.deliver("rule", arn("dispatcher"), EVENT, failing_once, NOWHERE)
    agenda.run()
    assert failing_once.at == [0.0, ASYNC_RETRY_WAITS[0]]


def test_an_asynchronous_invocation_fails_with_a_crash_a_task_invocation_with_a_service_error() -> None:
    chaos, _ = attached(ChaosOdds(crash=1.0, task_crash=1.0, drop=0, duplicate=0, delay=0))
    faults: list[Any] = []

    def send() -> str | None:
        faults.append(chaos.fault_for(FUNCTIONS["ec2_events"]))  # the delivery's own invocation
        faults.append(chaos.fault_for(FUNCTIONS["dispatcher"]))  # one it makes: not asynchronous
        return None

    chaos.deliver("rule", arn("ec2_events"), EVENT, send, NOWHERE)
    own, nested = faults
    assert own is not None
    assert own.error_type == ASYNC_CRASH
    assert nested is None
    for _ in range(50):  # the Step Functions tasks' invocations: errors their Retry covers
        fault = chaos.fault_for(FUNCTIONS["place"])
        assert fault is not None
        assert fault.error_type == (SERVICE_ERROR if fault.after_handler else THROTTLED)
    assert chaos.fault_for(FUNCTIONS["cancel"]) is None  # nobody's task: not failed
    assert chaos.fault_for(FUNCTIONS["dispatcher"]) is None  # not inside a delivery


def test_the_state_machines_retry_covers_the_errors_a_failed_task_invocation_gets(synthesized_template: Path) -> None:
    template = json.loads(synthesized_template.read_text())
    (machine,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    states = json.loads("".join(p if isinstance(p, str) else "x" for p in parts))["States"]
    tasks = {name: state for name, state in states.items() if state["Type"] == "Task"}
    assert set(tasks) >= {"Place", "Run", "Recover", "Finalize"}
    for name, task in tasks.items():
        retried = {error for retry in task.get("Retry", []) for error in retry["ErrorEquals"]}
        assert {THROTTLED, SERVICE_ERROR} <= retried, name
        # and for long enough to wait out the control plane down for 30 minutes (capped backoff)
        [service] = [r for r in task["Retry"] if SERVICE_ERROR in r["ErrorEquals"]]
        assert THROTTLED in service["ErrorEquals"], name
        waits = [
            min(service["IntervalSeconds"] * service["BackoffRate"] ** n, service.get("MaxDelaySeconds", 1e9))
            for n in range(service["MaxAttempts"])
        ]
        assert sum(waits) >= 30 * 60, name


def test_refused_launches_say_what_ec2_says() -> None:
    chaos, _ = attached(ChaosOdds(insufficient_capacity=0.5, request_limit_exceeded=0.5))
    codes = set()
    for _ in range(40):
        error = chaos.refuse_launch(POOL)
        assert error is not None
        codes.add((error.code, error.status))
    assert codes == {("InsufficientInstanceCapacity", 500), ("RequestLimitExceeded", 503)}
    assert {i.target for i in chaos.injected} == {POOL.offering}


def test_the_report_counts_and_lists_the_first_injections() -> None:
    at = START + timedelta(minutes=1)
    late = [Injected(at, ChaosKind.DELAY, "dispatcher", f"late {n}") for n in range(10)]
    injected = (*late, Injected(at, ChaosKind.DROP, "ec2_events", "gone"))
    report = ChaosReport(5, injected)
    assert report.counts() == {"delay": 10, "drop": 1}
    lines = summary(report, shown=3)
    assert lines[0] == "chaos (seed 5): 11 injections: delay 10, drop 1"
    assert lines[1] == "  2026-11-30T00:01:00Z  delay  dispatcher: late 0"
    assert lines[-1] == "  ... 8 more (--json lists them all)"
    assert report.to_json()["injected"][0] == {
        "at": "2026-11-30T00:01:00Z",
        "kind": "delay",
        "target": "dispatcher",
        "detail": "late 0",
    }


def test_the_runner_lists_each_failing_seed_with_its_command() -> None:
    ok = SeedRun("s.yaml", "s", 1, 2.0, {"delay": 2}, {"SUCCEEDED": 1})
    broken = SeedRun("s.yaml", "s", 2, 2.0, {}, {"RUNNING": 1}, ("orphan-instance j: i-1 runs 30 min",))
    lines = report_lines([ok, broken], wall_seconds=4.0, processes=2)
    assert "2 replays (2 seeds x 1 scenarios: s)" in lines[1]
    assert "1 with a violation" in lines[1]
    assert lines[-1] == "  spotrelay replay s.yaml --chaos 2    # orphan-instance j: i-1 runs 30 min"


# --------------------------------------------------------------------------------- the invocation hook


HANDLER = """\
CALLS = []


def handler(event, context):
    CALLS.append(event)
    return {"done": True}
"""


class OneFault:
    def __init__(self, after_handler: bool) -> None:
        self.after_handler = after_handler

    def fault_for(self, function_name: str) -> Any:
        from spotrelay.local.lambdas import InvocationFault

        return InvocationFault("Lambda.ServiceException", after_handler=self.after_handler)


@pytest.mark.parametrize("after_handler", [False, True])
def test_an_injected_fault_fails_the_invocation_before_or_after_the_handler(
    tmp_path: Path, clock: Any, after_handler: bool
) -> None:
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "probe.py").write_text(HANDLER)
    lambdas = InProcessLambdas(clock, code_root=tmp_path)
    lambdas.faults = OneFault(after_handler)
    function = ProbeFunction("probe", {})
    try:
        payload, errored, _ = lambdas.invoke(function, {"n": 1})
        module = lambdas.module_for(function)
    finally:
        lambdas.unload()
    envelope = json.loads(payload)
    assert errored
    assert envelope["errorType"] == "Lambda.ServiceException"
    handled = module.CALLS
    assert handled == ([{"n": 1}] if after_handler else [])  # after: its work is done
    (record,) = lambdas.invocations
    assert record.error_type == "Lambda.ServiceException"
    assert record.result == ({"done": True} if after_handler else None)


# ------------------------------------------------------------------------------------------- replays

SCENARIO = REPO_ROOT / "events" / "scenarios" / "happy-path.yaml"
REPLAYED_SEEDS = (1, 2)
_REPLAYS: dict[int, Any] = {}


def _replayed(seed: int, template: Path, *, again: bool = False) -> Any:
    from spotrelay.local.replay import replay
    from spotrelay.local.scenario import load_scenario

    if again or seed not in _REPLAYS:
        result = replay(load_scenario(SCENARIO), chaos=seed, template=template)
        if again:
            return result
        _REPLAYS[seed] = result
    return _REPLAYS[seed]


@pytest.mark.parametrize("seed", REPLAYED_SEEDS)
def test_a_chaos_seed_breaks_no_invariant(seed: int, synthesized_template: Path) -> None:
    result = _replayed(seed, synthesized_template)
    assert result.chaos is not None
    assert result.chaos.seed == seed
    assert result.chaos.injected, "a replay of two hours under chaos injects something"
    assert result.invariant_checks > 0
    assert result.violations == [], [v.detail for v in result.violations]
    assert result.passed
    assert result.to_json()["chaos"] == result.chaos.to_json()


def test_an_agent_that_dies_under_chaos_costs_a_relaunch_not_the_job(synthesized_template: Path) -> None:
    result = _replayed(2, synthesized_template)  # seed 2: attempt 1's agent dies 15 minutes in
    assert result.chaos is not None
    [fault] = [i for i in result.chaos.injected if i.kind is ChaosKind.AGENT_FAULT]
    assert fault.detail.startswith("agent-dies at +15 min")
    [job] = result.jobs
    assert job.state == "SUCCEEDED"
    assert job.attempts[0].outcome in ("LOST", "INTERRUPTED")
    assert result.violations == []


def test_a_chaos_seed_replays_the_same_way(synthesized_template: Path) -> None:
    seed = REPLAYED_SEEDS[0]
    first = _replayed(seed, synthesized_template)
    again = _replayed(seed, synthesized_template, again=True)
    assert again.chaos.to_json() == first.chaos.to_json()
    assert [j.to_json() for j in again.jobs] == [j.to_json() for j in first.jobs]
    assert [(e.at, e.text) for e in again.timeline] == [(e.at, e.text) for e in first.timeline]


def test_under_chaos_only_a_broken_invariant_fails_the_replay(synthesized_template: Path) -> None:
    from spotrelay.local.invariants import Violation
    from spotrelay.local.replay import ExpectationResult

    result = _replayed(REPLAYED_SEEDS[0], synthesized_template)
    unmet = [ExpectationResult(e.expectation, False, "unmet") for e in result.expectations]
    assert unmet
    assert dataclasses.replace(result, expectations=unmet).passed  # chaos may cost more, take more attempts
    assert not dataclasses.replace(result, expectations=unmet, chaos=None).passed
    broken = Violation("orphan-instance", "j", "i-1 runs 30 min", result.ended_at)
    assert not dataclasses.replace(result, violations=[broken]).passed


def test_the_cli_prints_the_injections_before_the_invariants(synthesized_template: Path) -> None:
    from spotrelay.cli.app import app

    answer = CliRunner().invoke(app, ["replay", str(SCENARIO), "--chaos", "3"])
    assert answer.exit_code == 0, answer.stdout[-3000:]
    lines = answer.stdout.splitlines()
    chaos = next(n for n, line in enumerate(lines) if line.startswith("chaos (seed 3): "))
    invariants = next(n for n, line in enumerate(lines) if line.startswith("invariants: "))
    assert chaos < invariants
    assert lines[0].startswith("scenario happy-path (seed 7, chaos seed 3)")
    assert "expectations (not binding under chaos: only the invariants are)" in lines
