"""Taking and restoring checkpoints: the order of the writes is the integrity.

Take (`Checkpointer.take`):
1. scan the dir, hash what changed, plan (`spotrelay.agent.checkpoints`); skip a periodic
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
mismatch raises CheckpointIntegrityError and leaves the checkpoint dir as it was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from spotrelay.agent.checkpoints import (
    DEFAULT_REFRESH_AFTER,
    CheckpointIntegrityError,
    FileAction,
    IndexedFile,
    LocalFile,
    PlannedFile,
    TransferCancelled,
    checkpoint_prefix,
    files_to_hash,
    install_restored,
    plan_checkpoint,
    racy_after,
    racy_mtime,
    read_progress,
    remove_path,
    same_contents,
    scan_checkpoint_dir,
    sha256_many,
    staging_dir,
    stat_file,
    verify_dir,
)
from spotrelay.clock import SYSTEM_CLOCK, ClockEvent
from spotrelay.control.ports import CheckpointPointer
from spotrelay.models import CheckpointManifest


class CheckpointStorage(Protocol):
    """The checkpoint bucket (`spotrelay.aws.checkpoints.S3CheckpointStorage`)."""

    def upload(self, items: Sequence[tuple[Path, str]], cancel: ClockEvent | None = None) -> list[str]: ...

    def copy(self, items: Sequence[tuple[str, str]], cancel: ClockEvent | None = None) -> list[str]: ...

    def download(self, items: Sequence[tuple[str, Path]]) -> None: ...

    def put_manifest(self, manifest: CheckpointManifest) -> str: ...

    def read_manifest(self, key: str) -> CheckpointManifest: ...

    def last_modified(self, keys: Sequence[str]) -> dict[str, datetime]: ...


class CheckpointPointers(Protocol):
    """The part of `JobStore` that holds the job's checkpoint pointer."""

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool: ...

    def get_checkpoint(self, job_id: str) -> CheckpointPointer | None: ...


class CheckpointCancelled(Exception):
    """A periodic checkpoint was dropped for a notice (what it uploaded stays reusable)."""


class CheckpointUnstable(Exception):
    """Files changed while they were uploaded: this periodic checkpoint is dropped."""


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
    ) -> None:
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
        progress = read_progress(self.dir)
        scanned_at_ns = time.time_ns()  # the kernel's clock, which stamps the mtimes it is compared with
        local = scan_checkpoint_dir(self.dir)
        if not local and not final:
            return CheckpointResult(reason=reason, seq=seq, committed=False, skipped="the checkpoint dir is empty")
        try:
            digests = sha256_many(self.dir, files_to_hash(local, index))
        except FileNotFoundError as e:  # deleted between the scan and the read
            raise CheckpointUnstable(f"{e.filename} disappeared while it was read") from e
        now = self.clock()
        plan = plan_checkpoint(
            local, index, digests, prefix=prefix, now=now, refresh_after=None if final else self.refresh_after
        )
        manifest = plan.manifest(self.job_id, self.attempt, seq, now, progress, final=final)
        if not final and last is not None and not plan.uploads and not plan.copies and same_contents(manifest, last):
            return CheckpointResult(reason=reason, seq=seq, committed=False, skipped="nothing changed")

        with self._lock:  # reserved before anything is written under its prefix: never reused
            self.state.next_seq = seq + 1
        self._save()
        try:
            uploaded = self.storage.upload([(self.dir / f.path, f.key) for f in plan.uploads], cancel)
            copied = self.storage.copy([(f.source_key or "", f.key) for f in plan.copies], cancel)
        except TransferCancelled as e:
            done = set(e.completed)
            self._remember([f for f in plan.files if f.action is not FileAction.REUSE and f.key in done], scanned_at_ns)
            raise CheckpointCancelled(f"{reason} checkpoint {seq} cancelled") from e
        moved = [f for f in plan.uploads if stat_file(self.dir, f.path) != _as_local(f)]
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
            copied=tuple(f.path for f in plan.copies),
            reused=len(plan.reused),
            total_bytes=manifest.total_bytes,
            work_done_hours=progress,
            seconds=round(self.monotonic() - started, 3),
            committed_at=committed_at,
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
        none). Raises CheckpointIntegrityError when its bytes do not match its manifest."""
        if pointer is None:
            self.dir.mkdir(parents=True, exist_ok=True)
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
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        staging = staging_dir(self.dir)
        if staging.exists():
            remove_path(staging)
        staging.mkdir(parents=True)
        try:
            self.storage.download([(manifest.object_key(f), staging / f.path) for f in manifest.files])
            problems = verify_dir(staging, manifest)
        except Exception:
            remove_path(staging)
            raise
        if problems:
            remove_path(staging)
            raise CheckpointIntegrityError(pointer.manifest_key, problems)
        install_restored(staging, self.dir)

        referenced = [f.key for f in manifest.files if f.key is not None]
        written = self.storage.last_modified(referenced) if referenced else {}
        index: dict[str, IndexedFile] = {}
        for f in manifest.files:
            local = stat_file(self.dir, f.path)
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
