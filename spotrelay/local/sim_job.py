"""The user's job on a simulated instance: a process of the virtual clock behind the agent's runner port.

The agent starts it as it starts any job (`Runner.start` with the job's argv and `SPOTRELAY_*`
environment) and watches it through the same handle (`exit_code`, `terminate`, `kill`). What the job
does, on the instance's clock:

- reads `state.json` from `$SPOTRELAY_CHECKPOINT_DIR` when `SPOTRELAY_RESUMED=1` (what the agent
  restored from S3), and goes on from the work it holds; without it, from the start;
- makes progress at `speed` reference-GPU hours per hour (the instance's GPU, spotrelay.catalog);
- saves: rewrites `state.json` (its work and a digest standing for the weights) and the progress file
  (`$SPOTRELAY_PROGRESS_FILE`, the work that state holds), atomically (write, then rename), every
  `save_seconds` (a job given grace at a notice saves every minute, as a training loop saves each
  epoch; one given no grace only on its own checkpoint interval), and prints a line each time;
- at SIGTERM saves once more within `stop_seconds` (at most its grace) and exits 0; at SIGKILL dies
  with -9 at once, what it did since its last save lost;
- exits 0 once the work is done; its exit code is also written to the exit file, as the supervisor
  does, so a restarted agent finds how it ended (`Runner.attach`).

Faults a scenario may give it (spotrelay.local.faults): crash (exit with a code at a time), hang (no
progress, no saves, no answer to SIGTERM from a time on: only SIGKILL ends it), ignore SIGTERM.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME
from spotrelay.agent.runner import ENV_CHECKPOINT_DIR, ENV_PROGRESS_FILE, ENV_RESUMED, KILLED_EXIT_CODE, JobProcess
from spotrelay.clock import ClockThread, WaitingClock

STATE_FILE = "state.json"
STEP_SAVE_SECONDS = 60.0  # a job given grace at a notice saves this often (an epoch)
STOP_SECONDS = 20.0  # a job's save at SIGTERM takes this long (at most its grace)


@dataclass(frozen=True)
class JobBehaviour:
    """What the simulated job does; the faults are times on the instance's clock (monotonic())."""

    work_hours: float
    speed: float
    save_seconds: float = STEP_SAVE_SECONDS
    stop_seconds: float = STOP_SECONDS
    crash_at: float | None = None
    crash_exit_code: int = 1
    hang_at: float | None = None
    ignore_sigterm: bool = False


