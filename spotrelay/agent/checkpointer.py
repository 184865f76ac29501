"""Taking and restoring checkpoints: the order of the writes is the integrity.

Take (`Checkpointer.take`):
1. scan the dir, hash what changed, plan (`spotrelay.agent.checkpoint_contents`); skip a periodic
   checkpoint when nothing changed;
2. reserve the sequence number `seq` (saved before anything is uploaded: never reused);
3. upload the changed files to `<prefix>data/...` (parallel, multipart), copy aged references;
4. check that no uploaded file changed while it was read (a periodic checkpoint of a running job:
   such a checkpoint is dropped, the next interval tries again; jobs should write checkpoint
   files atomically, a temporary file then a rename);
5. write `manifest.json` - only after every object it lists exists;
6. advance the job's pointer in DynamoDB with the conditional monotonic write. Only then is the
   checkpoint committed: a crash or a cut-off upload before it leaves objects nobody points at.

A late write of an older attempt cannot move the pointer back: (attempt, seq) only increases, and
the write that loses reports `committed=False`.

Restore (`Checkpointer.restore`): read the pointer, read the manifest it names (it must be the
checkpoint the pointer says), download every file to a staging dir, verify each file's size and
sha256 and that no other file is there, then install the staging dir as the checkpoint dir. Any
mismatch raises CheckpointIntegrityError and leaves the checkpoint dir as it was. A restore the job's
doings keep from completing (its staging dir moved, removed or replaced, something planted where it
renames to) raises RestoreIncomplete, and the job is not started (`Checkpointer.restore` says why).

The agent is root and the dir is the job's (`spotrelay.agent.confined`): a checkpoint reads only
regular files, each hashed and uploaded from the one fd that fstat proved one, and never through a
symlink; whatever else the dir holds is left out with a warning (`CheckpointResult.left_out`) and the
checkpoint commits with the rest; a checkpoint dir that is no longer a directory when a checkpoint
opens it (the job put a symlink, a FIFO or a file in its place) drops that checkpoint
(CheckpointTampered, with a warning), and the next interval tries again. A restore writes only into a
staging dir it has just made (0700), reached through its fd, and puts the files in place by renames
that replace a planted symlink instead of following it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from spotrelay.agent.checkpoint_contents import (
    DEFAULT_REFRESH_AFTER,
    STAGING_PREFIX,
    FileAction,
    IndexedFile,
    LocalFile,
    PlannedFile,
    checkpoint_prefix,
    files_to_hash,
    local_file,
    plan_checkpoint,
    racy_after,
    racy_mtime,
    read_progress,
    same_contents,
    scan_checkpoint_dir,
    sha256_open_files,
    verify_dir,
)
from spotrelay.agent.confined import (
    ConfinedDir,
    LeftOut,
    NotRead,
    OpenFile,
    RestoreIncomplete,
    RestoreStaging,
    make_room_for,
    open_directory,
    reason,
)
from spotrelay.agent.logs import LOGGER_NAME
from spotrelay.agent.ports import CheckpointIntegrityError, CheckpointPointers, CheckpointStorage, TransferCancelled
from spotrelay.clock import SYSTEM_CLOCK, ClockEvent
from spotrelay.control.ports import CheckpointPointer
from spotrelay.models import CheckpointManifest

MAX_LEFT_OUT_WARNINGS = 20  # one line per entry left out, then one line with how many more


class CheckpointCancelled(Exception):
    """A periodic checkpoint was dropped for a notice (what it uploaded stays reusable)."""


class CheckpointUnstable(Exception):
    """Files changed while they were uploaded: this periodic checkpoint is dropped."""


class CheckpointTampered(CheckpointUnstable):
    """The checkpoint dir was not a directory the agent may read when the checkpoint opened it (the job
    put a symlink, a FIFO or a file in its place, or in the place of a dir above it): this checkpoint is
    dropped, the next one tries again. `path` is relative to the checkpoint dir ("." for the dir itself),
    `why` says what was there (never where a link points)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


class CheckpointResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: str  # periodic | rebalance | final
    seq: int
    committed: bool  # the pointer now names this checkpoint
    skipped: str | None = None  # why nothing was written (unchanged, empty)
    manifest_key: str | None = None
    files: int = 0
    uploaded: tuple[str, ...] = ()  # paths whose bytes this checkpoint uploaded
    uploaded_bytes: int = 0
    left_out: tuple[str, ...] = ()  # entries of the dir not saved: not regular files the job owns
    copied: tuple[str, ...] = ()
    reused: int = 0
    total_bytes: int = 0
    work_done_hours: float | None = None
    seconds: float = 0.0
    committed_at: AwareDatetime | None = None


