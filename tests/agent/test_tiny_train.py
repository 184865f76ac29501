"""events/jobs/tiny_train.py, the walk-through's toy job, as the agent runs it: the real script in its own
process. Its epochs are 0 s here (no waiting) or an hour (it waits until the test sends SIGTERM, which it
does once the script has printed the epoch it waits for): no test depends on how fast anything runs. A
timeout here is a hang guard, never a bound under test."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from waiting import POLLING, eventually

from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME
from spotrelay.agent.runner import (
    ENV_CHECKPOINT_DIR,
    ENV_RESUMED,
    JobRunner,
    JobVanished,
    RunningJob,
    job_command,
    job_environment,
)
from spotrelay.models import RunSpec, load_job_spec

STARTED_AT = datetime(2026, 11, 30, 12, tzinfo=UTC)  # what the runner records as the start; nothing reads a clock
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "events" / "jobs" / "tiny_train.py"
JOB_FILE = REPO / "events" / "jobs" / "tiny-train.yaml"
HANG_GUARD_SECONDS = 60.0
WAITS_FOR_SIGTERM = "3600"  # --epoch-seconds: after its first epoch it waits an hour, or until SIGTERM


def environment(checkpoint_dir: Path | None = None, **variables: str) -> dict[str, str]:
    """This process's environment without the agent's variables, plus `checkpoint_dir` and `variables`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SPOTRELAY_")}
    if checkpoint_dir is not None:
        env[ENV_CHECKPOINT_DIR] = str(checkpoint_dir)
    return env | variables


def run_job(cwd: Path, *arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
        check=False,
    )


class StartedJob:
    """The script started in its own process, its stdout read line by line as it prints. A context manager:
    a process a failing test leaves running is killed on the way out."""

    def __init__(self, cwd: Path, *arguments: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(SCRIPT), *arguments],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> StartedJob:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=HANG_GUARD_SECONDS)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)  # its stdout closed: it has ended

    def read_until(self, wanted: str) -> list[str]:
        """Its lines up to and including the first that starts with `wanted`, as soon as it has printed it."""
        lines: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=HANG_GUARD_SECONDS)
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} after {HANG_GUARD_SECONDS} s; printed {lines}") from None
            if line is None:
                raise AssertionError(f"it ended without printing {wanted!r}; printed {lines}")
            lines.append(line)
            if line.startswith(wanted):
                return lines

    def finish(self) -> tuple[int, list[str], str]:
        """Its exit status, the rest of its lines and its stderr, once it has ended."""
        code = self.process.wait(timeout=HANG_GUARD_SECONDS)
        self._reader.join(timeout=HANG_GUARD_SECONDS)
        lines: list[str] = []
        while (line := self._lines.get_nowait()) is not None:
            lines.append(line)
        assert self.process.stderr is not None
        return code, lines, self.process.stderr.read()


def epoch_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("epoch ")]


def epochs_printed(lines: list[str]) -> list[int]:
    return [int(line.split()[1].split("/")[0]) for line in epoch_lines(lines)]


def state(checkpoint_dir: Path) -> Any:
    return json.loads((checkpoint_dir / "state.json").read_text())


def uninterrupted_state(tmp_path: Path) -> Any:
    checkpoint_dir = tmp_path / "straight-through"
    assert run_job(tmp_path, "--epoch-seconds", "0", env=environment(checkpoint_dir)).returncode == 0
    return state(checkpoint_dir)


def stopped_at_epoch_1(tmp_path: Path, checkpoint_dir: Path) -> tuple[int, list[str]]:
    """A run stopped by SIGTERM while it waits after its first epoch: its exit status and all it printed."""
    with StartedJob(tmp_path, "--epoch-seconds", WAITS_FOR_SIGTERM, env=environment(checkpoint_dir)) as job:
        printed = job.read_until("epoch 1/12 ")
        job.process.send_signal(signal.SIGTERM)
        code, rest, _ = job.finish()
    return code, printed + rest


def test_a_full_run_trains_twelve_epochs_and_its_loss_goes_down(tmp_path: Path) -> None:
    # Given no SPOTRELAY_CHECKPOINT_DIR (a run by hand)
    # When the job runs with the default 12 epochs, taking no time each
    result = run_job(tmp_path, "--epoch-seconds", "0", env=environment())

    # Then it prints one line per epoch and a last line with a loss below the first epoch's, and exits 0
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert epochs_printed(lines) == list(range(1, 13))
    first_loss = float(epoch_lines(lines)[0].split()[3])
    assert lines[-1].startswith("done: 12 epochs, loss ")
    final_loss = float(lines[-1].split()[-1])
    assert final_loss < first_loss / 10
    # and its state is in ./checkpoint: every epoch's loss and weights near y = 3x + 1
    saved = state(tmp_path / "checkpoint")
    assert saved["epoch"] == 12
    assert saved["losses"][0] == pytest.approx(first_loss, abs=1e-6)
    assert saved["losses"][-1] == pytest.approx(final_loss, abs=1e-6)
    assert saved["w"] == pytest.approx(3.0, abs=0.1)
    assert saved["b"] == pytest.approx(1.0, abs=0.1)
    assert sorted(os.listdir(tmp_path / "checkpoint")) == ["state.json"]  # no temporary file left


