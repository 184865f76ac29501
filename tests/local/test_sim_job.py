"""The simulated user's job (spotrelay.local.sim_job) on a virtual clock, in a tmp checkpoint dir: what
it writes and when, how it answers SIGTERM and SIGKILL, resuming, and its faults. The test plays the
agent: it starts the job through the runner port and signals it through the handle; time moves only
when the test advances the clock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME, read_progress
from spotrelay.agent.runner import ENV_CHECKPOINT_DIR, ENV_PROGRESS_FILE, ENV_RESUMED, KILLED_EXIT_CODE
from spotrelay.local.clock import VirtualClock
from spotrelay.local.sim_job import STATE_FILE, JobBehaviour, SimulatedJob, SimulatedJobRunner

SPEED = 0.5  # reference-GPU hours per hour: a GPU half as fast as a V100
PER_MINUTE = SPEED / 60  # the work of one minute on it


@dataclass
class Instance:
    """One simulated instance's view of the job: its clock, runner and files."""

    clock: VirtualClock
    root: Path

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoint"

    @property
    def exit_file(self) -> Path:
        return self.root / "state" / "job.exit"

    @property
    def log_file(self) -> Path:
        return self.root / "state" / "job.log"

    def seconds(self, job: SimulatedJob) -> float:
        """Virtual seconds since the job started."""
        return self.clock.monotonic() - job.started

    def start(self, runner: SimulatedJobRunner, *, resumed: bool = False) -> SimulatedJob:
        """Start the job as the agent does: the checkpoint dir and progress file in its environment."""
        env = {
            ENV_CHECKPOINT_DIR: str(self.checkpoint_dir),
            ENV_PROGRESS_FILE: str(self.checkpoint_dir / PROGRESS_FILE_NAME),
            ENV_RESUMED: "1" if resumed else "0",
        }
        with self.clock.exclusive():  # the agent holds the baton when it starts the job
            job = runner.start(
                ["/bin/sh", "-c", "python train.py"],
                env,
                exit_file=self.exit_file,
                log_file=self.log_file,
                started_at=self.clock.now(),
            )
        self.clock.wait_quiescent()
        return job

    def signal(self, send: Any) -> None:
        with self.clock.exclusive():
            send()
        self.clock.wait_quiescent()

    def saved_state(self) -> dict[str, Any]:
        state = json.loads((self.checkpoint_dir / STATE_FILE).read_text())
        assert isinstance(state, dict)
        return state

    def saved_work(self) -> float:
        """The work state.json holds; the progress file (what the agent reads) must say the same."""
        work = float(self.saved_state()["work_done_hours"])
        assert read_progress(self.checkpoint_dir) == pytest.approx(work, abs=1e-6)
        return work

    def exit_record(self) -> dict[str, Any] | None:
        if not self.exit_file.exists():
            return None
        record = json.loads(self.exit_file.read_text())
        assert isinstance(record, dict)
        return record

    def log_messages(self) -> list[str]:
        return [json.loads(line)["message"] for line in self.log_file.read_text().splitlines()]


@pytest.fixture
def instance(clock: VirtualClock, tmp_path: Path) -> Instance:
    return Instance(clock, tmp_path)


def runner_for(clock: VirtualClock, **behaviour: Any) -> SimulatedJobRunner:
    settings: dict[str, Any] = {"work_hours": 1.0, "speed": SPEED, "save_seconds": 60.0, "stop_seconds": 20.0}
    return SimulatedJobRunner(clock, JobBehaviour(**(settings | behaviour)))


def minutes(n: float) -> float:
    return n * 60


# --- making progress ----------------------------------------------------------------------------------------


def test_the_job_saves_its_work_at_the_gpu_speed_at_each_save(instance: Instance) -> None:
    # Given a job on a GPU at half the reference speed, saving every minute
    job = instance.start(runner_for(instance.clock))
    # Then nothing is saved before its first minute
    instance.clock.advance_by(59)
    assert not (instance.checkpoint_dir / STATE_FILE).exists()
    assert read_progress(instance.checkpoint_dir) is None

    # When each minute passes, Then state.json and the progress file hold the work of that many minutes
    instance.clock.advance_by(1)
    weights: list[str] = []
    for minute in (1, 2, 3):
        if minute > 1:
            instance.clock.advance_by(60)
        assert instance.seconds(job) == pytest.approx(minutes(minute))
        assert instance.saved_work() == pytest.approx(minute * PER_MINUTE, abs=1e-6)
        weights.append(instance.saved_state()["weights"])
    # and each save stands for new weights, written atomically (no temporary file left behind)
    assert len(set(weights)) == 3
    assert sorted(p.name for p in instance.checkpoint_dir.iterdir()) == [PROGRESS_FILE_NAME, STATE_FILE]
    # and the job says so in its log, still running
    assert instance.log_messages() == ["job started", "saved", "saved", "saved"]
    assert job.exit_code() is None
    assert job.saves == 3


