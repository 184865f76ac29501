"""Checkpoint contents without AWS: what is in the dir, what changed, what to upload, what to verify.

Incremental checkpoints by reference. Each checkpoint `<attempt>-<seq>` has its own prefix; a file
whose bytes changed since the agent last saw it is uploaded to `<prefix>data/<path>`, and a file
whose bytes did not change is *referenced* where an earlier checkpoint of the job put it: its
manifest entry carries that object's key (`CheckpointFile.key`). So a checkpoint costs the bytes of
its delta plus one small manifest, however large the dir is, and restore stays simple: read one
manifest, download every key it lists, verify size and sha256. (Server-side CopyObject of every
unchanged file would make each checkpoint self-contained, but copying a 40 GiB dir inside S3 takes
minutes and doubles the storage per checkpoint; the notice gives two minutes.)

What "changed" means: the agent keeps an index of what it uploaded or restored (path -> size,
mtime_ns, sha256, key, upload time). A file whose size and mtime match its index entry is unchanged
without reading it; any other file is hashed, and if its sha256 and size match the entry of the same
path (or of any other indexed file: a renamed or copied file), it is referenced too. Only the rest
is uploaded. (As git does with its index, a file modified within two seconds of the scan that
indexed it is hashed again next time: a rewrite within the file system's mtime resolution would
otherwise go unnoticed.)

References age: the bucket's lifecycle rule expires objects by age (`checkpoint_retention_days`),
and a long job can keep referencing a file uploaded weeks ago. A referenced object older than
`refresh_after` (7 days by default) is copied server-side into the new checkpoint, never in the final
checkpoint at a notice (the two minutes are for the delta), so the latest manifest never points at
an object close to expiry.

Progress: a job may write `$SPOTRELAY_PROGRESS_FILE` (`<checkpoint dir>/.spotrelay-progress`), one
number: reference-GPU hours done. It lives in the checkpoint dir, so it travels with the data it
describes; the agent reads it for the manifest's `work_done_hours`. Without it, `work_done_hours` is
None in the manifest and the pointer keeps the best value known before (the previous pointer's, or
the attempt's `work_done_hours_at_start`).

The dir is the job's, and the agent reads it as root: nothing in it is trusted. Every entry is reached
through directory fds without following a link, and a file is hashed and uploaded from the one fd
that fstat proved a regular file (`spotrelay.agent.confined`). Symlinks, FIFOs, sockets, devices and
hard links to files the job user does not own are left out of the checkpoint with a warning (their
relative path, never a link's target), and the checkpoint commits with the rest.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict

from spotrelay.agent.confined import ConfinedDir, LeftOut, NotRead, OpenFile, sha256_of_fd
from spotrelay.models import CheckpointFile, CheckpointManifest

PROGRESS_FILE_NAME = ".spotrelay-progress"
STAGING_PREFIX = ".spotrelay-"  # restore staging and replaced dirs (top level); never part of a checkpoint
MANIFEST_NAME = "manifest.json"
DEFAULT_REFRESH_AFTER = timedelta(days=7)
HASH_THREADS = 8  # hashlib releases the GIL on large reads: files hash in parallel
RACY_WINDOW_NS = 2_000_000_000
NO_MTIME = -1  # an index entry that never matches a file's mtime


def job_prefix(job_id: str) -> str:
    return f"jobs/{job_id}/checkpoints/"


def checkpoint_prefix(job_id: str, attempt: int, seq: int) -> str:
    return f"{job_prefix(job_id)}{attempt}-{seq}/"


def manifest_key(job_id: str, attempt: int, seq: int) -> str:
    return checkpoint_prefix(job_id, attempt, seq) + MANIFEST_NAME


def data_key(prefix: str, path: str) -> str:
    return f"{prefix}data/{path}"


# --- the dir ----------------------------------------------------------------------------------------


class LocalFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str  # relative, '/'-separated
    size: int
    mtime_ns: int


def local_file(path: str, st: os.stat_result) -> LocalFile:
    return LocalFile(path=path, size=st.st_size, mtime_ns=st.st_mtime_ns)


def _is_staging(name: str) -> bool:
    return name.startswith(STAGING_PREFIX)


def scan_checkpoint_dir(
    root: Path | ConfinedDir, *, job_uid: int | None = None, left_out: list[LeftOut] | None = None
) -> dict[str, LocalFile]:
    """Every regular file under `root`, keyed by its '/'-separated path relative to `root`. Nothing is
    followed (`spotrelay.agent.confined`): symlinks, FIFOs, sockets, devices, hard links to files the
    job user does not own, and directories that cannot be walked are added to `left_out` instead (a
    checkpoint holds bytes, not links). A dir that does not exist has no files."""
    if isinstance(root, ConfinedDir):
        return {
            path: local_file(path, st)
            for path, st in root.regular_files(left_out=left_out, skip_top_dirs=_is_staging).items()
        }
    try:
        confined = ConfinedDir.open(root, job_uid=job_uid)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    with confined:
        return scan_checkpoint_dir(confined, left_out=left_out)


def sha256_of(path: Path) -> str:
    """The sha256 of a file the agent trusts (its own); the job's files are hashed from their open fds."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_open_files(files: Iterable[OpenFile], threads: int = HASH_THREADS) -> dict[str, str]:
    """The sha256 of each open file, read from its fd (several at once)."""
    files = list(files)
    if not files:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as pool:
        return dict(zip((f.path for f in files), pool.map(lambda f: sha256_of_fd(f.fd), files), strict=True))