class SimulatedJob:
    """One run of the job (the handle the agent holds: spotrelay.agent.runner.JobHandle)."""

    def __init__(
        self, clock: WaitingClock, behaviour: JobBehaviour, env: Mapping[str, str], record: JobProcess
    ) -> None:
        self.clock = clock
        self.behaviour = behaviour
        self._record = record
        self.dir = Path(env[ENV_CHECKPOINT_DIR])
        self.progress_file = Path(env.get(ENV_PROGRESS_FILE, str(self.dir / PROGRESS_FILE_NAME)))
        self.work_at_start = self._restored_work() if env.get(ENV_RESUMED) == "1" else 0.0
        self.started = clock.monotonic()
        self.saves = 0
        self.code: int | None = None
        self.ended_at: float | None = None
        self.sigterm_at: float | None = None
        self._hung_work: float | None = None
        self._signal = clock.event()  # SIGTERM or SIGKILL
        self._killed = False
        self._log("job started", work_done_hours=round(self.work_at_start, 6))
        self.thread: ClockThread = clock.start_thread(f"job pid {record.pid}", self._run)

    # --- the handle --------------------------------------------------------------------------------

    @property
    def record(self) -> JobProcess:
        return self._record

    @property
    def pid(self) -> int:
        return self._record.pid

    def exit_code(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        if self.code is None and self.sigterm_at is None:
            self.sigterm_at = self.clock.monotonic()
            self._signal.set()

    def kill(self) -> None:
        if self.code is None:
            self._killed = True
            self._signal.set()

    # --- the process -------------------------------------------------------------------------------

    def work(self, at: float | None = None) -> float:
        """Reference-GPU hours done by `at` (now)."""
        if self._hung_work is not None:
            return self._hung_work
        now = self.clock.monotonic() if at is None else at
        if self.ended_at is not None:
            now = min(now, self.ended_at)  # an ended job makes no more progress
        b = self.behaviour
        return min(b.work_hours, self.work_at_start + max(0.0, now - self.started) / 3600 * b.speed)

    def _finish_at(self) -> float:
        b = self.behaviour
        left = max(0.0, b.work_hours - self.work_at_start)
        return self.started + (left / b.speed * 3600 if b.speed > 0 else math.inf)

    def _run(self) -> None:
        b = self.behaviour
        next_save = self.started + b.save_seconds
        while self.code is None:
            now = self.clock.monotonic()
            wake = min(t for t in (next_save, self._finish_at(), b.crash_at, b.hang_at) if t is not None)
            if self._hung_work is not None:
                wake = math.inf
            if self._killed:
                self._exit(KILLED_EXIT_CODE)
                return
            if self.sigterm_at is not None and not b.ignore_sigterm and self._hung_work is None:
                self._on_sigterm()
                return
            if wake > now:
                self._signal.clear()
                self._signal.wait(None if math.isinf(wake) else wake - now)
                continue
            if b.hang_at is not None and now >= b.hang_at and self._hung_work is None:
                self._hung_work = self.work(now)
                self._log("job hangs")
                continue
            if b.crash_at is not None and now >= b.crash_at:
                self._log("job crashed", exit_code=b.crash_exit_code)
                self._exit(b.crash_exit_code)
                return
            if now >= self._finish_at():
                self._save(b.work_hours)
                self._log("job done", work_done_hours=b.work_hours)
                self._exit(0)
                return
            self._save(self.work(now))
            next_save = now + b.save_seconds

    def _on_sigterm(self) -> None:
        """Save within `stop_seconds` (the agent SIGKILLs at its grace), then exit 0."""
        assert self.sigterm_at is not None
        work = self.work(self.sigterm_at)  # it stops working at the signal and saves that
        self._log("SIGTERM: saving and exiting")
        self._signal.clear()
        if self._signal.wait(self.behaviour.stop_seconds) and self._killed:
            self._exit(KILLED_EXIT_CODE)
            return
        if self._killed:
            self._exit(KILLED_EXIT_CODE)
            return
        self._save(work)
        self._exit(0)

    def _save(self, work: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = {"work_done_hours": round(work, 6)}
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        for path, text in (
            (self.dir / STATE_FILE, json.dumps({**state, "weights": digest})),
            (self.progress_file, f"{work:.6f}"),
        ):
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(text)
            temporary.replace(path)
        self.saves += 1
        self._log("saved", work_done_hours=round(work, 6))

    def _exit(self, code: int) -> None:
        self.code = code
        self.ended_at = self.clock.monotonic()
        if code != KILLED_EXIT_CODE:  # the supervisor records the status; a SIGKILL of the group kills it too
            self._record.exit_file.parent.mkdir(parents=True, exist_ok=True)
            self._record.exit_file.write_text(json.dumps({"exit_code": code}))
        self._log("exited", exit_code=code)

    def _restored_work(self) -> float:
        try:
            value = float(json.loads((self.dir / STATE_FILE).read_text())["work_done_hours"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0
        return value if math.isfinite(value) and value >= 0 else 0.0

    def _log(self, text: str, **fields: object) -> None:
        line = json.dumps({"message": text, **fields}, sort_keys=True)
        self._record.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self._record.log_file.open("a") as f:
            f.write(line + "\n")


class SimulatedJobRunner:
    """The runner port for one simulated instance: starts SimulatedJobs and finds them again by pid."""

    def __init__(self, clock: WaitingClock, behaviour: JobBehaviour) -> None:
        self._pids = itertools.count(4000)
        self.clock = clock
        self.behaviour = behaviour
        self.jobs: dict[int, SimulatedJob] = {}

    def start(
        self,
        argv: list[str],
        env: Mapping[str, str],
        *,
        exit_file: Path,
        log_file: Path,
        started_at: datetime,
        container: str | None = None,
        cwd: Path | None = None,
    ) -> SimulatedJob:
        exit_file.unlink(missing_ok=True)
        record = JobProcess(
            pid=next(self._pids),
            start_ticks=None,
            exit_file=exit_file,
            log_file=log_file,
            started_at=started_at,
            container=container,
        )
        job = SimulatedJob(self.clock, self.behaviour, env, record)
        self.jobs[record.pid] = job
        return job

    def attach(self, record: JobProcess) -> SimulatedJob:
        return self.jobs[record.pid]