@pytest.mark.parametrize("speed", [0.25, 1.0, 2.5])
def test_a_faster_gpu_saves_more_work_in_the_same_time(instance: Instance, speed: float) -> None:
    # Given the job on a GPU of `speed`, When ten minutes pass
    instance.start(runner_for(instance.clock, speed=speed))
    instance.clock.advance_by(minutes(10))
    # Then its last save holds ten minutes of work at that speed
    assert instance.saved_work() == pytest.approx(10 / 60 * speed, abs=1e-6)


def test_the_job_exits_0_once_its_work_is_done_and_writes_the_exit_file(instance: Instance) -> None:
    # Given a job of 0.05 reference hours at half speed: 6 minutes of run time
    job = instance.start(runner_for(instance.clock, work_hours=0.05))
    # When 6 minutes less a second pass, Then it still runs
    instance.clock.advance_by(minutes(6) - 1)
    assert job.exit_code() is None
    assert instance.exit_record() is None
    # When the last second passes, Then it saves all its work and exits 0, in the exit file too
    instance.clock.advance_by(1)
    assert job.exit_code() == 0
    assert instance.saved_work() == pytest.approx(0.05)
    assert instance.exit_record() == {"exit_code": 0}
    assert instance.log_messages()[-2:] == ["job done", "exited"]
    # and nothing runs any more: no later save
    instance.clock.advance_by(minutes(30))
    assert instance.saved_work() == pytest.approx(0.05)
    assert instance.clock.next_wakeup() is None


# --- SIGTERM and SIGKILL ----------------------------------------------------------------------------------


def test_at_sigterm_the_job_saves_its_work_and_exits_0_within_stop_seconds(instance: Instance) -> None:
    # Given a job that last saved at 1 minute
    job = instance.start(runner_for(instance.clock, stop_seconds=20.0))
    instance.clock.advance_by(90)
    assert instance.saved_work() == pytest.approx(1 * PER_MINUTE, abs=1e-6)
    # When it gets SIGTERM at 90 s
    instance.signal(job.terminate)
    # Then it is still saving 19 s later
    instance.clock.advance_by(19)
    assert job.exit_code() is None
    # and by 20 s it has saved the work of its 90 s and exited 0
    instance.clock.advance_by(1)
    assert job.exit_code() == 0
    assert instance.saved_work() == pytest.approx(1.5 * PER_MINUTE, abs=1e-6)
    assert instance.exit_record() == {"exit_code": 0}
    # and a second SIGTERM, or a SIGKILL, of an ended job changes nothing
    instance.signal(job.terminate)
    instance.signal(job.kill)
    assert job.exit_code() == 0


def test_sigkill_ends_the_job_at_once_and_loses_the_work_since_its_last_save(instance: Instance) -> None:
    # Given a job that last saved at 2 minutes
    job = instance.start(runner_for(instance.clock))
    instance.clock.advance_by(minutes(2.9))
    # When it is killed at 2.9 minutes
    instance.signal(job.kill)
    # Then it is dead at once (-9), the files hold the 2-minute save, and there is no exit file
    assert job.exit_code() == KILLED_EXIT_CODE
    assert instance.saved_work() == pytest.approx(2 * PER_MINUTE, abs=1e-6)
    assert instance.exit_record() is None
    # and it never saves again
    instance.clock.advance_by(minutes(10))
    assert instance.saved_work() == pytest.approx(2 * PER_MINUTE, abs=1e-6)


def test_a_sigkill_while_the_job_saves_at_sigterm_loses_that_save(instance: Instance) -> None:
    # Given a job saving at SIGTERM (at 90 s, 20 s to save)
    job = instance.start(runner_for(instance.clock, stop_seconds=20.0))
    instance.clock.advance_by(90)
    instance.signal(job.terminate)
    # When it is killed 10 s into its save
    instance.clock.advance_by(10)
    instance.signal(job.kill)
    # Then it is dead at once and its files hold its last full save (1 minute), not the work at SIGTERM
    assert job.exit_code() == KILLED_EXIT_CODE
    assert instance.saved_work() == pytest.approx(1 * PER_MINUTE, abs=1e-6)
    assert instance.exit_record() is None


# --- resuming ---------------------------------------------------------------------------------------------


def write_state(instance: Instance, text: str) -> None:
    instance.checkpoint_dir.mkdir(parents=True)
    (instance.checkpoint_dir / STATE_FILE).write_text(text)


