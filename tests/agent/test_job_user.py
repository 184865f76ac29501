"""The job runs as an unprivileged user with no AWS credentials in its environment (when the agent is root),
and unchanged otherwise. Privileges are never really dropped here: the user switch is checked on fakes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotrelay.agent import IMDS_GUARD, JOB_USER, systemd_unit
from spotrelay.agent.agent import give_to
from spotrelay.agent.main import IdentityError, resolve_job_user
from spotrelay.agent.runner import JobRunner, JobUser, job_command, job_environment
from spotrelay.agent.supervise import main as supervise
from spotrelay.agent.supervise import parse_arguments
from spotrelay.models import RunSpec

USER = JobUser(name=JOB_USER, uid=990, gid=985, home="/home/spotrelay-job")


def _entry(uid: int) -> Any:
    return SimpleNamespace(pw_uid=uid, pw_gid=985, pw_dir="/home/spotrelay-job")


def test_a_root_agent_runs_the_job_as_the_job_user_and_refuses_without_one() -> None:
    assert resolve_job_user(JOB_USER, geteuid=lambda: 0, getpwnam=lambda name: _entry(990)) == USER
    # not root (local runs, tests): nothing to drop
    assert resolve_job_user(JOB_USER, geteuid=lambda: 1000, getpwnam=lambda name: _entry(990)) is None

    def missing(name: str) -> Any:
        raise KeyError(name)

    with pytest.raises(IdentityError, match="no user"):
        resolve_job_user(JOB_USER, geteuid=lambda: 0, getpwnam=missing)
    with pytest.raises(IdentityError, match="is root"):
        resolve_job_user(JOB_USER, geteuid=lambda: 0, getpwnam=lambda name: _entry(0))


def test_the_supervisor_starts_the_command_as_the_user_with_no_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the supervisor argv the runner makes for a command (not a container)
    argv = JobRunner(python="python3", user=USER).supervisor_argv(["/bin/sh", "-c", "train"], tmp_path / "x", None)
    assert argv[:6] == ["python3", "-m", "spotrelay.agent.supervise", str(tmp_path / "x"), "--user", "990:985"]
    started: list[dict[str, Any]] = []

    class FakePopen:
        def __init__(self, command: list[str], **kwargs: Any) -> None:
            started.append({"command": command, **kwargs})

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setattr("spotrelay.agent.supervise.end_leftovers", lambda pgid: None)
    # When the supervisor runs it
    assert supervise(argv[3:]) == 0
    # Then the job is started with that uid and gid and no supplementary groups
    assert started == [{"command": ["/bin/sh", "-c", "train"], "user": 990, "group": 985, "extra_groups": []}]
    assert (tmp_path / "x").read_text() == '{"exit_code": 0}'


def test_without_a_user_nothing_changes_and_root_is_never_a_target(tmp_path: Path) -> None:
    argv = JobRunner(python="python3").supervisor_argv(["true"], tmp_path / "x", None)
    assert parse_arguments(argv[3:]) == (str(tmp_path / "x"), None, ["true"])
    assert parse_arguments([str(tmp_path / "x"), "--user", "0:0", "--", "true"]) is None
    assert parse_arguments([str(tmp_path / "x"), "--user", "990", "--", "true"]) is None


def test_a_container_runs_as_the_user_while_its_docker_cli_stays_root(tmp_path: Path) -> None:
    image = "nvcr.io/nvidia/pytorch:24.01-py3"
    run = RunSpec(image=image, command="python train.py")
    argv = job_command(run, job_id="j", attempt=1, checkpoint_dir=tmp_path, user=USER)
    assert argv[argv.index("--user") + 1] == "990:985"
    assert argv.index("--user") < argv.index(image)
    supervised = JobRunner(python="python3", user=USER).supervisor_argv(argv, tmp_path / "x", "c")
    assert supervised[4:] == ["--", *argv]  # the supervisor starts docker as itself
    assert "--user" not in job_command(run, job_id="j", attempt=1, checkpoint_dir=tmp_path)


def test_the_job_environment_carries_no_aws_credentials(tmp_path: Path) -> None:
    base = {
        "PATH": "/usr/bin",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIA...",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "token",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.2/creds",
        "AWS_PROFILE": "admin",
        "HOME": "/root",
    }
    env = job_environment(
        RunSpec(command="train", env={"WANDB_MODE": "offline"}),
        job_id="j",
        attempt=1,
        checkpoint_dir=tmp_path,
        resumed=False,
        progress_file=tmp_path / "p",
        base=base,
        user=USER,
    )
    assert not {name for name in env if "KEY" in name or "TOKEN" in name or "CREDENTIALS" in name or "PROFILE" in name}
    assert env["AWS_REGION"] == "us-east-1"
    assert env["WANDB_MODE"] == "offline"
    assert (env["HOME"], env["USER"]) == ("/home/spotrelay-job", JOB_USER)


class Chowns:
    """os.chown's stand-in (the tests are not root): records the inode a real call would change."""

    def __init__(self) -> None:
        self.changed: set[tuple[int, int]] = set()
        self.owners: set[tuple[int, int]] = set()

    def __call__(
        self, path: Any, uid: int, gid: int, *, dir_fd: int | None = None, follow_symlinks: bool = True
    ) -> None:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        self.changed.add((st.st_dev, st.st_ino))
        self.owners.add((uid, gid))


