"""A hostile job against its root agent: what the job plants in its checkpoint dir (symlinks to root's
files, a file or a directory swapped for a symlink between the agent's listing and its open, hard
links, FIFOs) never brings a byte of root's into the job's checkpoint in S3, and a restore never writes
through a link the job planted. The races are made deterministic by acting at the exact point the
agent is at (after its listing, before its download), never by timing."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from spotrelay.agent import checkpointer as checkpointer_module
from spotrelay.agent.checkpoint_contents import scan_checkpoint_dir
from spotrelay.agent.checkpointer import CheckpointTampered
from spotrelay.agent.confined import HAS_FD_PATHS, RestoreIncomplete
from spotrelay.models import CheckpointManifest

from .conftest import BUCKET, JOB_ID, Records, World

SECRET = b"root:$6$only-root-reads-this$:19000:0:99999:7:::\n"


def write(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def bucket_bytes(world: World) -> dict[str, bytes]:
    """Every object of the checkpoint bucket: what the job can read back."""
    return {key: world.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in world.object_keys()}


def leaked(world: World, secret: bytes = SECRET) -> list[str]:
    return [key for key, body in bucket_bytes(world).items() if secret.strip() in body]


def committed_manifest(world: World) -> CheckpointManifest:
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    return world.storage.read_manifest(pointer.manifest_key)


def root_only(tmp_path: Path) -> Path:
    """Files of root's outside the checkpoint dir (/etc/shadow, the agent's state dir)."""
    place = tmp_path / "root-only"
    write(place, {"shadow": SECRET, "weights.bin": SECRET, "a.bin": SECRET, "hours": b"4242\n"})
    return place


def restore_into(world: World, target: Path, **kwargs: Any) -> CheckpointManifest | None:
    return world.checkpointer(9, target, **kwargs).restore(world.store.get_checkpoint(JOB_ID))


def swap_after_listing(monkeypatch: pytest.MonkeyPatch, swap: Any) -> None:
    """The job's move, made right after the agent listed the dir and before it opens anything."""

    def listed_then_swapped(*args: Any, **kwargs: Any) -> Any:
        listing = scan_checkpoint_dir(*args, **kwargs)
        swap()
        return listing

    monkeypatch.setattr(checkpointer_module, "scan_checkpoint_dir", listed_then_swapped)


# --- checkpoint ---------------------------------------------------------------------------------------


def test_links_and_special_files_are_left_out_and_the_rest_is_saved(
    world: World, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a checkpoint dir where the job planted links to root's files next to its own weights
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    weights = os.urandom(30_000)
    write(ckpt, {"weights.bin": weights})
    (ckpt / "leak.bin").symlink_to(secrets / "shadow")
    (ckpt / "models").symlink_to(secrets)  # a directory symlink
    (ckpt / ".spotrelay-progress").symlink_to(secrets / "hours")  # a progress "file" that is root's
    (ckpt / "sub").mkdir()
    os.mkfifo(ckpt / "sub" / "pipe")  # opened, it would block the agent

    # When it is checkpointed
    result = world.checkpointer(1, ckpt).take("periodic")

    # Then the checkpoint commits with the job's own file only, and none of root's bytes are in S3
    assert result.committed
    assert leaked(world) == []
    manifest = committed_manifest(world)
    assert [f.path for f in manifest.files] == ["weights.bin"]
    assert manifest.work_done_hours is None  # not 4242, read from root's file
    assert sorted(result.left_out) == [".spotrelay-progress", "leak.bin", "models", "sub/pipe"]
    # and each is named in a warning by its place in the dir, never by where it points
    warnings = [r for r in agent_logs.records if r.levelno == logging.WARNING]
    assert sorted(r.__dict__["path"] for r in warnings) == sorted(result.left_out)
    assert not [r for r in agent_logs.records if str(secrets) in str(r.__dict__)]
    # and a restore gives back exactly the job's file
    target = tmp_path / "restored"
    restore_into(world, target)
    assert contents(target) == {"weights.bin": weights}


def test_a_file_swapped_for_a_symlink_after_the_listing_is_not_followed(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a checkpoint dir of two regular files
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"weights.bin": b"the job's weights", "notes.txt": b"the job's notes"})

    # and a job that replaces notes.txt by a symlink to root's file once the agent has listed the dir
    def swap() -> None:
        (ckpt / "notes.txt").unlink()
        (ckpt / "notes.txt").symlink_to(secrets / "shadow")

    swap_after_listing(monkeypatch, swap)

    # When the final checkpoint is taken
    result = world.checkpointer(1, ckpt).take("final", final=True)

    # Then root's bytes are not in S3, and the checkpoint commits with the rest
    assert leaked(world) == []
    assert result.committed
    assert result.left_out == ("notes.txt",)
    assert [f.path for f in committed_manifest(world).files] == ["weights.bin"]