def test_a_resumed_job_goes_on_from_the_work_in_state_json(instance: Instance) -> None:
    # Given the agent restored a state.json holding 0.9 h of a 1 h job
    write_state(instance, json.dumps({"work_done_hours": 0.9, "weights": "abc"}))
    # When the job starts resumed (SPOTRELAY_RESUMED=1)
    job = instance.start(runner_for(instance.clock), resumed=True)
    assert job.work_at_start == pytest.approx(0.9)
    # Then its first save holds 0.9 h and a minute's work
    instance.clock.advance_by(60)
    assert instance.saved_work() == pytest.approx(0.9 + PER_MINUTE, abs=1e-6)
    # and it is done after the 0.1 h left (12 minutes at half speed), not after a whole run
    instance.clock.advance_by(minutes(11) - 1)
    assert job.exit_code() is None
    instance.clock.advance_by(1)
    assert job.exit_code() == 0
    assert instance.saved_work() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("resumed", "state_text"),
    [
        (False, json.dumps({"work_done_hours": 0.5})),  # a state.json left there, but nothing restored
        (True, "{not json"),
        (True, json.dumps({"weights": "abc"})),
        (True, json.dumps({"work_done_hours": -1})),
        (True, json.dumps({"work_done_hours": "lots"})),
    ],
)
def test_a_job_without_a_usable_restored_state_starts_from_the_beginning(
    instance: Instance, resumed: bool, state_text: str
) -> None:
    write_state(instance, state_text)
    job = instance.start(runner_for(instance.clock), resumed=resumed)
    instance.clock.advance_by(60)
    assert job.work_at_start == 0.0
    assert instance.saved_work() == pytest.approx(PER_MINUTE, abs=1e-6)


def test_a_resumed_job_with_no_state_json_starts_from_the_beginning(instance: Instance) -> None:
    job = instance.start(runner_for(instance.clock), resumed=True)
    instance.clock.advance_by(60)
    assert job.work_at_start == 0.0
    assert instance.saved_work() == pytest.approx(PER_MINUTE, abs=1e-6)


# --- faults -----------------------------------------------------------------------------------------------


def test_a_crash_fault_exits_with_its_code_at_its_time(instance: Instance) -> None:
    # Given a job that crashes with exit code 3 at 150 s (a time on the instance's clock)
    crash_at = instance.clock.monotonic() + 150
    job = instance.start(runner_for(instance.clock, crash_at=crash_at, crash_exit_code=3))
    # Then it runs (and saves) until then
    instance.clock.advance_by(149)
    assert job.exit_code() is None
    # and at 150 s it exits 3, recorded in the exit file, with its 2-minute save as its last
    instance.clock.advance_by(1)
    assert job.exit_code() == 3
    assert instance.exit_record() == {"exit_code": 3}
    assert instance.saved_work() == pytest.approx(2 * PER_MINUTE, abs=1e-6)
    assert "job crashed" in instance.log_messages()


def test_a_hung_job_stops_saving_ignores_sigterm_and_ends_only_at_sigkill(instance: Instance) -> None:
    # Given a job that hangs at 90 s
    job = instance.start(runner_for(instance.clock, hang_at=instance.clock.monotonic() + 90))
    # When an hour passes, Then it saved at 1 minute and never again
    instance.clock.advance_by(minutes(60))
    assert instance.saved_work() == pytest.approx(1 * PER_MINUTE, abs=1e-6)
    assert job.saves == 1
    assert job.exit_code() is None
    assert job.work() == pytest.approx(1.5 * PER_MINUTE, abs=1e-6)  # no progress since it hung
    # When it gets SIGTERM, Then even long after its stop_seconds it neither saves nor exits
    instance.signal(job.terminate)
    instance.clock.advance_by(minutes(5))
    assert job.exit_code() is None
    assert job.saves == 1
    # When it is killed, Then it is dead at once
    instance.signal(job.kill)
    assert job.exit_code() == KILLED_EXIT_CODE
    assert instance.exit_record() is None


def test_a_job_ignoring_sigterm_goes_on_working_until_sigkill(instance: Instance) -> None:
    # Given a job that ignores SIGTERM, signalled at 90 s
    job = instance.start(runner_for(instance.clock, ignore_sigterm=True))
    instance.clock.advance_by(90)
    instance.signal(job.terminate)
    # When its stop_seconds and more pass, Then it has not exited and keeps saving every minute
    instance.clock.advance_by(minutes(2))  # to 3.5 minutes
    assert job.exit_code() is None
    assert instance.saved_work() == pytest.approx(3 * PER_MINUTE, abs=1e-6)
    # When it is killed, Then it dies at once, losing what it did since its 3-minute save
    instance.signal(job.kill)
    assert job.exit_code() == KILLED_EXIT_CODE
    assert instance.saved_work() == pytest.approx(3 * PER_MINUTE, abs=1e-6)


# --- the runner port ------------------------------------------------------------------------------------


def test_the_runner_finds_a_job_again_by_its_record_and_clears_a_stale_exit_file(instance: Instance) -> None:
    # Given an exit file left by an earlier run of the job
    instance.exit_file.parent.mkdir(parents=True)
    instance.exit_file.write_text(json.dumps({"exit_code": 1}))
    runner = runner_for(instance.clock)
    # When the agent starts the job, Then the stale exit file is gone: the new run has not ended
    job = instance.start(runner)
    assert instance.exit_record() is None
    assert job.exit_code() is None
    # and a restarted agent re-attaching with the record from its state file gets the same job back
    record = type(job.record).model_validate_json(job.record.model_dump_json())
    assert runner.attach(record) is job
    assert (record.exit_file, record.log_file) == (instance.exit_file, instance.log_file)
    # and a second start is another process with its own pid
    other = instance.start(runner)
    assert other.pid != job.pid
    assert runner.attach(other.record) is other