def test_sigterm_writes_the_state_and_the_job_exits_0_at_once(tmp_path: Path) -> None:
    # Given a run whose epochs take an hour, which has finished its first
    # When it gets SIGTERM (the agent's, at a spot interruption notice) while it waits
    checkpoint_dir = tmp_path / "ckpt"
    code, printed = stopped_at_epoch_1(tmp_path, checkpoint_dir)

    # Then it saves and exits 0 (as the agent's own test job does) instead of waiting out the hour
    assert code == 0
    assert printed[-1] == "SIGTERM: checkpoint written at epoch 1"
    assert epochs_printed(printed) == [1]
    saved = state(checkpoint_dir)
    assert saved["epoch"] == 1
    assert len(saved["losses"]) == 1
    assert sorted(os.listdir(checkpoint_dir)) == ["state.json"]


def test_a_resumed_run_goes_on_from_the_saved_epoch_and_ends_as_an_uninterrupted_one(tmp_path: Path) -> None:
    # Given the state of a run stopped by SIGTERM after its first epoch
    checkpoint_dir = tmp_path / "ckpt"
    assert stopped_at_epoch_1(tmp_path, checkpoint_dir)[0] == 0

    # When it runs again with SPOTRELAY_RESUMED=1 on that dir (as the agent starts the next attempt)
    result = run_job(tmp_path, "--epoch-seconds", "0", env=environment(checkpoint_dir, **{ENV_RESUMED: "1"}))

    # Then it says so, does epochs 2 to 12 only, and ends with exactly the weights and losses of a run
    # that was never stopped
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("resumed from epoch 1 (of 12)")
    assert epochs_printed(lines) == list(range(2, 13))
    assert lines[-1].startswith("done: 12 epochs, loss ")
    assert state(checkpoint_dir) == uninterrupted_state(tmp_path)


@pytest.mark.parametrize(
    ("saved", "problem"),
    [
        (None, "there is no checkpoint"),
        ("{", "is unreadable: not JSON"),
        ('{"format": 1, "epoch": "two", "w": 0, "b": 0, "losses": []}', "is unreadable: epoch 'two'"),
        ('{"format": 1, "epoch": 1, "w": 0, "b": 0, "losses": []}', "is unreadable: losses is not a list of 1"),
        ('{"format": 1, "epoch": 0, "w": NaN, "b": 0, "losses": []}', "is unreadable: w is nan"),
    ],
    ids=["missing", "not-json", "epoch-not-a-number", "losses-short", "weight-not-finite"],
)
def test_resuming_without_a_usable_state_fails_and_never_starts_from_scratch(
    tmp_path: Path, saved: str | None, problem: str
) -> None:
    # Given a checkpoint dir without a state.json, or with one that is no state
    checkpoint_dir = tmp_path / "ckpt"
    checkpoint_dir.mkdir()
    if saved is not None:
        (checkpoint_dir / "state.json").write_text(saved)

    # When the job is told it resumes
    result = run_job(tmp_path, "--epoch-seconds", "0", env=environment(checkpoint_dir, **{ENV_RESUMED: "1"}))

    # Then it exits 1 saying what is wrong, trains nothing and leaves the dir as it was
    assert result.returncode == 1
    assert "SPOTRELAY_RESUMED=1 but " in result.stderr
    assert f"{checkpoint_dir / 'state.json'}" in result.stderr
    assert problem in result.stderr
    assert "not starting again from scratch" in result.stderr
    assert epoch_lines(result.stdout.splitlines()) == []
    after = (checkpoint_dir / "state.json").read_text() if (checkpoint_dir / "state.json").exists() else None
    assert after == saved


@pytest.mark.parametrize(
    ("arguments", "variables", "named"),
    [
        (["--epochs", "0"], {}, "argument --epochs: use 1 to 100000 (got 0)"),
        (["--epochs", "twelve"], {}, "argument --epochs: 'twelve' is not a whole number"),
        (["--epoch-seconds", "-1"], {}, "argument --epoch-seconds: use 0 to 86400 seconds (got -1)"),
        (["--epoch-seconds", "nan"], {}, "argument --epoch-seconds: use 0 to 86400 seconds (got nan)"),
        ([], {ENV_RESUMED: "yes"}, "SPOTRELAY_RESUMED is 'yes': use 1"),
        ([], {ENV_CHECKPOINT_DIR: ""}, "SPOTRELAY_CHECKPOINT_DIR is set but empty"),
    ],
    ids=["epochs-zero", "epochs-text", "seconds-negative", "seconds-nan", "resumed-yes", "dir-empty"],
)
def test_a_bad_argument_or_variable_is_refused_naming_it(
    tmp_path: Path, arguments: list[str], variables: dict[str, str], named: str
) -> None:
    result = run_job(tmp_path, *arguments, env=environment() | variables)
    assert result.returncode == 2
    assert named in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "checkpoint").exists()


