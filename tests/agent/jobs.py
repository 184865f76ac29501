"""The tiny job the agent tests run, and how a test steers it.

`ScriptedJob` is that job on the virtual clock, behind the runner port (the agent's logic tests). The real
one (`JOB_SCRIPT`, steered through files in a control dir) runs where the real process is the subject
(test_restart's end-to-end test of `spotrelay agent`).

The real job records what it saw at start (`seen-<attempt>.json`: SPOTRELAY_RESUMED and the sha256 of
every file in its checkpoint dir) and appends one line per start to `runs.log` (its side effect).
It writes `weights.bin` once (atomically) and says `ready-<attempt>`. Then it waits for the test:
- `step-<attempt>-<k>`: rewrite `step.txt` with k and the progress file, then say `stepped-<attempt>-<k>`;
- `exit-<attempt>` containing N: print 30 numbered lines and exit with N.
On SIGTERM it saves `final.bin` (its final checkpoint) and progress 1.5, then exits 0.
"""

from __future__ import annotations

import itertools
import json
import random
import shlex
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from spotrelay.agent.checkpoint_contents import sha256_of
from spotrelay.agent.runner import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_PROGRESS_FILE,
    ENV_RESUMED,
    KILLED_EXIT_CODE,
    JobProcess,
)
from spotrelay.clock import WaitingClock

JOB_SCRIPT = r"""
import hashlib, json, os, pathlib, signal, sys, time

ckpt = pathlib.Path(os.environ["SPOTRELAY_CHECKPOINT_DIR"])
control = pathlib.Path(sys.argv[1])
attempt = os.environ["SPOTRELAY_ATTEMPT"]
progress = pathlib.Path(os.environ["SPOTRELAY_PROGRESS_FILE"])


def save(name, data):
    tmp = ckpt / (name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, ckpt / name)


def on_term(signum, frame):
    save("final.bin", (f"final checkpoint of attempt {attempt}\n" * 2000).encode())
    progress.write_text("1.5")
    print("saved the final checkpoint", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
seen = {
    p.relative_to(ckpt).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(ckpt.rglob("*")) if p.is_file()
}
(control / f"seen-{attempt}.json").write_text(json.dumps({"resumed": os.environ["SPOTRELAY_RESUMED"], "files": seen}))
with open(control / "runs.log", "a") as f:
    f.write(f"attempt {attempt} resumed={os.environ['SPOTRELAY_RESUMED']}\n")
if not (ckpt / "weights.bin").exists():
    save("weights.bin", os.urandom(300_000))
print(f"attempt {attempt} started", flush=True)
(control / f"ready-{attempt}").write_text("")
step = 1
while True:
    if (control / f"step-{attempt}-{step}").exists():
        save("step.txt", f"step {step} of attempt {attempt}\n".encode())
        progress.write_text(str(step / 10))
        (control / f"stepped-{attempt}-{step}").write_text("")
        step += 1
    exit_file = control / f"exit-{attempt}"
    text = exit_file.read_text().strip() if exit_file.exists() else ""
    if text:  # (not an empty file: the test's write_text creates it, then writes)
        code = int(text)
        for i in range(30):
            print(f"line {i} of attempt {attempt}", flush=True)
        sys.exit(code)
    time.sleep(0.01)
"""


def write_job(tmp_path: Path) -> tuple[str, Path]:
    """The job's command line and its control dir."""
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(control))}", control


# --- the scripted job: the same job behind the runner port, on the virtual clock ---------------------


