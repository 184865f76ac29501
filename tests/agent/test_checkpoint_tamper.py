"""A job that tampers with the agent's own directories: the restore's staging dir, the dir it installs
into, the old contents it removes, and the checkpoint dir while it is checkpointed.

The job owns the checkpoint dir and its parent, so it can rename, remove or replace the staging dir the
agent made there (by a symlink to root's files, a FIFO, a dir of its own), plant something where the agent
renames to, and swap a directory it is removing. Whatever it does, the agent never crashes, never follows a
link and never opens a FIFO, and touches nothing outside the job's dirs: a restore that cannot complete
raises RestoreIncomplete (the agent fails the task with JobFailed and never starts the job on a partial
restore: `spotrelay.agent.checkpointer.Checkpointer.restore`), and a checkpoint of a dir swapped under it
is dropped with a warning (CheckpointTampered) for the next one to try again.

Every race is forced at a fixed point: the job moves right before (or after) the agent's call of one
syscall on one name, or when the download starts; nothing waits on time."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spotrelay.agent.agent import give_to
from spotrelay.agent.checkpointer import CheckpointTampered, CheckpointUnstable
from spotrelay.agent.confined import HAS_FD_PATHS, RestoreIncomplete
from spotrelay.agent.ports import CheckpointIntegrityError
from spotrelay.agent.runner import JobUser
from spotrelay.models import CheckpointManifest

from .conftest import JOB_ID, Records, VirtualWorld, World, job_spec
from .test_checkpoint_security import contents, leaked, root_only, swap_after_listing, write

CHECKPOINT = {"a.bin": b"checkpointed a", "sub/step.txt": b"7", "weights.bin": b"checkpointed weights"}
BEFORE = {"before.txt": b"the job's", "olddir/x.txt": b"the job's old"}
POLL = 5.0

pytestmark = pytest.mark.skipif(not HAS_FD_PATHS, reason="the agent confines its writes through /proc/self/fd")


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (not followed): what it is, and a regular file's bytes."""
    found: dict[str, str] = {}
    for where, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(where) / name
            st = path.lstat()
            found[path.relative_to(root).as_posix()] = (
                path.read_bytes().decode(errors="replace") if stat.S_ISREG(st.st_mode) else stat.filemode(st.st_mode)
            )
    return found


def at_call(
    monkeypatch: pytest.MonkeyPatch, function: str, name: str, move: Callable[[], None], *, after: bool = False
) -> list[int]:
    """The job's `move`, made right before (or right after) the agent's first `os.<function>` on the entry
    `name` of a directory fd: the fixed point of the race. Returns the flags of every os.open of `name`."""
    real = getattr(os, function)
    moved: list[bool] = []
    flags: list[int] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        fd_relative = any(kwargs.get(k) is not None for k in ("dir_fd", "src_dir_fd", "dst_dir_fd"))
        hit = fd_relative and bool(args) and args[0] == name
        if hit and function == "open":
            flags.append(args[1])
        now = hit and not moved
        if now:
            moved.append(True)
            if not after:
                move()
        try:
            return real(*args, **kwargs)
        finally:
            if now and after:
                move()

    monkeypatch.setattr(os, function, hooked)
    return flags


def fifo_held_open(path: Path) -> int:
    """A FIFO at `path`, held open for writing by the test: an agent that opened it without O_NONBLOCK
    would not hang the test (the recorded flags say whether it tried)."""
    os.mkfifo(path)
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


