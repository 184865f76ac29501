"""Scenario faults (spotrelay.local.faults): the `faults:` entries a scenario author writes, and the
S3 windows the agent's storage goes through (FaultyStorage) on the virtual clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from spotrelay.agent.ports import TransferCancelled
from spotrelay.clock import ClockEvent
from spotrelay.local.clock import VirtualClock
from spotrelay.local.faults import Fault, FaultKind, FaultyStorage, S3Unavailable
from spotrelay.local.scenario import ScenarioError, parse_scenario

from .conftest import START

# --- the scenario's `faults:` entries ------------------------------------------------------------------


def fault(**entry: Any) -> Fault:
    return Fault.model_validate({"job": "resnet50", **entry})


def scenario_error(*entries: dict[str, Any]) -> str:
    """The message a user gets for a scenario with these `faults:` entries."""
    data = {"name": "faults", "start": START.isoformat(), "faults": list(entries)}
    with pytest.raises(ScenarioError) as raised:
        parse_scenario(data, Path("."), "faults.yaml")
    return str(raised.value)


def test_durations_are_read_as_a_scenario_author_writes_them() -> None:
    # Given the entries of the module's own example
    slow = fault(attempt=2, at="40m", kind="imds-slow", seconds=3, **{"for": "10m"})
    restarts = fault(at="1h30m", kind="agent-restarts", after="30s")
    stall = fault(at="40m", kind="s3-stall", seconds="5m", **{"for": "10m"})
    # Then `at`, `for` and `after` are hours; `seconds` is seconds, as a number or a duration
    assert (slow.attempt, slow.kind) == (2, FaultKind.IMDS_SLOW)
    assert (slow.at, slow.for_hours, slow.seconds) == pytest.approx((40 / 60, 10 / 60, 3.0))
    assert (restarts.at, restarts.after) == pytest.approx((1.5, 30 / 3600))
    assert stall.seconds == pytest.approx(300.0)
    assert fault(kind="s3-stall", seconds="30s").seconds == pytest.approx(30.0)
    # and a number of seconds in quotes is still seconds (not hours)
    assert fault(kind="s3-stall", seconds="3").seconds == pytest.approx(3.0)


def test_defaults_are_attempt_1_from_the_start_for_ever() -> None:
    ignore = fault(kind="ignore-sigterm")
    assert (ignore.attempt, ignore.at, ignore.for_hours) == (1, 0.0, None)
    assert fault(kind="imds-error").status == 503
    assert fault(kind="job-crash").exit_code == 1


def test_a_window_counts_from_the_scenario_start_on_the_clock() -> None:
    # Given the scenario's start at monotonic 1000 s
    start = 1000.0
    # Then a fault at 40 m for 10 m covers [1000 + 2400, 1000 + 3000); one without `for` never ends
    assert fault(kind="s3-fail", at="40m", **{"for": "10m"}).window(start) == pytest.approx((3400.0, 4000.0))
    assert fault(kind="s3-fail", at="40m").window(start) == pytest.approx((3400.0, float("inf")))
    assert fault(kind="ignore-sigterm").window(start) == (start, float("inf"))


@pytest.mark.parametrize("kind", ["s3-stall", "imds-slow"])
def test_a_waiting_fault_without_seconds_is_refused_naming_seconds(kind: str) -> None:
    message = scenario_error({"job": "resnet50", "kind": kind, "for": "10m"})
    assert message == f"faults.yaml: faults[0]: {kind} needs seconds: how long each answer waits"


def test_agent_restarts_without_after_is_refused_naming_after() -> None:
    message = scenario_error({"job": "resnet50", "kind": "agent-restarts", "at": "40m"})
    assert "faults[0]: agent-restarts needs after" in message


def test_an_unknown_key_is_refused_naming_it() -> None:
    # Given a `duration` where the model has `for`
    message = scenario_error({"job": "resnet50", "kind": "s3-fail", "duration": "10m"})
    assert message == (
        "faults.yaml: faults[0].duration: unknown key; allowed keys here: job, attempt, kind, at, for, after, "
        "seconds, status, exit_code"
    )


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"kind": "s3-fail", "at": "10x"}, "at: '10x' is not a duration"),
        ({"kind": "s3-fail", "for": "-1h"}, "for: '-1h' is not a duration"),
        ({"kind": "agent-restarts", "after": "soon"}, "after: 'soon' is not a duration"),
        ({"kind": "s3-stall", "seconds": "a while"}, "seconds: 'a while' is not a duration"),
        ({"kind": "s3-stall", "seconds": -3}, "faults[0].seconds: Input should be greater than or equal to 0"),
        ({"kind": "imds-error", "status": 200}, "faults[0].status: Input should be greater than or equal to 500"),
        ({"kind": "imds-error", "status": 404}, "faults[0].status: Input should be greater than or equal to 500"),
        ({"kind": "job-crash", "exit_code": 0}, "faults[0].exit_code: Input should be greater than or equal to 1"),
        ({"kind": "s3-fail", "at": 1e12}, "faults[0].at: Input should be less than or equal to 8784"),
        ({"kind": "s3-stall", "seconds": "inf"}, "seconds: 'inf' is not a finite number of seconds"),
        ({"kind": "s3-stall", "seconds": True}, "seconds: a number of seconds or a duration, not true/false"),
        ({"kind": "s3-fail", "for": 0}, "faults[0].for: Input should be greater than 0"),
        ({"kind": "agent-dies", "seconds": 3}, "agent-dies takes no seconds (its own fields: none)"),
        ({"kind": "s3-fail", "status": 503}, "s3-fail takes no status (its own fields: for)"),
        ({"kind": "s3-fail", "attempt": 0}, "faults[0].attempt: Input should be greater than or equal to 1"),
        ({"kind": "disk-full"}, "faults[0].kind: Input should be 'agent-dies'"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(entry: dict[str, Any], named: str) -> None:
    assert named in scenario_error({"job": "resnet50", **entry})


def test_a_fault_without_a_job_is_refused() -> None:
    with pytest.raises(ValidationError, match="job"):
        Fault.model_validate({"kind": "s3-fail"})


# --- FaultyStorage ------------------------------------------------------------------------------------


class RecordingStorage:
    """The agent's checkpoint storage, recording what reached S3."""

    def __init__(self) -> None:
        self.uploaded: list[str] = []
        self.copied: list[str] = []
        self.manifests_read: list[str] = []

    def upload(self, items: Sequence[tuple[Path, str]], cancel: ClockEvent | None = None) -> list[str]:
        keys = [key for _, key in items]
        self.uploaded += keys
        return keys

    def copy(self, items: Sequence[tuple[str, str]], cancel: ClockEvent | None = None) -> list[str]:
        keys = [key for _, key in items]
        self.copied += keys
        return keys

    def read_manifest(self, key: str) -> str:
        self.manifests_read.append(key)
        return f"manifest {key}"