def test_the_job_file_is_a_valid_job_spec_whose_command_runs_the_script() -> None:
    # When the job file is read as `spotrelay submit` reads it
    spec = load_job_spec(JOB_FILE)

    # Then it is the tiny-train job, a command on the instance that runs this script from the repo root
    assert spec.name == "tiny-train"
    assert spec.run.image is None
    assert spec.run.command is not None
    words = shlex.split(spec.run.command)
    assert words[:2] == ["exec", "python3"]
    assert (REPO / words[2]).resolve() == SCRIPT
    assert words[3:] == ["--epochs", "12", "--epoch-seconds", "5"]  # the script's defaults, said out loud
    assert spec.checkpoint.grace_seconds > 0  # it saves at SIGTERM: it is given time to


# --- through the agent's real job runner ------------------------------------------------------------------


@pytest.fixture
def attempts() -> Iterator[list[RunningJob]]:
    """The jobs a test started through the runner; one a failing test leaves running is killed after it."""
    started: list[RunningJob] = []
    yield started
    for job in started:
        with contextlib.suppress(JobVanished):
            if job.exit_code() is None:
                job.kill()


def start_attempt(
    tmp_path: Path, attempts: list[RunningJob], run: RunSpec, *, attempt: int, resumed: bool
) -> RunningJob:
    """`run` started as the agent starts a job (spotrelay.agent.runner), from the repo root."""
    checkpoint_dir = tmp_path / "ckpt"
    checkpoint_dir.mkdir(exist_ok=True)
    # `python3` of the job's command is this interpreter (a Python 3.11)
    base = environment() | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env = job_environment(
        run,
        job_id="tiny-train-1",
        attempt=attempt,
        checkpoint_dir=checkpoint_dir,
        resumed=resumed,
        progress_file=checkpoint_dir / PROGRESS_FILE_NAME,
        base=base,
    )
    job = JobRunner().start(
        job_command(run, job_id="tiny-train-1", attempt=attempt, checkpoint_dir=checkpoint_dir),
        env,
        exit_file=tmp_path / f"attempt-{attempt}.exit",
        log_file=tmp_path / f"attempt-{attempt}.log",
        started_at=STARTED_AT,
        cwd=REPO,
    )
    attempts.append(job)
    return job


def exit_status(job: RunningJob) -> int:
    return eventually(job.exit_code, "the job to end", on=POLLING)


def test_the_job_file_runs_under_the_agents_runner_stops_at_sigterm_and_resumes(
    tmp_path: Path, attempts: list[RunningJob]
) -> None:
    spec = load_job_spec(JOB_FILE)
    assert spec.run.command is not None

    def with_epochs_of(seconds: str) -> RunSpec:  # the job file's command, its last --epoch-seconds winning
        return spec.run.model_copy(update={"command": f"{spec.run.command} --epoch-seconds {seconds}"})

    # Given attempt 1 of the job file's command, started by the agent's runner, past its first epoch
    first = start_attempt(tmp_path, attempts, with_epochs_of(WAITS_FOR_SIGTERM), attempt=1, resumed=False)
    log_1 = tmp_path / "attempt-1.log"
    eventually(lambda: "epoch 1/12 " in log_1.read_text(), "its first epoch", on=POLLING)

    # When the runner terminates it as the agent does at a notice (SIGTERM to its process group)
    first.terminate()

    # Then it exits 0 (the script's status, not its shell's: the command execs) with its state saved
    assert exit_status(first) == 0
    assert "SIGTERM: checkpoint written at epoch 1" in log_1.read_text()
    assert state(tmp_path / "ckpt")["epoch"] == 1

    # When attempt 2 starts with the checkpoint restored (SPOTRELAY_RESUMED=1)
    second = start_attempt(tmp_path, attempts, with_epochs_of("0"), attempt=2, resumed=True)

    # Then it goes on from epoch 1 to the end
    assert exit_status(second) == 0
    lines = (tmp_path / "attempt-2.log").read_text().splitlines()
    assert lines[0].startswith("resumed from epoch 1 (of 12)")
    assert epochs_printed(lines) == list(range(2, 13))
    assert lines[-1].startswith("done: 12 epochs, loss ")
    assert state(tmp_path / "ckpt") == uninterrupted_state(tmp_path)