class Scene:
    """A committed checkpoint, root's files elsewhere, and a checkpoint dir that holds the job's earlier
    files, restored next to itself or (a mount point) in place."""

    def __init__(self, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mount_point: bool) -> None:
        source = tmp_path / "source"
        write(source, CHECKPOINT)
        assert world.checkpointer(1, source).take("final", final=True).committed
        self.world = world
        self.secrets = root_only(tmp_path)
        self.secrets_before = tree(self.secrets)
        self.target = tmp_path / "job" / "ckpt"
        write(self.target, BEFORE)
        self.mount_point = mount_point
        if mount_point:
            monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == self.target)
        self.home = self.target if mount_point else self.target.parent
        self.staging_name = ".spotrelay-restore" if mount_point else ".spotrelay-restore-ckpt"
        self.staging = self.home / self.staging_name
        self.fds: list[int] = []

    def label(self, name: str) -> str:
        """`name` of the staging's home as the restore names it: relative to the checkpoint dir's parent."""
        return f"ckpt/{name}" if self.mount_point else name

    def restore(self, storage: Any = None) -> CheckpointManifest | None:
        """Restore as attempt 9, with the job running as the agent's user: a symlink is the job's."""
        restorer = self.world.checkpointer(9, self.target, job_uid=os.getuid())
        if storage is not None:
            restorer.storage = storage
        return restorer.restore(self.world.store.get_checkpoint(JOB_ID))

    def incomplete(self) -> RestoreIncomplete:
        with pytest.raises(RestoreIncomplete) as raised:
            self.restore()
        return raised.value

    def plant(self, at: Path, what: str) -> None:
        """What the job puts at `at`: a symlink to root's dir, a FIFO, a non-empty dir of its own, a file."""
        if what == "symlink":
            at.symlink_to(self.secrets)
        elif what == "fifo":
            self.fds.append(fifo_held_open(at))
        elif what == "dir":
            write(at, {"job.txt": b"the job's own"})
        elif what == "empty dir":
            at.mkdir(mode=0o755)
            os.chmod(at, 0o755)
        else:
            at.write_bytes(b"the job's file")

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)

    def root_untouched(self) -> None:
        assert tree(self.secrets) == self.secrets_before
        assert leaked(self.world) == []

    def restored_nowhere(self) -> None:
        """No byte of the checkpoint was left where the job reads: whatever is at the checkpoint dir's name
        holds none of it, and the staging dir is gone."""
        if self.target.is_dir() and not self.target.is_symlink():
            assert not any(path in CHECKPOINT for path in contents(self.target))
        assert not self.staging.exists()
        assert not self.staging.is_symlink()


