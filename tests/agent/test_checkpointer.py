"""Checkpoints on moto S3 and DynamoDB: data first, the manifest last, the pointer by a conditional
write; restore verifies every byte; incremental checkpoints reference what did not change."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotrelay.agent.checkpoint_contents import sha256_of
from spotrelay.agent.checkpointer import CheckpointCancelled, Checkpointer, CheckpointUnstable
from spotrelay.agent.ports import CheckpointIntegrityError
from spotrelay.control.ports import CheckpointPointer
from spotrelay.models import CheckpointManifest

from .conftest import BUCKET, JOB_ID, World


def write(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def restore_into(world: World, target: Path, attempt: int = 9) -> CheckpointManifest | None:
    """What a later attempt on a fresh instance restores."""
    return world.checkpointer(attempt, target).restore(world.store.get_checkpoint(JOB_ID))


class ManifestLost:
    """Storage whose manifest write never happens (the instance died after the data upload)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_manifest(self, manifest: CheckpointManifest) -> str:
        raise ConnectionError("the instance is gone")


class PointerLost:
    """A store whose pointer write never happens (the instance died after the manifest)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool:
        raise ConnectionError("the instance is gone")


def test_a_checkpoint_uploads_every_file_then_the_manifest_then_moves_the_pointer(world: World, tmp_path: Path) -> None:
    # Given a checkpoint dir with nested files and a progress file
    source = tmp_path / "ckpt"
    write(source, {"model/weights.pt": os.urandom(20_000), "optimizer.pt": b"adam", ".spotrelay-progress": b"3.25\n"})

    # When it is checkpointed
    result = world.checkpointer(1, source).take("periodic")

    # Then the data, the manifest and the pointer say the same, and restore gives back the same bytes
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.seq, pointer.work_done_hours) == (1, 0, 3.25)
    assert pointer.manifest_key == f"jobs/{JOB_ID}/checkpoints/1-0/manifest.json"
    assert result.committed
    assert sorted(result.uploaded) == sorted(contents(source))
    manifest = world.storage.read_manifest(pointer.manifest_key)
    assert manifest.work_done_hours == 3.25
    assert {f.path: f.sha256 for f in manifest.files} == {p: sha256_of(source / p) for p in contents(source)}
    target = tmp_path / "restored" / "ckpt"
    assert restore_into(world, target) == manifest
    assert contents(target) == contents(source)


def test_periodic_checkpoints_reference_unchanged_files_instead_of_uploading_them(world: World, tmp_path: Path) -> None:
    # Given a checkpoint of a big file and a small one
    source = tmp_path / "ckpt"
    big = os.urandom(200_000)
    write(source, {"weights.bin": big, "step.txt": b"1"})
    checkpointer = world.checkpointer(1, source)
    first = checkpointer.take("periodic")

    # When step.txt changes, weights.bin is rewritten with the same bytes (new mtime), and a copy of
    # it appears under a new name
    write(source, {"step.txt": b"2", "weights.bin": big, "latest/weights.bin": big})
    second = checkpointer.take("periodic")

    # Then only step.txt is uploaded; both weights entries point at the first checkpoint's object
    assert first.uploaded == ("step.txt", "weights.bin")
    assert second.uploaded == ("step.txt",)
    assert world.object_keys(f"jobs/{JOB_ID}/checkpoints/1-1/") == [
        f"jobs/{JOB_ID}/checkpoints/1-1/data/step.txt",
        f"jobs/{JOB_ID}/checkpoints/1-1/manifest.json",
    ]
    manifest = world.storage.read_manifest(f"jobs/{JOB_ID}/checkpoints/1-1/manifest.json")
    keys = {f.path: manifest.object_key(f) for f in manifest.files}
    assert keys["weights.bin"] == keys["latest/weights.bin"] == f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin"
    # and a checkpoint with nothing new is skipped
    assert checkpointer.take("periodic").skipped == "nothing changed"
    # and the restore of the incremental checkpoint is whole
    target = tmp_path / "restored"
    restore_into(world, target)
    assert contents(target) == contents(source)


def test_a_cut_off_upload_is_never_restored(world: World, tmp_path: Path) -> None:
    # Given a committed checkpoint
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"committed"})
    assert world.checkpointer(1, source).take("periodic").committed
    committed = contents(source)

    # When the next one stops after its data (no manifest), and the one after that after its manifest
    # (no pointer write)
    write(source, {"weights.bin": b"data without a manifest"})
    no_manifest = world.checkpointer(1, source)
    no_manifest.state.next_seq = 1
    no_manifest.storage = ManifestLost(world.storage)
    with pytest.raises(ConnectionError):
        no_manifest.take("periodic")
    write(source, {"weights.bin": b"manifest without a pointer"})
    no_pointer = world.checkpointer(1, source)
    no_pointer.state.next_seq = 2
    no_pointer.pointers = PointerLost(world.store)
    with pytest.raises(ConnectionError):
        no_pointer.take("periodic")

    # Then both left objects behind, but a restore gives back the committed checkpoint exactly
    assert f"jobs/{JOB_ID}/checkpoints/1-1/data/weights.bin" in world.object_keys()
    assert f"jobs/{JOB_ID}/checkpoints/1-2/manifest.json" in world.object_keys()
    target = tmp_path / "restored"
    manifest = restore_into(world, target)
    assert manifest is not None
    assert manifest.order == (1, 0)
    assert contents(target) == committed


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        (lambda s3, key: s3.put_object(Bucket=BUCKET, Key=key, Body=b"X" * 9), "sha256"),
        (lambda s3, key: s3.put_object(Bucket=BUCKET, Key=key, Body=b"short"), "bytes"),
        (lambda s3, key: s3.delete_object(Bucket=BUCKET, Key=key), "404"),
    ],
    ids=["same size, other bytes", "other size", "deleted"],
)
def test_a_tampered_checkpoint_fails_restore_loudly_and_leaves_the_dir_alone(
    world: World, tmp_path: Path, tamper: Any, problem: str
) -> None:
    # Given a committed checkpoint whose object was changed afterwards
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"committed", "notes.txt": b"ok"})
    world.checkpointer(1, source).take("periodic")
    tamper(world.s3, f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin")
    # and a checkpoint dir that already holds something
    target = tmp_path / "restored"
    write(target, {"before.txt": b"untouched"})

    # When it is restored, Then restore fails, naming the problem, and the dir is as it was
    with pytest.raises(Exception, match=problem) as raised:
        restore_into(world, target)
    if problem != "404":
        assert isinstance(raised.value, CheckpointIntegrityError)
        assert raised.value.problems[0].startswith("weights.bin: ")
    assert contents(target) == {"before.txt": b"untouched"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".spotrelay-")] == []


def test_an_old_attempts_late_commit_cannot_move_the_pointer_back(world: World, tmp_path: Path) -> None:
    # Given attempt 2 committed a checkpoint while attempt 1's instance was still uploading
    old_dir, new_dir = tmp_path / "instance-1", tmp_path / "instance-2"
    write(old_dir, {"weights.bin": b"attempt 1, late"})
    write(new_dir, {"weights.bin": b"attempt 2"})
    old = world.checkpointer(1, old_dir, state=None)
    old.state.next_seq = 7
    assert world.checkpointer(2, new_dir).take("periodic").committed

    # When attempt 1's final checkpoint arrives afterwards
    late = old.take("final", final=True)

    # Then it is written but not committed, and restore still gives attempt 2's checkpoint
    assert (late.seq, late.committed) == (7, False)
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.seq) == (2, 0)
    target = tmp_path / "restored"
    restore_into(world, target, attempt=3)
    assert contents(target) == {"weights.bin": b"attempt 2"}


def test_a_restored_checkpoint_makes_the_next_checkpoint_incremental(world: World, tmp_path: Path) -> None:
    # Given attempt 1's checkpoint restored on attempt 2's instance
    write(tmp_path / "instance-1", {"weights.bin": os.urandom(50_000), "step.txt": b"1"})
    world.checkpointer(1, tmp_path / "instance-1").take("final", final=True)
    restored = world.checkpointer(2, tmp_path / "instance-2")
    restored.restore(world.store.get_checkpoint(JOB_ID))

    # When attempt 2 changes one file and checkpoints
    write(tmp_path / "instance-2", {"step.txt": b"2"})
    result = restored.take("periodic")

    # Then only that file is uploaded, under attempt 2's prefix
    assert result.committed
    assert result.uploaded == ("step.txt",)
    assert result.seq == 0
    manifest = world.storage.read_manifest(f"jobs/{JOB_ID}/checkpoints/2-0/manifest.json")
    weights = next(f for f in manifest.files if f.path == "weights.bin")
    assert weights.key == f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin"


def test_old_references_are_copied_forward_but_never_at_the_notice(world: World, tmp_path: Path) -> None:
    # Given a checkpoint whose objects are 8 days old by the agent's clock
    now = [datetime(2026, 11, 1, tzinfo=UTC)]
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"w" * 1000, "step.txt": b"1"})
    checkpointer = world.checkpointer(1, source, clock=lambda: now[0], refresh_after=timedelta(days=7))
    checkpointer.take("periodic")
    now[0] += timedelta(days=8)
    write(source, {"step.txt": b"2"})

    # When a final checkpoint is taken, Then it references the old object (the notice is for the delta)
    final = checkpointer.take("final", final=True)
    assert (final.uploaded, final.copied) == (("step.txt",), ())

    # When a periodic checkpoint is taken, Then it copies the aged object server-side into its own prefix
    write(source, {"step.txt": b"3"})
    periodic = checkpointer.take("periodic")
    assert (periodic.uploaded, periodic.copied) == (("step.txt",), ("weights.bin",))
    manifest = world.storage.read_manifest(f"jobs/{JOB_ID}/checkpoints/1-{periodic.seq}/manifest.json")
    weights = next(f for f in manifest.files if f.path == "weights.bin")
    assert weights.key is None  # in this checkpoint's own prefix
    target = tmp_path / "restored"
    restore_into(world, target)
    assert contents(target) == contents(source)


def test_a_cancelled_checkpoint_is_dropped_and_the_next_one_goes_on_from_it(world: World, tmp_path: Path) -> None:
    # Given a periodic checkpoint cancelled before it could start its uploads
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"w" * 1000})
    checkpointer = world.checkpointer(1, source)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CheckpointCancelled):
        checkpointer.take("periodic", cancel=cancel)

    # When the final checkpoint follows
    final = checkpointer.take("final", final=True)

    # Then it has its own sequence number and is committed
    assert (final.seq, final.committed) == (1, True)
    assert world.store.get_checkpoint(JOB_ID) is not None


def test_a_manifest_that_is_not_the_checkpoint_the_pointer_names_is_corrupt(world: World, tmp_path: Path) -> None:
    # Given a pointer to a manifest of another checkpoint
    write(tmp_path / "ckpt", {"a": b"1"})
    world.checkpointer(1, tmp_path / "ckpt").take("periodic")
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    wrong = pointer.model_copy(update={"seq": 5})

    # When it is restored, Then it is refused
    with pytest.raises(CheckpointIntegrityError, match="pointer names 1-5"):
        Checkpointer(
            job_id=JOB_ID, attempt=2, checkpoint_dir=tmp_path / "t", storage=world.storage, pointers=world.store
        ).restore(wrong)


class WritesBeforeUpload:
    """Storage whose upload starts just after the job did something to its dir (`act`)."""

    def __init__(self, inner: Any, act: Any) -> None:
        self.inner = inner
        self.act = act

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def upload(self, items: Any, cancel: Any = None) -> list[str]:
        self.act()
        result: list[str] = self.inner.upload(items, cancel)
        return result


def test_a_file_written_to_while_it_is_uploaded_drops_the_periodic_checkpoint(world: World, tmp_path: Path) -> None:
    # Given a job that appends to its weights while the agent uploads them
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"step 1"})
    checkpointer = world.checkpointer(1, source)

    def append() -> None:
        with (source / "weights.bin").open("ab") as f:
            f.write(b" and more")

    checkpointer.storage = WritesBeforeUpload(world.storage, append)

    # When a periodic checkpoint is taken, Then it is dropped, and nothing is committed
    with pytest.raises(CheckpointUnstable, match=r"weights\.bin"):
        checkpointer.take("periodic")
    assert world.store.get_checkpoint(JOB_ID) is None


def test_a_file_replaced_by_a_rename_during_the_upload_is_saved_as_it_was_read(world: World, tmp_path: Path) -> None:
    # Given a job that saves atomically (a temporary file renamed over the old one) while the agent uploads
    source = tmp_path / "ckpt"
    write(source, {"weights.bin": b"step 1"})
    checkpointer = world.checkpointer(1, source)

    def save_atomically() -> None:
        (source / "weights.tmp").write_bytes(b"step 2, a longer file")
        (source / "weights.tmp").replace(source / "weights.bin")

    checkpointer.storage = WritesBeforeUpload(world.storage, save_atomically)

    # When a checkpoint is taken
    result = checkpointer.take("periodic")

    # Then it holds the file the agent opened and hashed (its bytes, its size, its sha256): it restores whole
    assert result.committed
    target = tmp_path / "restored"
    restore_into(world, target)
    assert contents(target) == {"weights.bin": b"step 1"}
    # and the next checkpoint saves the new file
    checkpointer.storage = world.storage
    assert checkpointer.take("periodic").uploaded == ("weights.bin",)
    restore_into(world, target)
    assert contents(target) == {"weights.bin": b"step 2, a longer file"}