def inode(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_dev, st.st_ino


def test_the_checkpoint_dir_is_given_to_the_job_user_without_following_links(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "model.pt").write_text("w")
    (ckpt / "link").symlink_to("/etc/passwd")
    chowns = Chowns()
    give_to(ckpt, USER, chown=chowns)
    assert chowns.changed == {inode(p) for p in (ckpt, ckpt / "sub", ckpt / "sub" / "model.pt", ckpt / "link")}
    assert chowns.owners == {(990, 985)}


def test_a_directory_swapped_for_a_symlink_while_it_is_given_away_leads_nowhere_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a checkpoint dir with sub/model.pt, and root's own model.pt elsewhere
    ckpt, elsewhere = tmp_path / "ckpt", tmp_path / "root-only"
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "sub" / "model.pt").write_text("the job's")
    elsewhere.mkdir()
    (elsewhere / "model.pt").write_text("root's")
    # and a job that swaps sub for a symlink to it right after the agent listed sub
    real_scandir = os.scandir

    def scandir_then_swap(path: Any = ".") -> Any:
        with real_scandir(path) as listing:
            entries = list(listing)
        if "model.pt" in {e.name for e in entries} and not (ckpt / "sub").is_symlink():
            (ckpt / "sub").rename(tmp_path / "moved-sub")
            (ckpt / "sub").symlink_to(elsewhere)
        return _Listing(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_swap)

    # When the dir is given to the job user
    chowns = Chowns()
    give_to(ckpt, USER, chown=chowns)

    # Then root's file is not among what changed owner
    assert inode(elsewhere / "model.pt") not in chowns.changed
    assert inode(elsewhere) not in chowns.changed


class _Listing:
    """What os.scandir returns, from entries listed already."""

    def __init__(self, entries: list[Any]) -> None:
        self._entries = iter(entries)

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> Any:
        return next(self._entries)

    def close(self) -> None:
        return None


def test_the_unit_keeps_the_job_user_away_from_imds_on_every_start() -> None:
    unit = systemd_unit({"SPOTRELAY_TABLE": "t"})
    assert f"ExecStartPre={IMDS_GUARD}\n" in unit
    assert unit.index("ExecStartPre=") < unit.index("ExecStart=/")
    assert f"--uid-owner {JOB_USER} -j REJECT" in IMDS_GUARD
    assert "169.254.169.254" in IMDS_GUARD
    # the agent on an instance is told which user to run the job as (and refuses without it)
    assert f"ExecStart=/opt/spotrelay/venv/bin/spotrelay agent --job-user {JOB_USER}\n" in unit