class CheckpointerState(BaseModel):
    """The checkpointer's part of the agent's state file."""

    next_seq: int = 0
    files: dict[str, IndexedFile] = Field(default_factory=dict)
    last_manifest: CheckpointManifest | None = None
    work_done_hours: float = 0.0


def _as_local(f: PlannedFile) -> LocalFile:
    return LocalFile(path=f.path, size=f.size, mtime_ns=f.mtime_ns)


@dataclass
class _DirRead:
    """One checkpoint's read of the dir: its regular files (those opened, as fstat saw them), the open
    files (closed with this), their sha256, the progress, and what was left out."""

    root: ConfinedDir | None
    local: dict[str, LocalFile] = field(default_factory=dict)
    opened: dict[str, OpenFile] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    progress: float | None = None
    scanned_at_ns: int = field(default_factory=time.time_ns)
    left_out: list[LeftOut] = field(default_factory=list)

    def keep_open(self, paths: set[str]) -> None:
        """Close every open file but those of `paths` (the uploads)."""
        for path in set(self.opened) - paths:
            os.close(self.opened.pop(path).fd)

    def upload_items(self, uploads: Sequence[PlannedFile]) -> list[tuple[Path, str]]:
        """(where the transfer reads each upload: its open file, key)."""
        if not uploads:
            return []
        assert self.root is not None
        return [(self.root.path_of_open(self.opened[f.path]), f.key) for f in uploads]

    def written_since_read(self, uploads: Sequence[PlannedFile]) -> list[PlannedFile]:
        """The uploads whose open file changed (size, mtime) while it was read; a file renamed over
        one since is another file: what was uploaded is still what was hashed."""
        return [f for f in uploads if local_file(f.path, os.fstat(self.opened[f.path].fd)) != _as_local(f)]

    def close(self) -> None:
        for f in self.opened.values():
            os.close(f.fd)
        self.opened.clear()
        if self.root is not None:
            self.root.close()

    def __enter__(self) -> _DirRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Checkpointer:
    """Checkpoints of one job attempt's checkpoint dir."""

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        checkpoint_dir: Path,
        storage: CheckpointStorage,
        pointers: CheckpointPointers,
        state: CheckpointerState | None = None,
        persist: Callable[[CheckpointerState], None] = lambda _: None,
        refresh_after: timedelta | None = DEFAULT_REFRESH_AFTER,
        clock: Callable[[], datetime] = SYSTEM_CLOCK.now,
        monotonic: Callable[[], float] = SYSTEM_CLOCK.monotonic,
        job_uid: int | None = None,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        """`job_uid`: the job's user when it is not the agent's (the agent is root): a symlink it owns
        on the way to the dir is not followed, and a hard link to a file it does not own is left out."""
        self.job_id = job_id
        self.attempt = attempt
        self.dir = checkpoint_dir
        self.storage = storage
        self.pointers = pointers
        self.state = state or CheckpointerState()
        self._persist = persist
        self.refresh_after = refresh_after
        self.clock = clock
        self.monotonic = monotonic
        self.job_uid = job_uid
        self.log = log or logging.getLogger(LOGGER_NAME)
        self._lock = threading.Lock()

    def _save(self) -> None:
        with self._lock:
            snapshot = self.state.model_copy(deep=True)
        self._persist(snapshot)

    def follow_pointer(self, pointer: CheckpointPointer | None) -> None:
        """Never reuse a sequence number the pointer already names (a lost state file)."""
        if pointer is not None and pointer.attempt == self.attempt:
            with self._lock:
                self.state.next_seq = max(self.state.next_seq, pointer.seq + 1)
            self._save()

    # --- take ---------------------------------------------------------------------------------------

    def take(self, reason: str, *, final: bool = False, cancel: ClockEvent | None = None) -> CheckpointResult:
        """Upload what changed and commit a checkpoint. A final checkpoint (at a notice, the job
        stopped) is always committed, even if nothing changed, so that whoever waits for this
        attempt's final checkpoint sees it; a periodic one is skipped when nothing changed."""
        started = self.monotonic()
        with self._lock:
            seq = self.state.next_seq
            index = dict(self.state.files)
            last = self.state.last_manifest
            baseline_work = self.state.work_done_hours
        prefix = checkpoint_prefix(self.job_id, self.attempt, seq)
        with self._read_dir(index) as read:
            local, left_out = read.local, tuple(e.path for e in read.left_out)
            if not local and not final:
                return CheckpointResult(
                    reason=reason, seq=seq, committed=False, skipped="the checkpoint dir is empty", left_out=left_out
                )
            now = self.clock()
            plan = plan_checkpoint(
                local, index, read.digests, prefix=prefix, now=now, refresh_after=None if final else self.refresh_after
            )
            read.keep_open({f.path for f in plan.uploads})
            progress, scanned_at_ns = read.progress, read.scanned_at_ns
            manifest = plan.manifest(self.job_id, self.attempt, seq, now, progress, final=final)
            unchanged = not plan.uploads and not plan.copies and last is not None and same_contents(manifest, last)
            if unchanged and not final:
                return CheckpointResult(
                    reason=reason, seq=seq, committed=False, skipped="nothing changed", left_out=left_out
                )

            with self._lock:  # reserved before anything is written under its prefix: never reused
                self.state.next_seq = seq + 1
            self._save()
            try:
                uploaded = self.storage.upload(read.upload_items(plan.uploads), cancel)
                copied = self.storage.copy([(f.source_key or "", f.key) for f in plan.copies], cancel)
            except TransferCancelled as e:
                done = set(e.completed)
                self._remember(
                    [f for f in plan.files if f.action is not FileAction.REUSE and f.key in done], scanned_at_ns
                )
                raise CheckpointCancelled(f"{reason} checkpoint {seq} cancelled") from e
            moved = read.written_since_read(plan.uploads)
        if moved:
            done = set(uploaded) | set(copied)
            self._remember([f for f in plan.files if f.key in done and f not in moved], scanned_at_ns)
            raise CheckpointUnstable(f"{len(moved)} file(s) changed during the upload, e.g. {moved[0].path}")

        key = self.storage.put_manifest(manifest)
        work_done = progress if progress is not None else baseline_work
        committed_at = self.clock()
        pointer = CheckpointPointer(
            job_id=self.job_id,
            attempt=self.attempt,
            seq=seq,
            manifest_key=key,
            work_done_hours=work_done,
            committed_at=committed_at,
            final=final,
        )
        committed = self.pointers.advance_checkpoint(pointer)
        with self._lock:
            self.state.files = plan.index(now, racy_after(scanned_at_ns))
            if committed:
                self.state.last_manifest = manifest
                self.state.work_done_hours = work_done
        self._save()
        return CheckpointResult(
            reason=reason,
            seq=seq,
            committed=committed,
            manifest_key=key,
            files=len(plan.files),
            uploaded=tuple(f.path for f in plan.uploads),
            uploaded_bytes=plan.upload_bytes,
            left_out=left_out,
            copied=tuple(f.path for f in plan.copies),
            reused=len(plan.reused),
            total_bytes=manifest.total_bytes,
            work_done_hours=progress,
            seconds=round(self.monotonic() - started, 3),
            committed_at=committed_at,
        )

    def _read_dir(self, index: Mapping[str, IndexedFile]) -> _DirRead:
        """Scan the dir, open what changed since `index` and hash it from the open files (warning about
        what is left out). A file that is no longer a regular file when it is opened (swapped for a
        symlink since the scan) is left out too; one that is gone makes the checkpoint unstable."""
        try:
            root: ConfinedDir | None = ConfinedDir.open(self.dir, job_uid=self.job_uid)
        except FileNotFoundError:
            root = None
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise CheckpointTampered(".", reason(e)) from e
        read = _DirRead(root)
        try:
            if root is not None:
                read.progress = read_progress(root)
                read.scanned_at_ns = time.time_ns()  # the kernel's clock, which stamps the mtimes compared with it
                read.local = scan_checkpoint_dir(root, left_out=read.left_out)
                paths = files_to_hash(read.local, index)
                make_room_for(len(paths))
                for path in paths:
                    try:
                        f = root.open_file(path)
                    except NotRead as e:
                        read.left_out.append(LeftOut(path, e.why))
                        del read.local[path]
                        continue
                    except FileNotFoundError as e:  # deleted between the scan and the read
                        raise CheckpointUnstable(f"{path} disappeared while it was read") from e
                    read.opened[path] = f
                    read.local[path] = local_file(path, f.st)  # what the bytes hashed and uploaded are
            self._warn_left_out(read.left_out)
            read.digests = sha256_open_files(read.opened.values())
        except BaseException:
            read.close()
            raise
        return read

    def _warn_left_out(self, left_out: Sequence[LeftOut]) -> None:
        for entry in left_out[:MAX_LEFT_OUT_WARNINGS]:
            self.log.warning(
                "left out of the checkpoint: not a regular file of the job's",
                extra={"path": entry.path, "what": entry.why},
            )
        if len(left_out) > MAX_LEFT_OUT_WARNINGS:
            self.log.warning(
                "more entries left out of the checkpoint", extra={"count": len(left_out) - MAX_LEFT_OUT_WARNINGS}
            )

    def _remember(self, done: Sequence[PlannedFile], scanned_at_ns: int) -> None:
        """Objects a dropped checkpoint finished writing stay reusable by the next one."""
        if not done:
            return
        now = self.clock()
        racy = racy_after(scanned_at_ns)
        with self._lock:
            for f in done:
                self.state.files[f.path] = IndexedFile(
                    path=f.path,
                    size=f.size,
                    mtime_ns=racy_mtime(f.mtime_ns, racy),
                    sha256=f.sha256,
                    key=f.key,
                    uploaded_at=now,
                )
        self._save()

    # --- restore ------------------------------------------------------------------------------------

    def restore(self, pointer: CheckpointPointer | None) -> CheckpointManifest | None:
        """Install the checkpoint `pointer` names into the checkpoint dir (created empty when there is
        none). Raises CheckpointIntegrityError when its bytes do not match its manifest.

        Raises RestoreIncomplete when the checkpoint could not be put in place because of what happened
        to the dirs it goes through (the job moved, removed or replaced the staging dir, planted something
        where a rename goes, made a dir on the way a symlink): the error names the entry and what was
        wrong, and says whether the checkpoint dir now holds part of the checkpoint. The caller must then
        not start the job at all (the agent fails the attempt with JobFailed, and a new attempt restores
        the checkpoint, which is intact in S3), neither from the part restored nor from scratch:
        - a partial restore may be a corrupt start (weights of one step, optimizer state of another, or
          files missing that the job takes for "not saved yet") that the job's next checkpoint would then
          save as the job's latest;
        - a start from scratch (SPOTRELAY_RESUMED=0) throws the work away for good, not only on this
          instance: the new attempt's first checkpoint moves the pointer past the intact one, so every
          later attempt resumes from the scratch run, and a warning in the log is no record of that.
        Failing the attempt loses nothing: the pointer still names the intact checkpoint, the reason is in
        the task's failure cause and the agent's log, and restarts are bounded by max_restarts."""
        if pointer is None:
            try:
                os.close(open_directory(self.dir, job_uid=self.job_uid, create=True))
            except OSError as e:
                raise RestoreIncomplete(self.dir.name, f"the checkpoint dir cannot be made: {reason(e)}") from e
            return None
        manifest = self.storage.read_manifest(pointer.manifest_key)
        if (manifest.job_id, manifest.attempt, manifest.seq) != (pointer.job_id, pointer.attempt, pointer.seq):
            raise CheckpointIntegrityError(
                pointer.manifest_key,
                [
                    f"the manifest is checkpoint {manifest.attempt}-{manifest.seq} of {manifest.job_id}, "
                    f"the pointer names {pointer.attempt}-{pointer.seq} of {pointer.job_id}"
                ],
            )
        with RestoreStaging(self.dir, prefix=STAGING_PREFIX, job_uid=self.job_uid) as staging:
            try:
                try:
                    self.storage.download([(manifest.object_key(f), staging.path_of(f.path)) for f in manifest.files])
                except Exception:
                    staging.check_mine()  # a download into a staging dir the job removed fails: that is the why
                    raise
                problems = verify_dir(staging.confined, manifest)
                if problems:
                    raise CheckpointIntegrityError(pointer.manifest_key, problems)
                restored = scan_checkpoint_dir(staging.confined)  # the mtimes: a rename keeps them
                staging.install()
            except BaseException:
                staging.discard()
                raise
        for name in staging.left_behind:
            self.log.warning("the job's earlier files could not be removed after the restore", extra={"path": name})

        referenced = [f.key for f in manifest.files if f.key is not None]
        written = self.storage.last_modified(referenced) if referenced else {}
        index: dict[str, IndexedFile] = {}
        for f in manifest.files:
            local = restored.get(f.path)
            if local is None:  # pragma: no cover - verified a moment ago
                continue
            index[f.path] = IndexedFile(
                path=f.path,
                size=f.size,
                mtime_ns=local.mtime_ns,
                sha256=f.sha256,
                key=manifest.object_key(f),
                uploaded_at=written.get(f.key, manifest.created_at) if f.key else manifest.created_at,
            )
        with self._lock:
            self.state.files = index
            self.state.last_manifest = manifest
            self.state.work_done_hours = pointer.work_done_hours
            if pointer.attempt == self.attempt:
                self.state.next_seq = max(self.state.next_seq, pointer.seq + 1)
        self._save()
        return manifest
