"""The migration back to spot, on the old (on-demand) attempt's side: the attempt record read for a
migration request, and when to hand the job over.

Migration back to spot: the control plane (reconcile) sets `migrate_requested_at` on the attempt record
of a job it wants off its on-demand instance. The agent of an on-demand attempt (only those are ever
asked) reads the record every `migrate_poll_seconds`
on a thread of its own (a slow DynamoDB never holds up the IMDS poll) and answers like a spot notice,
recorded in the state file the same way (`reason: migrate`), so a restarted agent finishes the stop
instead of watching the job; the task fails with `Migrating`, and Recover closes the attempt and
terminates the instance. IMDS is checked first in each poll, so a spot notice seen in the same poll
wins. A read that fails is logged and tried again `migrate_poll_seconds` later.

A job given no grace at a notice (`checkpoint.grace_seconds: 0`: it saves only on its own schedule) would
lose everything since its last save if stopped at once. A migration has no two-minute deadline, so the
agent hands such a job over right after its next save instead. It scans the checkpoint dir every
`handover_scan_seconds` (names, sizes, mtimes; not the progress file) and hands over once the dir has
changed and then stayed still for `handover_quiet_seconds`, or, if the job does not save, after
`checkpoint.interval_minutes` + HANDOVER_SAVE_SLACK_SECONDS (not while the dir is changing, unless it
never stops: then HANDOVER_SAVE_SLACK_SECONDS later, within reconcile's handover limit). The final
checkpoint is taken of the dir as the job saved it, and only then is the job killed: a SIGTERM would set
it writing with no grace to finish (`Agent._hand_over_as_saved`, with the notice in
`spotrelay.agent.agent`). The job keeps working meanwhile; a request withdrawn meanwhile (the
standby went away) is dropped and the job goes on.

One concern of the worker agent (`spotrelay.agent.agent`: its loop asks `_handover_due` every poll);
its siblings are `heartbeat`, `background` (the clock threads the record reads run on), `output`,
`startup` (the standby's side: waiting to be handed the job) and `settings`.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime

from spotrelay.agent.background import BackgroundCheckpoints
from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME, scan_checkpoint_dir
from spotrelay.agent.ports import AgentStore
from spotrelay.agent.settings import AgentSettings
from spotrelay.models import Attempt, JobSpec

# A job that saves only on its own schedule is handed over after its next save, or after its checkpoint
# interval and this much more at the latest.
HANDOVER_SAVE_SLACK_SECONDS = 300.0


@dataclass
class DeferredHandover:
    requested_at: datetime
    deadline: float  # the clock's monotonic(): hand over by then, unless the job is in the middle of a save
    signature: tuple[tuple[str, int, int], ...]  # the checkpoint dir as last seen
    last_scan: float
    changed_at: float | None = None  # when the dir was last seen changing since the request


class MigrationHandover(BackgroundCheckpoints):
    """The migration request and the handover of `spotrelay.agent.agent.Agent` (a mixin: `Agent.__init__`
    sets the attributes)."""

    store: AgentStore
    settings: AgentSettings
    spec: JobSpec | None
    _migrate_read: Future[Attempt] | None
    _next_migrate_read: float
    _handover: DeferredHandover | None
    _request_withdrawn: bool

    def _handover_due(self, requested_at: datetime | None) -> datetime | None:
        """When to stop for a migration: at once, or for a job that saves only on its own schedule (no grace
        at a notice) once it has saved (module docstring). A deferred handover whose request is withdrawn
        (its standby went away) is dropped: the job goes on here."""
        assert self.spec is not None
        handover = self._handover
        if handover is None:
            if requested_at is None:
                return None
            if self.spec.checkpoint.grace_seconds > 0:
                return requested_at
            wait = self.spec.checkpoint.interval_minutes * 60 + HANDOVER_SAVE_SLACK_SECONDS
            now = self.clock.monotonic()
            self._handover = DeferredHandover(
                requested_at=requested_at,
                deadline=now + wait,
                signature=self._checkpoint_dir_signature(),
                last_scan=now,
            )
            self._request_withdrawn = False
            self.log.info(
                "migration back to spot requested: handing over after the job's next save",
                extra={"requested_at": requested_at.isoformat(), "wait_seconds": wait},
            )
            return None
        if self._request_withdrawn:
            self.log.info("the handover request was withdrawn: the job goes on here")
            self._handover = None
            return None
        now = self.clock.monotonic()
        if now - handover.last_scan < self.settings.handover_scan_seconds:
            return None
        handover.last_scan = now
        signature = self._checkpoint_dir_signature()
        if signature != handover.signature:
            handover.signature, handover.changed_at = signature, now  # being written: wait for it to settle
            return None
        settled = handover.changed_at is not None and now - handover.changed_at >= self.settings.handover_quiet_seconds
        if settled:
            return handover.requested_at
        if now >= handover.deadline and (handover.changed_at is None or settled):
            self.log.warning("the job has not saved in time: handing over now")
            return handover.requested_at
        if now >= handover.deadline + HANDOVER_SAVE_SLACK_SECONDS:
            # a dir that never holds still (a job logging into it): hand over within reconcile's limit
            self.log.warning("the checkpoint dir keeps changing: handing over now")
            return handover.requested_at
        return None

    def _checkpoint_dir_signature(self) -> tuple[tuple[str, int, int], ...]:
        """The job's own files in the checkpoint dir (names, sizes, mtimes), without the progress file
        (rewritten at every step, not a save). A scan that fails is no change."""
        assert self.checkpointer is not None
        try:
            files = scan_checkpoint_dir(self.checkpointer.dir, job_uid=self.checkpointer.job_uid)
        except OSError:
            return self._handover.signature if self._handover is not None else ()
        return tuple(sorted((f.path, f.size, f.mtime_ns) for path, f in files.items() if path != PROGRESS_FILE_NAME))

    def _migration_requested(self) -> datetime | None:
        """The attempt record's `migrate_requested_at` once a read finds it set. The record is read on
        its own thread every `migrate_poll_seconds` (the first read at once); a failed read is logged
        and the next one is due `migrate_poll_seconds` later."""
        read = self._migrate_read
        if read is not None:
            if not read.done():
                return None
            self._migrate_read = None
            try:
                record = read.result()
            except Exception as e:
                self.log.warning(
                    "could not read the attempt record for a migration request: trying again later",
                    extra={"error": f"{type(e).__name__}: {e}", "retry_in_seconds": self.settings.migrate_poll_seconds},
                )
                return None
            self._request_withdrawn = record.migrate_requested_at is None
            if record.migrate_requested_at is not None:
                return record.migrate_requested_at
        now = self.clock.monotonic()
        if self._migrate_read is None and now >= self._next_migrate_read:
            self._next_migrate_read = now + self.settings.migrate_poll_seconds
            self._migrate_read, _ = self._on_thread(
                "attempt-record", lambda: self.store.get_attempt(self.job_id, self.attempt)
            )
        return None