class ScriptedJob:
    """The test job as a process of the virtual clock (a `JobHandle`), steered by the test instead of
    control files: what it saw at start (`resumed`, `files_at_start`), `step(k)` and `exit(code)` as the
    real job does them.
    At SIGTERM it saves `final.bin` and progress 1.5 `term_seconds` later (virtual) and exits 0, or, with
    `ignores_sigterm`, goes on until SIGKILL (-9, at once). Call `step`/`exit` inside `clock.exclusive()`."""

    def __init__(
        self,
        clock: WaitingClock,
        env: Mapping[str, str],
        record: JobProcess,
        runs: list[str],
        *,
        term_seconds: float,
        ignores_sigterm: bool,
    ) -> None:
        self.clock = clock
        self._record = record
        self.dir = Path(env[ENV_CHECKPOINT_DIR])
        self.progress = Path(env[ENV_PROGRESS_FILE])
        self.attempt = env[ENV_ATTEMPT]
        self.term_seconds = term_seconds
        self.ignores_sigterm = ignores_sigterm
        self.code: int | None = None
        self.sigterm_at: datetime | None = None
        self.killed_at: datetime | None = None
        self._signal = clock.event()
        self.resumed = env[ENV_RESUMED]  # what it saw at start: SPOTRELAY_RESUMED and its checkpoint files
        self.files_at_start = {
            p.relative_to(self.dir).as_posix(): sha256_of(p) for p in sorted(self.dir.rglob("*")) if p.is_file()
        }
        runs.append(f"attempt {self.attempt} resumed={env[ENV_RESUMED]}")
        if not (self.dir / "weights.bin").exists():
            self._save("weights.bin", random.Random(self.attempt).randbytes(300_000))
        self._print(f"attempt {self.attempt} started")
        self.thread = clock.start_thread(f"job {record.pid}", self._run)

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
            self.sigterm_at = self.clock.now()
            self._signal.set()

    def kill(self) -> None:
        if self.code is None:
            self.killed_at = self.clock.now()
            self._signal.set()

    # --- what the test makes it do -------------------------------------------------------------------

    def step(self, k: int) -> None:
        self._save("step.txt", f"step {k} of attempt {self.attempt}\n".encode())
        self.progress.write_text(str(k / 10))

    def exit(self, code: int) -> None:
        for i in range(30):
            self._print(f"line {i} of attempt {self.attempt}")
        self._exit(code)

    def print(self, line: str) -> None:
        self._print(line)

    # --- the process ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while self.code is None:
            self._signal.wait()
            self._signal.clear()
            if self.killed_at is not None:
                self.code = KILLED_EXIT_CODE  # the supervisor dies with the group: no exit file
                return
            if self.sigterm_at is not None and not self.ignores_sigterm:
                if self._signal.wait(self.term_seconds) and self.killed_at is not None:
                    self.code = KILLED_EXIT_CODE
                    return
                self._save("final.bin", (f"final checkpoint of attempt {self.attempt}\n" * 2000).encode())
                self.progress.write_text("1.5")
                self._print("saved the final checkpoint")
                self._exit(0)

    def _save(self, name: str, data: bytes) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        temporary = self.dir / f"{name}.tmp"
        temporary.write_bytes(data)
        temporary.replace(self.dir / name)

    def _print(self, line: str) -> None:
        with self._record.log_file.open("a") as f:
            f.write(line + "\n")

    def _exit(self, code: int) -> None:
        self._record.exit_file.write_text(json.dumps({"exit_code": code}))
        self.code = code
        self._signal.set()  # its process ends


class ScriptedRunner:
    """The runner port of one instance: starts ScriptedJobs and finds them again by pid (a re-attach)."""

    def __init__(self, clock: WaitingClock, runs: list[str], *, term_seconds: float, ignores_sigterm: bool) -> None:
        self.clock = clock
        self.runs = runs
        self.term_seconds = term_seconds
        self.ignores_sigterm = ignores_sigterm
        self.jobs: dict[int, ScriptedJob] = {}
        self._pids = itertools.count(4000)

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
    ) -> ScriptedJob:
        exit_file.unlink(missing_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        record = JobProcess(
            pid=next(self._pids), start_ticks=None, exit_file=exit_file, log_file=log_file, started_at=started_at
        )
        job = ScriptedJob(
            self.clock,
            env,
            record,
            self.runs,
            term_seconds=self.term_seconds,
            ignores_sigterm=self.ignores_sigterm,
        )
        self.jobs[record.pid] = job
        return job

    def attach(self, record: JobProcess) -> ScriptedJob:
        return self.jobs[record.pid]