MAX_PROGRESS_BYTES = 4096


def read_progress(root: Path | ConfinedDir) -> float | None:
    """Reference-GPU hours done, from the job's progress file; None when absent or not a number >= 0
    (or not a small regular file: a link to somewhere else is not read)."""
    if not isinstance(root, ConfinedDir):
        try:
            confined = ConfinedDir.open(root)
        except OSError:
            return None
        with confined:
            return read_progress(confined)
    data = root.read_small(PROGRESS_FILE_NAME, MAX_PROGRESS_BYTES)
    if data is None:
        return None
    try:
        value = float(data.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


# --- the index and the plan -------------------------------------------------------------------------


class IndexedFile(BaseModel):
    """A file the agent uploaded or restored: where its bytes are in S3, and how it looked on disk."""

    model_config = ConfigDict(frozen=True)

    path: str
    size: int
    mtime_ns: int
    sha256: str
    key: str
    uploaded_at: AwareDatetime


class FileAction(StrEnum):
    REUSE = "reuse"  # reference the object an earlier checkpoint uploaded
    UPLOAD = "upload"  # the bytes changed: upload them
    COPY = "copy"  # unchanged, but the referenced object is old: copy it server-side


class PlannedFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    size: int
    mtime_ns: int
    sha256: str
    action: FileAction
    key: str  # where the bytes will be
    source_key: str | None = None  # REUSE / COPY: where they are now
    uploaded_at: AwareDatetime | None = None  # REUSE: when the referenced object was written


class CheckpointPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    prefix: str
    files: tuple[PlannedFile, ...]

    @property
    def uploads(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action is FileAction.UPLOAD]

    @property
    def copies(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action is FileAction.COPY]

    @property
    def reused(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action is FileAction.REUSE]

    @property
    def upload_bytes(self) -> int:
        return sum(f.size for f in self.uploads)

    def manifest(
        self,
        job_id: str,
        attempt: int,
        seq: int,
        created_at: datetime,
        work_done_hours: float | None,
        *,
        final: bool = False,
    ) -> CheckpointManifest:
        files = tuple(
            CheckpointFile(
                path=f.path, size=f.size, sha256=f.sha256, key=None if f.key == data_key(self.prefix, f.path) else f.key
            )
            for f in sorted(self.files, key=lambda f: f.path)
        )
        return CheckpointManifest(
            job_id=job_id,
            attempt=attempt,
            seq=seq,
            created_at=created_at,
            work_done_hours=work_done_hours,
            files=files,
            final=final,
        )

    def index(self, written_at: datetime, racy_after_ns: int | None = None) -> dict[str, IndexedFile]:
        """The index after this checkpoint: objects written now are dated `written_at`. A file whose
        mtime is at or after `racy_after_ns` is indexed with no mtime (it is hashed again next time)."""
        return {
            f.path: IndexedFile(
                path=f.path,
                size=f.size,
                mtime_ns=racy_mtime(f.mtime_ns, racy_after_ns),
                sha256=f.sha256,
                key=f.key,
                uploaded_at=f.uploaded_at if f.action is FileAction.REUSE and f.uploaded_at else written_at,
            )
            for f in self.files
        }


def racy_after(scanned_at_ns: int) -> int:
    """Files modified this close to a scan may change again without a visible mtime change (file
    systems keep mtimes at the kernel's clock tick, milliseconds): they are hashed every time."""
    return scanned_at_ns - RACY_WINDOW_NS


def racy_mtime(mtime_ns: int, racy_after_ns: int | None) -> int:
    return NO_MTIME if racy_after_ns is not None and mtime_ns >= racy_after_ns else mtime_ns


def files_to_hash(local: Mapping[str, LocalFile], index: Mapping[str, IndexedFile]) -> list[str]:
    """Paths whose size or mtime differ from the index (or are not in it): only these are read."""
    return sorted(
        path
        for path, f in local.items()
        if (entry := index.get(path)) is None or (entry.size, entry.mtime_ns) != (f.size, f.mtime_ns)
    )


def plan_checkpoint(
    local: Mapping[str, LocalFile],
    index: Mapping[str, IndexedFile],
    digests: Mapping[str, str],
    *,
    prefix: str,
    now: datetime,
    refresh_after: timedelta | None = DEFAULT_REFRESH_AFTER,
) -> CheckpointPlan:
    """What the checkpoint at `prefix` does with each file of `local`.

    `digests` has the sha256 of every path `files_to_hash` returned; any other path is unchanged
    since its index entry. A file with known bytes is referenced (or copied, when the object is older
    than `refresh_after`; None never copies); the rest is uploaded to `<prefix>data/<path>`.
    """
    by_content = {(e.sha256, e.size): e for e in sorted(index.values(), key=lambda e: e.uploaded_at)}
    planned: list[PlannedFile] = []
    for path in sorted(local):
        f = local[path]
        digest = digests.get(path)
        entry = index.get(path)
        if digest is None:
            if entry is None:
                raise ValueError(f"{path}: neither hashed nor in the index")
            known: IndexedFile | None = entry
            digest = entry.sha256
        elif entry is not None and (entry.sha256, entry.size) == (digest, f.size):
            known = entry
        else:
            known = by_content.get((digest, f.size))
        own_key = data_key(prefix, path)
        if known is None:
            planned.append(
                PlannedFile(
                    path=path, size=f.size, mtime_ns=f.mtime_ns, sha256=digest, action=FileAction.UPLOAD, key=own_key
                )
            )
        elif refresh_after is not None and now - known.uploaded_at >= refresh_after:
            planned.append(
                PlannedFile(
                    path=path,
                    size=f.size,
                    mtime_ns=f.mtime_ns,
                    sha256=digest,
                    action=FileAction.COPY,
                    key=own_key,
                    source_key=known.key,
                )
            )
        else:
            planned.append(
                PlannedFile(
                    path=path,
                    size=f.size,
                    mtime_ns=f.mtime_ns,
                    sha256=digest,
                    action=FileAction.REUSE,
                    key=known.key,
                    source_key=known.key,
                    uploaded_at=known.uploaded_at,
                )
            )
    return CheckpointPlan(prefix=prefix, files=tuple(planned))


def same_contents(a: CheckpointManifest, b: CheckpointManifest) -> bool:
    """Whether two manifests describe the same bytes at the same paths (and the same progress)."""

    def contents(m: CheckpointManifest) -> set[tuple[str, int, str]]:
        return {(f.path, f.size, f.sha256) for f in m.files}

    return contents(a) == contents(b) and a.work_done_hours == b.work_done_hours


# --- restore ----------------------------------------------------------------------------------------


def verify_file(root: ConfinedDir, expected: CheckpointFile) -> str | None:
    """Why the file at `expected.path` under `root` is not `expected` (size, then sha256), or None if it is."""
    try:
        f = root.open_file(expected.path)
    except FileNotFoundError:
        return f"{expected.path}: missing"
    except NotRead as e:
        return f"{expected.path}: not a regular file ({e.why})"
    try:
        if f.st.st_size != expected.size:
            return f"{expected.path}: {f.st.st_size} bytes, the manifest says {expected.size}"
        digest = sha256_of_fd(f.fd)
    finally:
        os.close(f.fd)
    if digest != expected.sha256:
        return f"{expected.path}: sha256 {digest}, the manifest says {expected.sha256}"
    return None


def verify_dir(root: Path | ConfinedDir, manifest: CheckpointManifest, threads: int = HASH_THREADS) -> list[str]:
    """Every way the files under `root` differ from `manifest` (missing, size, sha256, extra entries)."""
    if not isinstance(root, ConfinedDir):
        with ConfinedDir.open(root) as confined:
            return verify_dir(confined, manifest, threads)
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(manifest.files) or 1))) as pool:
        problems = [p for p in pool.map(lambda f: verify_file(root, f), manifest.files) if p is not None]
    left_out: list[LeftOut] = []
    found = scan_checkpoint_dir(root, left_out=left_out)
    expected = {f.path for f in manifest.files}
    problems.extend(f"{path}: not in the manifest" for path in sorted(set(found) - expected))
    problems.extend(f"{e.path}: not in the manifest ({e.why})" for e in left_out if e.path not in expected)
    return problems


# --- the job's log ----------------------------------------------------------------------------------


def tail_lines(path: Path, lines: int = 20, max_bytes: int = 64 * 1024, max_line_chars: int = 500) -> list[str]:
    """The last `lines` lines of a log file (reading at most its last `max_bytes`), each cut to
    `max_line_chars`; [] when there is no file."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    if size > max_bytes:
        text = text.split("\n", 1)[-1]  # the first line read is probably cut
    kept = text.rstrip("\n").split("\n")[-lines:] if text.strip("\n") else []
    return [line[:max_line_chars] for line in kept]