@pytest.fixture(params=[False, True], ids=["next to the dir", "inside a mount point"])
def scene(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    made = Scene(world, tmp_path, monkeypatch, mount_point=request.param)
    yield made
    made.close()


@pytest.fixture
def beside(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    made = Scene(world, tmp_path, monkeypatch, mount_point=False)
    yield made
    made.close()


@pytest.fixture
def mounted(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    made = Scene(world, tmp_path, monkeypatch, mount_point=True)
    yield made
    made.close()


# --- the staging dir, as it is made ---------------------------------------------------------------


@pytest.mark.parametrize("what", ["symlink", "fifo", "dir", "file"])
def test_something_planted_at_the_staging_name_after_it_was_cleared_fails_the_restore_cleanly(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a job that plants something at the staging dir's name right after the agent cleared it
    at_call(monkeypatch, "mkdir", scene.staging_name, lambda: scene.plant(scene.staging, what))

    # When the checkpoint is restored, Then the restore is reported incomplete, naming the staging dir
    failure = scene.incomplete()
    assert failure.path == scene.label(scene.staging_name)
    assert "already there" in failure.why
    # and nothing was written through the link or into root's files, and the checkpoint dir is as it was
    scene.root_untouched()
    assert {k: v for k, v in contents(scene.target).items() if not k.startswith(".spotrelay-")} == BEFORE
    assert not failure.partial


@pytest.mark.parametrize("what", ["symlink", "fifo", "removed", "empty dir"])
def test_a_staging_dir_swapped_right_after_it_was_made_fails_the_restore_cleanly(
    scene: Scene, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a job that moves the agent's fresh staging dir away (or removes it: it is empty) and puts
    # something of its own at its name, right after the mkdir
    def swap() -> None:
        if what == "removed":
            scene.staging.rmdir()
            return
        scene.staging.rename(scene.home / "moved-by-the-job")
        scene.plant(scene.staging, what)

    at_call(monkeypatch, "mkdir", scene.staging_name, swap, after=True)

    # When the checkpoint is restored, Then the restore is reported incomplete, naming the staging dir
    failure = scene.incomplete()
    assert failure.path == scene.label(scene.staging_name)
    assert "replaced" in failure.why
    scene.root_untouched()
    assert {k: v for k, v in contents(scene.target).items() if not k.startswith(".spotrelay-")} == BEFORE


# --- the staging dir, while the checkpoint is downloaded ----------------------------------------------


class TampersAtDownload:
    """Storage whose download starts right after the job did `move` (a job process left running), or
    with `after`, whose download is followed at once by it."""

    def __init__(self, inner: Any, move: Callable[[], None], *, after: bool = False) -> None:
        self.inner = inner
        self.move = move
        self.after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def download(self, items: Any) -> None:
        if not self.after:
            self.move()
        self.inner.download(items)
        if self.after:
            self.move()


@pytest.mark.parametrize("what", ["removed", "symlink", "fifo", "dir"])
def test_a_staging_dir_tampered_with_during_the_download_fails_the_restore_cleanly(scene: Scene, what: str) -> None:
    # Given a job that, as the download starts, removes the (still empty) staging dir, or moves it away
    # and puts a symlink to root's dir, a FIFO or a dir of its own at its name
    def tamper() -> None:
        if what == "removed":
            scene.staging.rmdir()
            return
        scene.staging.rename(scene.home / "moved-by-the-job")
        scene.plant(scene.staging, what)

    # When the checkpoint is restored
    with pytest.raises(RestoreIncomplete) as raised:
        scene.restore(storage=TampersAtDownload(scene.world.storage, tamper))

    # Then the restore is reported incomplete, naming the staging dir and what happened to it
    assert raised.value.path == scene.label(scene.staging_name)
    assert "moved or replaced" in raised.value.why
    # and nothing of root's was written or moved, and the checkpoint dir is as it was
    scene.root_untouched()
    assert {k: v for k, v in contents(scene.target).items() if not k.startswith(".spotrelay-")} == BEFORE
    assert not raised.value.partial


@pytest.mark.parametrize("what", ["symlink", "fifo"])
def test_a_downloaded_file_replaced_in_the_staging_dir_is_refused_without_following_it(
    beside: Scene, what: str
) -> None:
    # Given a job running as the agent's user (a laptop: it can reach into the 0700 staging dir) that
    # replaces a downloaded file by a symlink to root's file or by a FIFO before it is verified
    def replace() -> None:
        (beside.staging / "weights.bin").unlink()
        if what == "symlink":
            (beside.staging / "weights.bin").symlink_to(beside.secrets / "weights.bin")
        else:
            os.mkfifo(beside.staging / "weights.bin")  # opened, it would block the agent

    # When the checkpoint is restored, Then it fails verification, naming the file, without reading it
    with pytest.raises(CheckpointIntegrityError) as raised:
        beside.restore(storage=TampersAtDownload(beside.world.storage, replace, after=True))
    assert raised.value.problems[0].startswith("weights.bin: not a regular file")
    beside.root_untouched()
    assert contents(beside.target) == BEFORE


# --- installing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["dir", "file", "fifo", "symlink"])
def test_a_checkpoint_dir_recreated_by_the_job_as_the_restore_is_renamed_in_fails_the_restore_cleanly(
    beside: Scene, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a job that puts a non-empty dir, a file, a FIFO or a symlink to root's dir at the checkpoint
    # dir's name right after the agent moved the old dir aside, before it renames the restored one in (a
    # directory is renamed only over a directory: the rename fails, it never follows the link)
    at_call(monkeypatch, "replace", beside.staging_name, lambda: beside.plant(beside.target, what))

    # When the checkpoint is restored, Then the restore is reported incomplete, naming the checkpoint dir
    failure = beside.incomplete()
    assert failure.path == "ckpt"
    assert "could not be put in place" in failure.why
    assert not failure.partial
    # and nothing of root's was touched, no byte of the checkpoint was left for the job to start from
    beside.root_untouched()
    beside.restored_nowhere()


@pytest.mark.parametrize("what", ["dir", "file"])
def test_something_planted_where_the_old_dir_is_moved_aside_fails_the_restore_and_keeps_the_dir(
    beside: Scene, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a job that plants a non-empty dir or a file where the agent moves the old checkpoint dir aside,
    # right after the agent cleared that name
    aside = beside.home / ".spotrelay-replaced-ckpt"
    at_call(monkeypatch, "replace", "ckpt", lambda: beside.plant(aside, what))

    # When the checkpoint is restored, Then the restore is reported incomplete, and the dir is as it was
    failure = beside.incomplete()
    assert failure.path == "ckpt"
    assert "could not be moved aside" in failure.why
    assert contents(beside.target) == BEFORE
    beside.root_untouched()


def test_the_staging_dir_swapped_for_a_symlink_right_before_it_is_renamed_in_fails_the_restore(
    beside: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job that swaps the staging dir for a symlink to root's dir right before the agent renames it
    # to the checkpoint dir's name (so that its symlink is renamed in instead)
    def swap() -> None:
        beside.staging.rename(beside.home / "moved-by-the-job")
        beside.staging.symlink_to(beside.secrets)

    at_call(monkeypatch, "replace", beside.staging_name, swap)

    # When the checkpoint is restored, Then the restore is reported incomplete, and nothing of root's changed
    failure = beside.incomplete()
    assert failure.path == "ckpt"
    assert "replaced while it was installed" in failure.why
    beside.root_untouched()
    # and the job's earlier files are kept aside, not removed
    assert contents(beside.home / ".spotrelay-replaced-ckpt") == BEFORE


@pytest.mark.parametrize(
    ("name", "what"),
    [("sub", "dir"), ("sub", "file"), ("sub", "symlink"), ("weights.bin", "dir")],
    ids=["a dir", "a file", "a symlink", "a dir where a file goes"],
)
def test_an_entry_planted_while_a_mount_point_is_filled_stops_the_restore_as_partial(
    mounted: Scene, monkeypatch: pytest.MonkeyPatch, name: str, what: str
) -> None:
    # Given a checkpoint dir that is a mount point (the restored entries are moved in one by one), and a
    # job that plants a non-empty dir, a file or a symlink to root's dir at an entry's name right before
    # the agent moves it in
    at_call(monkeypatch, "replace", name, lambda: mounted.plant(mounted.target / name, what))

    # When the checkpoint is restored, Then the restore is reported incomplete and partial, naming the entry
    failure = mounted.incomplete()
    assert failure.path == f"ckpt/{name}"
    assert "could not be put in place" in failure.why
    assert failure.partial  # a.bin is in already: the job must not start from this
    mounted.root_untouched()


def test_a_symlink_planted_at_a_files_name_while_a_mount_point_is_filled_is_replaced_not_followed(
    mounted: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job that plants a symlink to root's file where the agent is about to move weights.bin in
    weights = mounted.target / "weights.bin"
    at_call(monkeypatch, "replace", "weights.bin", lambda: weights.symlink_to(mounted.secrets / "weights.bin"))

    # When the checkpoint is restored, Then the rename replaced the link itself: root's file is untouched
    assert mounted.restore() is not None
    assert not (mounted.target / "weights.bin").is_symlink()
    assert contents(mounted.target) == CHECKPOINT
    mounted.root_untouched()


# --- removing the job's old files -------------------------------------------------------------------


@pytest.mark.parametrize("what", ["symlink", "fifo"])
def test_an_old_directory_swapped_while_it_is_removed_is_unlinked_not_followed_nor_opened(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a job that swaps its old directory olddir/ for a symlink to root's dir or for a FIFO right
    # before the agent opens it to remove what it holds (the old contents of the checkpoint dir)
    # (inside a mount point they are removed in place, next to the dir once the restored dir replaced it)
    def swap() -> None:
        olddir = (scene.target if scene.mount_point else scene.home / ".spotrelay-replaced-ckpt") / "olddir"
        olddir.rename(olddir.with_name("olddir-moved"))
        scene.plant(olddir, what)

    flags = at_call(monkeypatch, "open", "olddir", swap)

    # When the checkpoint is restored, Then it is restored, and root's dir is untouched
    assert scene.restore() is not None
    scene.root_untouched()
    assert {k: v for k, v in contents(scene.target).items() if k != "olddir-moved/x.txt"} == CHECKPOINT
    # and the agent never opened what was swapped in other than as a directory that is not followed
    assert flags
    assert all(f & os.O_NOFOLLOW and f & os.O_DIRECTORY for f in flags)
    assert not (scene.target / "olddir").exists()
    assert not (scene.target / "olddir").is_symlink()


# --- the checkpoint dir's parents -------------------------------------------------------------------


def test_a_checkpoint_dir_under_a_symlink_of_the_jobs_is_not_restored_through_it(world: World, tmp_path: Path) -> None:
    # Given a committed checkpoint, and a checkpoint dir whose parent the job replaced by a symlink to
    # root's dir, with the dirs below it still to be made
    source = tmp_path / "source"
    write(source, CHECKPOINT)
    assert world.checkpointer(1, source).take("final", final=True).committed
    secrets = root_only(tmp_path)
    before = tree(secrets)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "runs").symlink_to(secrets)
    target = tmp_path / "job" / "runs" / "new" / "ckpt"

    # When it is restored, Then the restore is reported incomplete and nothing is made in root's dir
    with pytest.raises(RestoreIncomplete) as raised:
        world.checkpointer(9, target, job_uid=os.getuid()).restore(world.store.get_checkpoint(JOB_ID))
    assert "symlink" in raised.value.why
    assert tree(secrets) == before


def test_a_fresh_checkpoint_dir_is_not_made_through_a_symlink_of_the_jobs(world: World, tmp_path: Path) -> None:
    # Given no checkpoint yet, and a checkpoint dir under a symlink the job made to root's dir
    secrets = root_only(tmp_path)
    before = tree(secrets)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "runs").symlink_to(secrets)

    # When the (empty) checkpoint dir is prepared, Then it is refused and nothing is made in root's dir
    with pytest.raises(RestoreIncomplete):
        world.checkpointer(9, tmp_path / "job" / "runs" / "new" / "ckpt", job_uid=os.getuid()).restore(None)
    assert tree(secrets) == before


# --- checkpoints ----------------------------------------------------------------------------------


@pytest.mark.parametrize("what", ["symlink", "fifo", "file"])
def test_a_checkpoint_dir_swapped_before_a_checkpoint_drops_it_and_the_next_one_commits(
    world: World, tmp_path: Path, what: str
) -> None:
    # Given a checkpoint dir the job moved away and replaced by a symlink to root's dir, a FIFO or a file
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"weights.bin": b"the job's weights"})
    ckpt.rename(tmp_path / "aside")
    fds: list[int] = []
    if what == "symlink":
        ckpt.symlink_to(secrets)
    elif what == "fifo":
        fds.append(fifo_held_open(ckpt))
    else:
        ckpt.write_bytes(b"not a dir")
    checkpointer = world.checkpointer(1, ckpt, job_uid=os.getuid())

    # When it is checkpointed, Then the checkpoint is dropped (a CheckpointUnstable: the agent tries again
    # at the next interval), naming the dir, and nothing is uploaded
    with pytest.raises(CheckpointTampered) as raised:
        checkpointer.take("periodic")
    assert isinstance(raised.value, CheckpointUnstable)
    assert raised.value.path == "."
    assert world.object_keys() == []
    for fd in fds:
        os.close(fd)

    # and once the dir is back, the next checkpoint commits
    ckpt.unlink()
    (tmp_path / "aside").rename(ckpt)
    assert checkpointer.take("periodic").committed
    assert leaked(world) == []


@pytest.mark.parametrize("what", ["subdir removed", "subdir swapped for a fifo", "subdir swapped for a file"])
def test_a_directory_swapped_after_the_listing_never_fails_a_checkpoint_with_an_os_error(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # Given a checkpoint dir whose sub/ the job removes or swaps for a FIFO or a file right after the
    # agent listed the dir
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"sub/a.bin": b"the job's a", "top.bin": b"the job's top"})
    fds: list[int] = []

    def swap() -> None:
        (ckpt / "sub").rename(tmp_path / "sub-moved")
        if what.endswith("fifo"):
            fds.append(fifo_held_open(ckpt / "sub"))
        elif what.endswith("file"):
            (ckpt / "sub").write_bytes(b"not a dir")

    swap_after_listing(monkeypatch, swap)

    # When it is checkpointed, Then it commits the rest, or is dropped as unstable: never an OSError
    try:
        result = world.checkpointer(1, ckpt, job_uid=os.getuid()).take("periodic")
    except CheckpointUnstable:
        assert what == "subdir removed"
    else:
        assert result.committed
        assert result.left_out == ("sub/a.bin",)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_file_that_vanishes_while_the_dir_is_given_to_the_job_user_is_skipped(tmp_path: Path) -> None:
    # Given a restored checkpoint dir, and a job that removes b.bin right before the agent chowns it
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"a.bin": b"a", "b.bin": b"b"})
    changed: list[str] = []

    def chown(path: Any, uid: int, gid: int, *, dir_fd: int | None = None, follow_symlinks: bool = True) -> None:
        if path == "b.bin":
            (ckpt / "b.bin").unlink()
        os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        changed.append(str(path))

    # When the dir is given to the job user, Then the walk goes on past it
    give_to(ckpt, JobUser(name="spotrelay-job", uid=990, gid=985, home="/nonexistent"), chown=chown)
    assert "a.bin" in changed


# --- the agent ------------------------------------------------------------------------------------


def test_an_agent_whose_restore_is_tampered_with_fails_the_task_and_never_starts_the_job(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a committed checkpoint of attempt 1
    vworld.submit(job_spec("python train.py", Path("/unused")))
    old_dir = vworld.checkpoint_dir(1)
    write(old_dir, {"weights.bin": b"A" * 1000})
    assert vworld.checkpointer(1, old_dir, clock=vworld.clock.now).take("final", final=True).committed
    pointer = vworld.store.get_checkpoint(JOB_ID)
    # and attempt 2's instance, where a job process swaps the staging dir for a symlink as the download starts
    target = vworld.checkpoint_dir(2)
    target.parent.mkdir(parents=True)
    secrets = root_only(vworld.tmp_path)
    before = tree(secrets)
    staging = target.parent / ".spotrelay-restore-ckpt"

    def swap() -> None:
        staging.rename(target.parent / "moved-by-the-job")
        staging.symlink_to(secrets)

    vworld.storage = TampersAtDownload(vworld.storage, swap)  # type: ignore[assignment]

    # When attempt 2's agent runs
    vworld.add_attempt(2, vworld.open_task("run-2"))
    result = vworld.finish(vworld.start_agent(2), within=0)

    # Then it does not crash: it fails the task with JobFailed (a new attempt restores the intact
    # checkpoint), saying which entry and what was wrong, and never starts the job
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("failed", True)
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == "JobFailed"
    cause = json.loads(failure["cause"])
    assert cause["path"] == ".spotrelay-restore-ckpt"
    assert "moved or replaced" in cause["error"]
    assert vworld.runs == []
    [(_, warning)] = agent_logs.named("the checkpoint could not be restored: not starting the job")
    assert warning.levelno == logging.WARNING
    assert warning.__dict__["path"] == ".spotrelay-restore-ckpt"
    assert warning.__dict__["partial"] is False
    assert vworld.store.get_checkpoint(JOB_ID) == pointer  # still there for the next attempt
    assert tree(secrets) == before


def test_a_periodic_checkpoint_of_a_swapped_dir_is_dropped_with_a_warning_and_the_next_one_commits(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a running job checkpointed every 30 minutes
    vworld.submit(job_spec("python train.py", Path("/unused"), interval_minutes=30))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    ckpt = vworld.checkpoint_dir(1)
    aside = ckpt.with_name("aside")

    # When the job has replaced its checkpoint dir by a file as the first periodic checkpoint comes
    vworld.advance(1000)

    def swap() -> None:
        ckpt.rename(aside)
        ckpt.write_bytes(b"not a dir")

    vworld.act(swap)
    vworld.advance(1000)

    # Then that checkpoint is dropped with a warning naming the dir and what it was
    [(_, dropped)] = agent_logs.named("checkpoint dropped")
    assert dropped.levelno == logging.WARNING
    assert (dropped.__dict__["path"], dropped.__dict__["what"]) == (".", "ckpt is a regular file")
    assert not agent_logs.logged("checkpoint failed; the next one will try again")

    # and once the dir is back, the next periodic checkpoint commits
    def swap_back() -> None:
        ckpt.unlink()
        aside.rename(ckpt)

    vworld.act(swap_back)
    vworld.advance(1800)
    assert agent_logs.logged("checkpoint committed")
    job = vworld.job(1)
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)
    assert result.outcome is not None
    assert result.outcome.kind == "succeeded"
