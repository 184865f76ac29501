"""The job's process: the command line, its environment, starting, signalling, re-attaching.

A job is `run.command` through `/bin/sh -c`, or a container: `docker run --rm --init --gpus all
--name spotrelay-<job>-<attempt> -v <dir>:<dir> -e NAME... <image> [/bin/sh -c <command>]` (the
checkpoint dir is mounted at the same path; `-e NAME` passes each variable by name, so values stay
out of the process list; `--init` gives the container a PID 1 that forwards SIGTERM).

The environment is the agent's without any AWS credential or credential source
(`AWS_CREDENTIAL_VARIABLES`), plus the spec's `run.env`, plus `SPOTRELAY_JOB_ID`,
`SPOTRELAY_ATTEMPT`, `SPOTRELAY_CHECKPOINT_DIR`, `SPOTRELAY_RESUMED` (1 when a checkpoint holding files was
restored, else 0) and `SPOTRELAY_PROGRESS_FILE` (where the job may write its progress).

With a `JobUser` (the agent runs as root on an instance: `spotrelay-job`), the job runs as that user:
the supervisor (root, so that it can write the exit file in the agent's state dir) starts the command
with that uid and gid and no supplementary groups; a container's docker CLI stays root (the docker
socket is root's) and the container runs `--user uid:gid`. The agent gives the checkpoint dir to the
user before the job starts. Without one (the agent is not root: local runs, tests) nothing changes.

The job runs under `spotrelay.agent.supervise` in a new session (its own process group), with stdout
and stderr appended to a log file the agent tails. A notice sends SIGTERM to the whole group, then
SIGKILL after the grace period (and `docker kill` for a container, which a signal to the docker CLI
does not reach). `JobProcess` is what the agent's state file keeps to find the job again after a
restart: the supervisor's pid and kernel start time (a reused pid is not mistaken for the job) and
the exit file the supervisor writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from spotrelay.models import RunSpec

ENV_JOB_ID = "SPOTRELAY_JOB_ID"
ENV_ATTEMPT = "SPOTRELAY_ATTEMPT"
ENV_CHECKPOINT_DIR = "SPOTRELAY_CHECKPOINT_DIR"
ENV_RESUMED = "SPOTRELAY_RESUMED"
ENV_PROGRESS_FILE = "SPOTRELAY_PROGRESS_FILE"
KILLED_EXIT_CODE = -signal.SIGKILL
# Never inherited by the job: the agent's credentials are not the job's to use.
AWS_CREDENTIAL_VARIABLES = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ROLE_SESSION_NAME",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    }
)


class JobUser(BaseModel):
    """Who the job runs as (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    name: str
    uid: int = Field(ge=1)  # never root
    gid: int = Field(ge=1)
    home: str

    @property
    def spec(self) -> str:
        return f"{self.uid}:{self.gid}"


class JobVanished(Exception):
    """The job's supervisor is gone and left no exit status (killed from outside)."""


def container_name(job_id: str, attempt: int) -> str:
    return f"spotrelay-{job_id}-{attempt}"


def job_environment(
    run: RunSpec,
    *,
    job_id: str,
    attempt: int,
    checkpoint_dir: Path,
    resumed: bool,
    progress_file: Path,
    base: Mapping[str, str] | None = None,
    user: JobUser | None = None,
) -> dict[str, str]:
    inherited = os.environ if base is None else base
    env = {name: value for name, value in inherited.items() if name not in AWS_CREDENTIAL_VARIABLES}
    if user is not None:
        env.update({"HOME": user.home, "USER": user.name, "LOGNAME": user.name})
    env.update(run.env)
    env.update(
        {
            ENV_JOB_ID: job_id,
            ENV_ATTEMPT: str(attempt),
            ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            ENV_RESUMED: "1" if resumed else "0",
            ENV_PROGRESS_FILE: str(progress_file),
        }
    )
    return env


def job_command(
    run: RunSpec, *, job_id: str, attempt: int, checkpoint_dir: Path, user: JobUser | None = None
) -> list[str]:
    """The argv that runs the job (see the module docstring)."""
    if run.image is None:
        assert run.command is not None  # RunSpec requires one of them
        return ["/bin/sh", "-c", run.command]
    passed = sorted({*run.env, ENV_JOB_ID, ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_RESUMED, ENV_PROGRESS_FILE})
    argv = [
        "docker",
        "run",
        "--rm",
        "--init",
        *(["--user", user.spec] if user is not None else []),
        "--gpus",
        "all",
        "--name",
        container_name(job_id, attempt),
        "-v",
        f"{checkpoint_dir}:{checkpoint_dir}",
    ]
    for name in passed:
        argv += ["-e", name]
    argv.append(run.image)
    if run.command is not None:
        argv += ["/bin/sh", "-c", run.command]
    return argv


class JobProcess(BaseModel):
    """What finds a started job again: kept in the agent's state file."""

    model_config = ConfigDict(frozen=True)

    pid: int  # the supervisor's, which is also the job's process group id
    start_ticks: int | None  # /proc/<pid>/stat field 22: tells the job from a process that reused its pid
    exit_file: Path
    log_file: Path
    started_at: AwareDatetime
    container: str | None = None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from /proc, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    return fields[0], int(fields[19])


def _alive(pid: int, start_ticks: int | None) -> bool:
    if Path("/proc").is_dir():
        stat = _proc_stat(pid)
        if stat is None or stat[0] in {"Z", "X"}:
            return False
        return start_ticks is None or stat[1] == start_ticks
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunningJob:
    """A started job, as this agent process sees it: started here, or re-attached after a restart."""

    def __init__(self, record: JobProcess, child: subprocess.Popen[bytes] | None = None) -> None:
        self.record = record
        self._child = child
        self._killed = False

    @property
    def pid(self) -> int:
        return self.record.pid

    def exit_code(self) -> int | None:
        """The job's exit code once it has ended (negative: killed by that signal), else None.
        Raises JobVanished when the job is gone without a trace of how it ended."""
        if self._child is not None:
            self._child.poll()  # reap our own child, so that it does not linger as a zombie
        alive = _alive(self.record.pid, self.record.start_ticks)
        code = _read_exit_file(self.record.exit_file)
        if code is not None:
            return code
        if alive:
            return None
        if self._killed:
            return KILLED_EXIT_CODE
        if self._child is not None and self._child.returncode is not None and self._child.returncode < 0:
            return self._child.returncode
        raise JobVanished(f"the job's process {self.record.pid} ended without recording its exit status")

    def terminate(self) -> None:
        """SIGTERM to the job's process group (the docker CLI forwards it to the container)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the group, and `docker kill` for a container (the CLI's death does not stop it)."""
        self._killed = True
        self._signal(signal.SIGKILL)
        if self.record.container is not None:
            subprocess.run(
                ["docker", "kill", self.record.container],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
                check=False,
            )

    def _signal(self, signum: int) -> None:
        if not _alive(self.record.pid, self.record.start_ticks):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.record.pid, signum)