FILES = [(Path("/ckpt/state.json"), "jobs/j/1-0/state.json")]
COPIES = [("jobs/j/1-0/state.json", "jobs/j/1-1/state.json")]


def storage_with(clock: VirtualClock, *windows: tuple[FaultKind, float, float, float]) -> FaultyStorage:
    """FaultyStorage over a RecordingStorage; window times are seconds from now on the clock."""
    now = clock.monotonic()
    return FaultyStorage(
        RecordingStorage(), clock, [(kind, now + begin, now + end, seconds) for kind, begin, end, seconds in windows]
    )


def recorded(storage: FaultyStorage) -> RecordingStorage:
    assert isinstance(storage.inner, RecordingStorage)
    return storage.inner


def test_an_s3_fail_window_fails_uploads_and_copies_in_it_only(clock: VirtualClock) -> None:
    # Given S3 failing from 60 s to 120 s from now
    storage = storage_with(clock, (FaultKind.S3_FAIL, 60, 120, 0))
    s3 = recorded(storage)
    # Then before the window an upload goes through
    assert storage.upload(FILES) == ["jobs/j/1-0/state.json"]
    # When the window begins, Then uploads and copies raise, and nothing reaches S3
    clock.advance_by(60)
    with pytest.raises(S3Unavailable):
        storage.upload(FILES)
    with pytest.raises(S3Unavailable):
        storage.copy(COPIES)
    assert (s3.uploaded, s3.copied) == (["jobs/j/1-0/state.json"], [])
    # but an empty batch (nothing to send) and reads (a restore's manifest) go through
    assert storage.upload([]) == []
    assert storage.read_manifest("jobs/j/1-0/manifest.json") == "manifest jobs/j/1-0/manifest.json"
    # When the window ends (at 120 s, its end excluded), Then uploads and copies go through again
    clock.advance_by(60)
    assert storage.copy(COPIES) == ["jobs/j/1-1/state.json"]
    assert storage.upload(FILES) == ["jobs/j/1-0/state.json"]


