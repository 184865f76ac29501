"""The job's process: its command line and environment, the supervisor, signals, re-attaching."""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from waiting import POLLING, eventually

from spotrelay.agent import AGENT_UNIT_NAME, systemd_unit
from spotrelay.agent.runner import JobRunner, JobVanished, RunningJob, job_command, job_environment
from spotrelay.agent.supervise import group_members
from spotrelay.models import RunSpec

SLOW_SAVER = r"""
import pathlib, signal, sys, time
control = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    (control / "got-term").write_text("")
    while not (control / "release").exists():
        time.sleep(0.01)
    (control / "saved").write_text("")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(control / "running").write_text("")
while True:
    time.sleep(0.01)
"""


def start(tmp_path: Path, command: str) -> RunningJob:
    return JobRunner().start(
        ["/bin/sh", "-c", command],
        {"PATH": "/usr/bin:/bin"},
        exit_file=tmp_path / "job.exit",
        log_file=tmp_path / "job.log",
        started_at=datetime.now(UTC),
    )


def test_a_command_runs_through_the_shell_and_a_container_through_docker_with_gpus() -> None:
    assert job_command(RunSpec(command="python train.py"), job_id="j", attempt=2, checkpoint_dir=Path("/ckpt")) == [
        "/bin/sh",
        "-c",
        "python train.py",
    ]
    argv = job_command(
        RunSpec(image="ghcr.io/x/train:1", command="python train.py", env={"LR": "0.1"}),
        job_id="j",
        attempt=2,
        checkpoint_dir=Path("/ckpt"),
    )
    assert argv[:10] == [
        "docker",
        "run",
        "--rm",
        "--init",
        "--gpus",
        "all",
        "--name",
        "spotrelay-j-2",
        "-v",
        "/ckpt:/ckpt",
    ]
    assert argv[-4:] == ["ghcr.io/x/train:1", "/bin/sh", "-c", "python train.py"]
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "-e"}
    assert passed == {
        "LR",
        "SPOTRELAY_JOB_ID",
        "SPOTRELAY_ATTEMPT",
        "SPOTRELAY_CHECKPOINT_DIR",
        "SPOTRELAY_RESUMED",
        "SPOTRELAY_PROGRESS_FILE",
    }
    assert "0.1" not in argv  # values travel in the environment, not on the command line
    assert job_command(RunSpec(image="img"), job_id="j", attempt=1, checkpoint_dir=Path("/c"))[-1] == "img"


def test_the_environment_names_the_job_and_the_checkpoint() -> None:
    env = job_environment(
        RunSpec(command="x", env={"LR": "0.1", "SPOTRELAY_RESUMED": "spoofed"}),
        job_id="j",
        attempt=3,
        checkpoint_dir=Path("/ckpt"),
        resumed=True,
        progress_file=Path("/ckpt/.spotrelay-progress"),
        base={"PATH": "/bin"},
    )
    assert env == {
        "PATH": "/bin",
        "LR": "0.1",
        "SPOTRELAY_JOB_ID": "j",
        "SPOTRELAY_ATTEMPT": "3",
        "SPOTRELAY_CHECKPOINT_DIR": "/ckpt",
        "SPOTRELAY_RESUMED": "1",
        "SPOTRELAY_PROGRESS_FILE": "/ckpt/.spotrelay-progress",
    }


def test_a_terminated_job_has_ended_only_when_its_whole_group_has(tmp_path: Path) -> None:
    # Given a job run through /bin/sh whose program takes its time to save on SIGTERM
    script = tmp_path / "saver.py"
    script.write_text(SLOW_SAVER)
    job = start(tmp_path, f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(tmp_path))}")
    eventually((tmp_path / "running").exists, "the job to run", on=POLLING)

    # When it is terminated, the shell dies at once but the program is still saving
    job.terminate()
    eventually((tmp_path / "got-term").exists, "the program to get SIGTERM", on=POLLING)

    # Then the job has not ended; it ends once the program has saved
    assert job.exit_code() is None
    (tmp_path / "release").write_text("")
    code = eventually(job.exit_code, "the job to end", on=POLLING)
    assert (tmp_path / "saved").exists()
    assert code == -15  # the shell's status: it died of the SIGTERM


def test_a_restarted_agent_sees_the_job_through_its_pid_and_exit_file(tmp_path: Path) -> None:
    # Given a job started by an agent that is gone (only its record is left)
    job = start(tmp_path, f"while [ ! -e {shlex.quote(str(tmp_path / 'go'))} ]; do sleep 0.01; done; exit 7")
    attached = JobRunner().attach(job.record)

    # Then the new agent sees it running, then its exit code
    assert attached.exit_code() is None
    (tmp_path / "go").write_text("")
    assert eventually(attached.exit_code, "the exit code", on=POLLING) == 7


def test_a_reused_pid_is_not_mistaken_for_the_job(tmp_path: Path) -> None:
    # Given a record whose pid is alive but started at another time (the pid was reused)
    job = start(tmp_path, f"while [ ! -e {shlex.quote(str(tmp_path / 'go'))} ]; do sleep 0.01; done")
    assert job.record.start_ticks is not None
    impostor = job.record.model_copy(update={"start_ticks": job.record.start_ticks + 1})

    # Then the job is gone without a trace
    with pytest.raises(JobVanished):
        JobRunner().attach(impostor).exit_code()
    (tmp_path / "go").write_text("")


def test_processes_a_finished_job_leaves_behind_are_ended(tmp_path: Path) -> None:
    # Given a job that leaves a background process behind when it exits 0
    job = start(tmp_path, "sleep 300 & exit 0")

    # Then the job ends with 0 and nothing of its group is left
    assert eventually(job.exit_code, "the job to end", on=POLLING) == 0
    assert [pid for pid in group_members(job.pid) if pid != job.pid] == []  # the supervisor may be exiting


def test_a_killed_job_reports_sigkill(tmp_path: Path) -> None:
    job = start(tmp_path, "trap '' TERM; while :; do sleep 0.01; done")
    job.kill()
    assert eventually(job.exit_code, "the kill", on=POLLING) == -9


def test_the_systemd_unit_restarts_the_agent_and_never_kills_the_job_with_it() -> None:
    unit = systemd_unit({"SPOTRELAY_TABLE": "t", "SPOTRELAY_BUCKET": "b"})
    lines = unit.splitlines()
    assert AGENT_UNIT_NAME == "spotrelay-agent.service"
    assert "Restart=on-failure" in lines
    assert "KillMode=process" in lines
    assert "StateDirectory=spotrelay" in lines
    assert "ExecStart=/opt/spotrelay/venv/bin/spotrelay agent --job-user spotrelay-job" in lines
    assert lines.index("Environment=SPOTRELAY_BUCKET=b") < lines.index("Environment=SPOTRELAY_TABLE=t")