def _read_exit_file(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["exit_code"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None


class JobHandle(Protocol):
    """What the agent does with a started job (RunningJob here; a simulated job in a replay)."""

    @property
    def record(self) -> JobProcess: ...

    @property
    def pid(self) -> int: ...

    def exit_code(self) -> int | None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Runner(Protocol):
    """The agent's runner port: JobRunner on an instance; spotrelay.local.sim_job in a replay."""

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
    ) -> JobHandle: ...

    def attach(self, record: JobProcess) -> JobHandle: ...


class JobRunner:
    """Starts jobs under the supervisor (as `user`, if given), and re-attaches to them."""

    def __init__(self, python: str = sys.executable, user: JobUser | None = None) -> None:
        self.python = python
        self.user = user

    def supervisor_argv(self, argv: list[str], exit_file: Path, container: str | None) -> list[str]:
        # A container's docker CLI needs root's socket: its `--user` is in the docker argv instead
        drop = ["--user", self.user.spec] if self.user is not None and container is None else []
        return [self.python, "-m", "spotrelay.agent.supervise", str(exit_file), *drop, "--", *argv]

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
    ) -> RunningJob:
        exit_file.unlink(missing_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:
            child = subprocess.Popen(
                self.supervisor_argv(argv, exit_file, container),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and process group: the agent signals the group
                cwd=cwd,
            )
        stat = _proc_stat(child.pid)
        record = JobProcess(
            pid=child.pid,
            start_ticks=stat[1] if stat is not None else None,
            exit_file=exit_file,
            log_file=log_file,
            started_at=started_at,
            container=container,
        )
        return RunningJob(record, child)

    def attach(self, record: JobProcess) -> RunningJob:
        return RunningJob(record)
