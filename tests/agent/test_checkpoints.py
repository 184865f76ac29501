"""The pure parts of checkpoints: what changed, what to upload, what restore verifies."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from spotrelay.agent.checkpoint_contents import (
    PROGRESS_FILE_NAME,
    STAGING_PREFIX,
    FileAction,
    IndexedFile,
    LocalFile,
    data_key,
    files_to_hash,
    plan_checkpoint,
    racy_after,
    read_progress,
    scan_checkpoint_dir,
    tail_lines,
    verify_dir,
)
from spotrelay.agent.confined import RestoreStaging
from spotrelay.models import CheckpointFile, CheckpointManifest

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PREFIX = "jobs/j/checkpoints/2-3/"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def indexed(path: str, data: bytes, mtime_ns: int = 1, key: str | None = None, age_days: float = 0) -> IndexedFile:
    return IndexedFile(
        path=path,
        size=len(data),
        mtime_ns=mtime_ns,
        sha256=sha(data),
        key=key or f"jobs/j/checkpoints/1-0/data/{path}",
        uploaded_at=NOW - timedelta(days=age_days),
    )


def test_only_files_whose_size_or_mtime_changed_are_read() -> None:
    index = {"a": indexed("a", b"aaa", mtime_ns=5), "b": indexed("b", b"bbb", mtime_ns=5)}
    local = {
        "a": LocalFile(path="a", size=3, mtime_ns=5),  # as indexed
        "b": LocalFile(path="b", size=3, mtime_ns=6),  # touched
        "c": LocalFile(path="c", size=1, mtime_ns=5),  # new
    }
    assert files_to_hash(local, index) == ["b", "c"]


def test_the_plan_reuses_known_bytes_uploads_new_ones_and_copies_aged_references() -> None:
    index = {
        "same.bin": indexed("same.bin", b"same", mtime_ns=1),
        "touched.bin": indexed("touched.bin", b"touched", mtime_ns=1),
        "old.bin": indexed("old.bin", b"old", mtime_ns=1, age_days=8),
        "edited.bin": indexed("edited.bin", b"before", mtime_ns=1),
    }
    local = {
        "same.bin": LocalFile(path="same.bin", size=4, mtime_ns=1),
        "touched.bin": LocalFile(path="touched.bin", size=7, mtime_ns=2),
        "old.bin": LocalFile(path="old.bin", size=3, mtime_ns=1),
        "edited.bin": LocalFile(path="edited.bin", size=5, mtime_ns=2),
        "renamed.bin": LocalFile(path="renamed.bin", size=4, mtime_ns=3),
    }
    digests = {"touched.bin": sha(b"touched"), "edited.bin": sha(b"after"), "renamed.bin": sha(b"same")}

    plan = plan_checkpoint(local, index, digests, prefix=PREFIX, now=NOW, refresh_after=timedelta(days=7))

    actions = {f.path: (f.action, f.key) for f in plan.files}
    assert actions == {
        "same.bin": (FileAction.REUSE, "jobs/j/checkpoints/1-0/data/same.bin"),
        "touched.bin": (FileAction.REUSE, "jobs/j/checkpoints/1-0/data/touched.bin"),
        "old.bin": (FileAction.COPY, PREFIX + "data/old.bin"),
        "edited.bin": (FileAction.UPLOAD, PREFIX + "data/edited.bin"),
        "renamed.bin": (FileAction.REUSE, "jobs/j/checkpoints/1-0/data/same.bin"),
    }
    assert plan.upload_bytes == 5
    manifest = plan.manifest("j", 2, 3, NOW, None)
    assert {f.path: f.key for f in manifest.files} == {
        "edited.bin": None,
        "old.bin": None,
        "renamed.bin": "jobs/j/checkpoints/1-0/data/same.bin",
        "same.bin": "jobs/j/checkpoints/1-0/data/same.bin",
        "touched.bin": "jobs/j/checkpoints/1-0/data/touched.bin",
    }
    # the next index keeps the age of what was referenced and dates what was written now
    after = plan.index(NOW)
    assert after["same.bin"].uploaded_at == index["same.bin"].uploaded_at
    assert after["old.bin"].uploaded_at == NOW
    assert after["touched.bin"].mtime_ns == 2


def test_a_final_plan_never_copies() -> None:
    index = {"old.bin": indexed("old.bin", b"old", age_days=30)}
    local = {"old.bin": LocalFile(path="old.bin", size=3, mtime_ns=1)}
    plan = plan_checkpoint(local, index, {}, prefix=PREFIX, now=NOW, refresh_after=None)
    assert [f.action for f in plan.files] == [FileAction.REUSE]


contents_st = st.binary(min_size=0, max_size=4)
tree_st = st.dictionaries(st.sampled_from(["a", "b", "c/d", "e"]), contents_st, max_size=4)


@given(before=tree_st, after=tree_st)
def test_a_plan_uploads_exactly_the_contents_no_earlier_checkpoint_holds(
    before: dict[str, bytes], after: dict[str, bytes]
) -> None:
    # Given an index of `before` (uploaded by checkpoint 1-0) and a dir that now holds `after`
    index = {path: indexed(path, data, mtime_ns=1) for path, data in before.items()}
    local = {path: LocalFile(path=path, size=len(data), mtime_ns=2) for path, data in after.items()}
    digests = {path: sha(data) for path, data in after.items()}

    plan = plan_checkpoint(local, index, digests, prefix=PREFIX, now=NOW)

    # Then every file is in the plan; what is uploaded is exactly what no indexed file holds,
    # and what is referenced points at an object with the same bytes
    held_by = {f"jobs/j/checkpoints/1-0/data/{p}": (sha(d), len(d)) for p, d in before.items()}
    assert {f.path for f in plan.files} == set(after)
    for f in plan.files:
        content = (sha(after[f.path]), len(after[f.path]))
        if content in held_by.values():
            assert f.action is FileAction.REUSE
            assert held_by[f.key] == content
        else:
            assert (f.action, f.key) == (FileAction.UPLOAD, data_key(PREFIX, f.path))


def test_the_scan_finds_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"a")
    (tmp_path / "b.bin").write_bytes(b"bb")
    (tmp_path / "link").symlink_to(tmp_path / "b.bin")
    (tmp_path / ".spotrelay-restore").mkdir()
    (tmp_path / ".spotrelay-restore" / "partial").write_bytes(b"x")
    assert sorted(scan_checkpoint_dir(tmp_path)) == ["b.bin", "sub/a.bin"]
    assert scan_checkpoint_dir(tmp_path / "missing") == {}


@pytest.mark.parametrize(
    ("text", "hours"),
    [("2.5\n", 2.5), ("0", 0.0), ("-1", None), ("nan", None), ("inf", None), ("soon", None)],
)
def test_progress_is_a_non_negative_number_or_nothing(tmp_path: Path, text: str, hours: float | None) -> None:
    (tmp_path / PROGRESS_FILE_NAME).write_text(text)
    assert read_progress(tmp_path) == hours


def test_no_progress_file_means_no_progress(tmp_path: Path) -> None:
    assert read_progress(tmp_path) is None


def test_verification_names_every_difference(tmp_path: Path) -> None:
    (tmp_path / "good").write_bytes(b"good")
    (tmp_path / "bad").write_bytes(b"evil")
    (tmp_path / "extra").write_bytes(b"?")
    manifest = CheckpointManifest(
        job_id="j",
        attempt=1,
        seq=0,
        created_at=NOW,
        files=(
            CheckpointFile(path="good", size=4, sha256=sha(b"good")),
            CheckpointFile(path="bad", size=4, sha256=sha(b"good")),
            CheckpointFile(path="gone", size=1, sha256=sha(b"g")),
        ),
    )
    problems = verify_dir(tmp_path, manifest)
    assert problems[0].startswith("bad: sha256 ")
    assert problems[1:] == ["gone: missing", "extra: not in the manifest"]


def test_a_manifest_cannot_reference_another_jobs_objects() -> None:
    with pytest.raises(ValidationError, match="keys must be under jobs/j/checkpoints/"):
        CheckpointManifest(
            job_id="j",
            attempt=1,
            seq=0,
            created_at=NOW,
            files=(CheckpointFile(path="a", size=1, sha256=sha(b"a"), key="jobs/other/checkpoints/1-0/data/a"),),
        )


def test_installing_a_restore_replaces_the_dir_in_one_rename(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "stale").write_bytes(b"old")
    with RestoreStaging(target, prefix=STAGING_PREFIX) as staging:
        assert staging.where.parent == tmp_path
        staging.path_of("fresh").write_bytes(b"new")
        staging.install()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert [p.name for p in target.iterdir()] == ["fresh"]


def test_installing_into_a_mount_point_moves_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a checkpoint dir that is a mount point (it cannot be renamed)
    target = tmp_path / "ckpt"
    target.mkdir()
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == target)
    (target / "stale").write_bytes(b"old")
    with RestoreStaging(target, prefix=STAGING_PREFIX) as staging:
        assert staging.where.parent == target
        staging.path_of("sub").mkdir()
        staging.path_of("sub/fresh").write_bytes(b"new")

        # When the restore is installed, Then the dir holds the restored files only
        staging.install()
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == ["sub", "sub/fresh"]


def test_the_log_tail_is_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail_lines(log, 3) == ["line 97", "line 98", "line 99"]
    assert tail_lines(log, 3, max_bytes=20) == ["line 98", "line 99"]  # the cut first line is dropped
    assert tail_lines(tmp_path / "none.log") == []
    log.write_text("x" * 1000)
    assert tail_lines(log, 2, max_line_chars=10) == ["x" * 10]


def test_a_file_changed_right_before_the_scan_is_hashed_again_next_time() -> None:
    # Given a plan of two files, one modified long before the scan and one just before it
    scanned_at = 10_000_000_000_000
    local = {
        "old": LocalFile(path="old", size=1, mtime_ns=scanned_at - 60_000_000_000),
        "fresh": LocalFile(path="fresh", size=1, mtime_ns=scanned_at - 1_000_000),
    }
    plan = plan_checkpoint(local, {}, {"old": sha(b"o"), "fresh": sha(b"f")}, prefix=PREFIX, now=NOW)

    # When the index is taken from it
    index = plan.index(NOW, racy_after(scanned_at))

    # Then the fresh file's mtime is not trusted: the next checkpoint reads it again, the old one it does not
    assert files_to_hash(local, index) == ["fresh"]