Outcome = tuple[str, float]  # (what the call gave, virtual seconds it took)


def call_in_a_process(clock: VirtualClock, call: Callable[[], list[str]]) -> list[Outcome]:
    """Run `call` as a process of the clock (as the agent's checkpoint thread is one)."""
    outcomes: list[Outcome] = []

    def body() -> None:
        began = clock.monotonic()
        try:
            outcome = repr(call())
        except TransferCancelled as e:
            outcome = f"cancelled: {e.completed}"
        outcomes.append((outcome, round(clock.monotonic() - began, 6)))

    with clock.exclusive():
        clock.start_thread("checkpoint", body)
    clock.wait_quiescent()
    return outcomes


def test_an_s3_stall_holds_an_upload_for_its_seconds_then_lets_it_through(clock: VirtualClock) -> None:
    # Given S3 stalling each upload 300 s, from now on
    storage = storage_with(clock, (FaultKind.S3_STALL, 0, float("inf"), 300))
    # When the agent uploads
    outcomes = call_in_a_process(clock, lambda: storage.upload(FILES))
    # Then nothing has reached S3 before 300 virtual seconds, and then the upload goes through
    clock.advance_by(299)
    assert outcomes == []
    assert recorded(storage).uploaded == []
    clock.advance_by(1)
    assert outcomes == [("['jobs/j/1-0/state.json']", 300.0)]
    assert recorded(storage).uploaded == ["jobs/j/1-0/state.json"]


def test_a_stalled_copy_is_cancelled_by_the_agent(clock: VirtualClock) -> None:
    # Given S3 stalling each transfer 300 s, and a copy the agent may cancel (a periodic checkpoint)
    storage = storage_with(clock, (FaultKind.S3_STALL, 0, float("inf"), 300))
    cancel = clock.event()
    outcomes = call_in_a_process(clock, lambda: storage.copy(COPIES, cancel))
    # When the agent cancels it 10 s in (a notice came)
    clock.advance_by(10)
    with clock.exclusive():
        cancel.set()
    clock.wait_quiescent()
    # Then the copy ends at once, cancelled, and nothing was copied
    assert outcomes == [("cancelled: []", 10.0)]
    assert recorded(storage).copied == []


def test_a_stall_window_that_has_ended_does_not_hold_an_upload(clock: VirtualClock) -> None:
    # Given a stall from 0 to 60 s, When the agent uploads at 60 s, Then it goes through at once
    storage = storage_with(clock, (FaultKind.S3_STALL, 0, 60, 300))
    clock.advance_by(60)
    outcomes = call_in_a_process(clock, lambda: storage.upload(FILES))
    assert outcomes == [("['jobs/j/1-0/state.json']", 0.0)]