def test_a_directory_symlink_is_not_walked_not_even_one_swapped_in_after_the_listing(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a checkpoint dir with a directory symlink to root's files, and a real directory sub/
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"sub/a.bin": b"the job's a", "top.bin": b"the job's top"})
    (ckpt / "linked").symlink_to(secrets)

    # and a job that swaps sub/ for a symlink to root's dir (which holds an a.bin too) after the listing
    def swap() -> None:
        (ckpt / "sub").rename(tmp_path / "sub-moved")
        (ckpt / "sub").symlink_to(secrets)

    swap_after_listing(monkeypatch, swap)

    # When the final checkpoint is taken
    result = world.checkpointer(1, ckpt).take("final", final=True)

    # Then nothing of root's dir is in S3: neither the linked dir nor the swapped one was walked
    assert leaked(world) == []
    assert result.committed
    assert [f.path for f in committed_manifest(world).files] == ["top.bin"]
    assert sorted(result.left_out) == ["linked", "sub/a.bin"]


def test_a_hard_link_to_a_file_the_job_user_does_not_own_is_left_out(world: World, tmp_path: Path) -> None:
    # Given a job running as its own user (not the owner of these files), whose dir holds a file and a
    # hard link to a file it does not own (what fs.protected_hardlinks=0 would let it make)
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    write(ckpt, {"weights.bin": b"weights"})
    os.link(secrets / "shadow", ckpt / "shadow")
    job_uid = os.getuid() + 1

    # When it is checkpointed
    result = world.checkpointer(1, ckpt, job_uid=job_uid).take("periodic")

    # Then the linked file is not in S3
    assert leaked(world) == []
    assert result.left_out == ("shadow",)
    assert [f.path for f in committed_manifest(world).files] == ["weights.bin"]


def test_a_checkpoint_dir_the_job_replaced_by_a_symlink_is_not_followed(world: World, tmp_path: Path) -> None:
    # Given a checkpoint dir that is a symlink of the job user's to root's files
    secrets = root_only(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.symlink_to(secrets)

    # When it is checkpointed, Then the checkpoint is dropped, saying why, and nothing is uploaded
    with pytest.raises(CheckpointTampered, match="symlink"):
        world.checkpointer(1, ckpt, job_uid=os.getuid()).take("final", final=True)
    assert world.object_keys() == []


# --- restore ------------------------------------------------------------------------------------------


def test_a_restore_replaces_a_planted_symlink_instead_of_writing_through_it(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a committed checkpoint of weights.bin
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"checkpointed weights", "sub/step.txt": b"7"})
    assert world.checkpointer(1, source).take("final", final=True).committed
    # and a checkpoint dir (a mount point, restored in place) where the job planted symlinks named like
    # the checkpoint's files and like the restore's staging dir
    secrets = root_only(tmp_path)
    target = tmp_path / "mounted"
    target.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == target)
    (target / "weights.bin").symlink_to(secrets / "weights.bin")
    (target / "sub").symlink_to(secrets)
    (target / ".spotrelay-restore").symlink_to(secrets)
    before = contents(secrets)

    # When it is restored
    restore_into(world, target)

    # Then root's files are as they were, and the dir holds the checkpoint's regular files
    assert contents(secrets) == before
    assert contents(target) == {"weights.bin": b"checkpointed weights", "sub/step.txt": b"7"}
    assert not (target / "weights.bin").is_symlink()
    assert not (target / "sub").is_symlink()


class SwapsStagingBeforeDownload:
    """Storage whose download starts just after the job swapped the restore's staging dir for a
    symlink to root's dir (a job process left running, racing the agent)."""

    def __init__(self, inner: Any, staging: Path, to: Path) -> None:
        self.inner = inner
        self.staging = staging
        self.to = to

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def download(self, items: Any) -> None:
        self.staging.rename(self.staging.with_name("moved-by-the-job"))
        self.staging.symlink_to(self.to)
        self.inner.download(items)


@pytest.mark.skipif(not HAS_FD_PATHS, reason="without /proc/self/fd a download goes by the staging dir's path")
@pytest.mark.parametrize("mount_point", [False, True], ids=["next to the dir", "inside a mount point"])
def test_a_staging_dir_swapped_for_a_symlink_mid_restore_is_not_written_through(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mount_point: bool
) -> None:
    # Given a committed checkpoint, and a checkpoint dir that holds the job's earlier files
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"checkpointed weights", "a.bin": b"checkpointed a"})
    assert world.checkpointer(1, source).take("final", final=True).committed
    secrets = root_only(tmp_path)
    before = contents(secrets)
    target = tmp_path / "job" / "ckpt"
    write(target, {"before.txt": b"the job's"})
    if mount_point:
        monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == target)
    staging = target / ".spotrelay-restore" if mount_point else target.parent / ".spotrelay-restore-ckpt"

    # When it is restored while the job swaps the staging dir for a symlink to root's dir
    restorer = world.checkpointer(9, target)
    restorer.storage = SwapsStagingBeforeDownload(world.storage, staging, secrets)
    failure: Exception | None = None
    try:
        restorer.restore(world.store.get_checkpoint(JOB_ID))
    except Exception as e:
        failure = e

    # Then nothing was written into (or moved out of) root's dir, and the checkpoint dir is as it was
    assert contents(secrets) == before
    assert contents(target) == {"before.txt": b"the job's"}
    assert not target.is_symlink()
    # and the restore failed loudly, saying why (the agent then fails the attempt: the job does not start)
    assert isinstance(failure, RestoreIncomplete)
    assert "moved or replaced" in str(failure)
