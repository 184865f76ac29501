"""A spot interruption's events in any order, any number of times, give the same end. EventBridge
keeps no order: the instance's `shutting-down` or `terminated`, which AWS sends two minutes after the
warning, can be handled before the warning. The attempt ends INTERRUPTED, Recover waits for the agent's
final checkpoint, and the job is relaunched once, from that checkpoint (spotrelay.control.ec2_events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from control_builders import CHEAPEST, World, error, recorded_event

from spotrelay.control.ec2_events import Ec2Event
from spotrelay.models import AttemptOutcome, JobState

PERIODIC_WORK = 0.5  # reference-GPU hours in the attempt's last periodic checkpoint
FINAL_WORK = 0.9  # in the final checkpoint the agent commits at the notice
SHUTTING_DOWN_AFTER = 121  # seconds after the warning: AWS terminates the instance two minutes after it
TERMINATED_AFTER = 125

# What arrives, when (seconds after the warning was sent): "warning", "shutting-down", "terminated" (each
# carries the time AWS sent it), or "final": the agent commits its final checkpoint.
Timeline = list[tuple[float, str]]

ORDERS: dict[str, Timeline] = {
    "warning-then-terminated": [(0, "warning"), (60, "final"), (125, "terminated")],
    "terminated-then-warning": [(60, "final"), (125, "terminated"), (126, "warning")],
    "warning-twice-then-terminated-twice": [
        (0, "warning"),
        (1, "warning"),
        (60, "final"),
        (125, "terminated"),
        (126, "terminated"),
    ],
    "terminated-twice-then-warning-twice": [
        (60, "final"),
        (125, "terminated"),
        (126, "terminated"),
        (127, "warning"),
        (128, "warning"),
    ],
    # The agent is still committing its final checkpoint when the shutdown begins (systemd lets it finish).
    "shutting-down-before-the-final-checkpoint": [
        (121, "shutting-down"),
        (150, "final"),
        (170, "terminated"),
        (171, "warning"),
    ],
}


@dataclass
class Played:
    recoveries: list[str] = field(default_factory=list)  # what each Recover said, in order
    relaunched: bool = False


class Interruption:
    """A running job on the cheapest spot pool, and its instance's interruption events, replayed in some order
    while the state machine does what it would: Recover once the Run task fails (again every 15 s while it
    says wait_checkpoint), Place and Launch once it says relaunch."""

    def __init__(self, events_dir: Path) -> None:
        self.world = World()
        self.world.running()
        self.world.advance(minutes=30)
        self.world.checkpoint(attempt=1, seq=0, work_done_hours=PERIODIC_WORK)
        self.world.advance(minutes=30)
        self.warned_at = self.world.clock.now()
        instance_id = self.world.attempt().instance_id
        self.events = {
            "warning": recorded_event(
                events_dir, "spot-interruption-warning.json", instance_id=instance_id, at=self.warned_at
            ),
            "terminated": self._gone(events_dir, instance_id, "terminated", TERMINATED_AFTER),
            "shutting-down": self._gone(events_dir, instance_id, "shutting-down", SHUTTING_DOWN_AFTER),
        }
        self.played = Played()

    def _gone(self, events_dir: Path, instance_id: str | None, state: str, after: float) -> Ec2Event:
        at = self.warned_at + timedelta(seconds=after)
        terminated = recorded_event(events_dir, "instance-state-change-terminated.json", instance_id=instance_id, at=at)
        return terminated.model_copy(update={"detail": {**terminated.detail, "state": state}})

    def at(self, seconds: float) -> datetime:
        return self.warned_at + timedelta(seconds=seconds)

    def play(self, timeline: Timeline) -> Played:
        for seconds, what in timeline:
            if self.world.clock.now() < self.at(seconds):
                self.world.clock.current = self.at(seconds)
            if what == "final":
                self.world.checkpoint(attempt=1, seq=1, work_done_hours=FINAL_WORK, final=True)
            else:
                self.world.handle(self.events[what])
            self._state_machine()
        for _ in range(20):  # WaitForCheckpoint -> Recover, bounded by Recover's own limit
            if self.played.relaunched or not self.world.fail_results("token-1"):
                break
            self.world.advance(seconds=15)
            self._state_machine()
        return self.played

    def _state_machine(self) -> None:
        failures = self.world.fail_results("token-1")
        if self.played.relaunched or not failures:
            return
        self.played.recoveries.append(self.world.recover(failure=error(failures[0])).action)
        if self.played.recoveries[-1] == "relaunch":
            self.world.relaunched(token="token-2")
            self.played.relaunched = True


@pytest.mark.parametrize("timeline", list(ORDERS.values()), ids=list(ORDERS))
def test_every_order_and_duplicate_ends_the_attempt_interrupted_and_relaunches_once_from_the_final_checkpoint(
    events_dir: Path, timeline: Timeline
) -> None:
    # Given a running spot job with a periodic checkpoint, whose instance is interrupted
    interruption = Interruption(events_dir)
    world = interruption.world
    # When its warning, state changes and final checkpoint arrive in this order (and some twice)
    played = interruption.play(timeline)
    # Then the Run task failed once, with SpotInterrupted, and the attempt ended INTERRUPTED
    assert world.fail_results("token-1") == ["SpotInterrupted"]
    first = world.attempt(number=1)
    assert first.outcome is AttemptOutcome.INTERRUPTED
    assert first.interrupted_at is not None
    # And the job was relaunched once, resuming from the final checkpoint, not the periodic one
    assert played.recoveries.count("relaunch") == 1
    job = world.job()
    assert (job.attempts, job.interruptions, job.state) == (2, 1, JobState.LAUNCHING)
    second = world.attempt(number=2)
    assert second.work_done_hours_at_start == FINAL_WORK
    # And events that came after the relaunch left the new attempt alone: live, not interrupted, its task open
    assert (second.outcome, second.interrupted_at) == (None, None)
    assert world.fail_results("token-2") == []
    # And the pool is blocked, and shows one interruption
    assert CHEAPEST in world.blocked()
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1


def test_recover_waits_for_the_final_checkpoint_when_the_instance_went_away_before_its_warning(
    events_dir: Path,
) -> None:
    # Given a running spot job whose instance starts shutting down before its warning is handled
    interruption = Interruption(events_dir)
    world = interruption.world
    world.clock.current = interruption.at(SHUTTING_DOWN_AFTER)
    outcome = world.handle(interruption.events["shutting-down"])
    assert (outcome.action, outcome.reason) == ("interrupt", "shutting-down before any interruption warning")
    # When Recover runs while the agent is still committing its final checkpoint
    waiting = world.recover(failure=error("SpotInterrupted"))
    world.advance(seconds=waiting.wait_seconds)
    world.checkpoint(attempt=1, seq=1, work_done_hours=FINAL_WORK, final=True)
    recovered = world.recover(failure=error("SpotInterrupted"))
    # Then it waited for it, then relaunched: the job resumes from the final checkpoint
    assert (waiting.action, recovered.action) == ("wait_checkpoint", "relaunch")
    assert world.attempt().outcome is AttemptOutcome.INTERRUPTED
    assert world.job().work_done_hours == FINAL_WORK


def test_a_warning_handled_while_the_terminated_event_is_counts_and_fails_the_task_once(events_dir: Path) -> None:
    # Given the `terminated` event being handled, and its warning handled by another invocation right after
    # this one read the attempt (both see no interruption noted yet)
    interruption = Interruption(events_dir)
    world = interruption.world
    world.clock.current = interruption.at(TERMINATED_AFTER)
    late_warning: list[str] = []
    world.store.after_attempt_read.append(
        lambda: late_warning.append(world.handle(interruption.events["warning"]).action)
    )
    # When both are handled
    outcome = world.handle(interruption.events["terminated"])
    # Then the attempt is marked once (by the first write), one interruption is counted, the task failed once
    assert late_warning == ["interrupt"]
    assert outcome.action == "interrupt"
    assert world.attempt().interrupted_at == interruption.warned_at
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1
    assert world.fail_results("token-1") == ["SpotInterrupted"]
