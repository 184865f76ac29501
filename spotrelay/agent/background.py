"""The agent's background checkpoints: periodic and rebalance checkpoints taken on a thread of the agent's
clock, and what a thread's work hands back.

Periodic and rebalance checkpoints run on a background thread, so the loop keeps polling IMDS while
a large upload is in flight; a notice cancels such an upload (what it finished stays reusable) and
the final checkpoint uploads only what is still missing.

One concern of the worker agent (`spotrelay.agent.agent`: its loop decides when a checkpoint is due and
collects its result every poll); its siblings are `heartbeat`, `handover` (whose attempt record reads
run on a thread too, through `_on_thread`), `output`, `startup` and `settings`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from spotrelay.agent.checkpointer import (
    CheckpointCancelled,
    Checkpointer,
    CheckpointResult,
    CheckpointTampered,
    CheckpointUnstable,
)
from spotrelay.agent.logs import JobLogger
from spotrelay.clock import ClockEvent, ClockThread, WaitingClock

_Result = TypeVar("_Result")


class BackgroundCheckpoints:
    """The background checkpoint of `spotrelay.agent.agent.Agent` (a mixin: `Agent.__init__` sets the
    attributes), and the clock threads its work runs on."""

    job_id: str
    attempt: int
    clock: WaitingClock
    log: JobLogger
    checkpointer: Checkpointer | None
    _in_flight: Future[CheckpointResult] | None
    _in_flight_thread: ClockThread | None
    _in_flight_cancel: ClockEvent
    _results: list[CheckpointResult]

    def _on_thread(self, name: str, work: Callable[[], _Result]) -> tuple[Future[_Result], ClockThread]:
        """Run `work` on a thread of the agent's clock; its result (or exception) in the future."""
        future: Future[_Result] = Future()

        def run() -> None:
            try:
                result = work()
            except Exception as e:
                future.set_exception(e)
            else:
                future.set_result(result)

        return future, self.clock.start_thread(f"{name} {self.job_id}/{self.attempt}", run)

    def _start_background(self, reason: str) -> None:
        assert self.checkpointer is not None
        self._in_flight_cancel = self.clock.event()
        cancel = self._in_flight_cancel
        checkpointer = self.checkpointer
        self.log.info("checkpoint started", extra={"reason": reason})
        self._in_flight, self._in_flight_thread = self._on_thread(
            "checkpoint", lambda: checkpointer.take(reason, cancel=cancel)
        )

    def _collect_background(self, wait: bool = False) -> bool:
        """Log the background checkpoint's result once it is done; True if one finished."""
        future = self._in_flight
        if future is None or (not wait and not future.done()):
            return False
        if wait and self._in_flight_thread is not None:
            self._in_flight_thread.join()  # on the clock: the upload's thread needs it to finish
        self._in_flight = None
        try:
            result = future.result()
        except CheckpointTampered as e:
            self.log.warning("checkpoint dropped", extra={"reason": str(e), "path": e.path, "what": e.why})
            return True
        except (CheckpointCancelled, CheckpointUnstable) as e:
            self.log.info("checkpoint dropped", extra={"reason": str(e)})
            return True
        except Exception:
            self.log.exception("checkpoint failed; the next one will try again")
            return True
        self._log_checkpoint(result)
        return True

    def _drop_background(self) -> None:
        """Cancel a periodic checkpoint in flight and wait for it to stop."""
        if self._in_flight is not None:
            self._in_flight_cancel.set()
            self._collect_background(wait=True)

    def _log_checkpoint(self, result: CheckpointResult) -> None:
        self._results.append(result)
        if result.skipped is not None:
            self.log.info("checkpoint skipped", extra={"reason": result.reason, "why": result.skipped})
            return
        self.log.info(
            "checkpoint committed" if result.committed else "checkpoint written but not committed: a newer one exists",
            extra={
                "reason": result.reason,
                "seq": result.seq,
                "files": result.files,
                "uploaded_files": len(result.uploaded),
                "uploaded_bytes": result.uploaded_bytes,
                "copied_files": len(result.copied),
                "reused_files": result.reused,
                "total_bytes": result.total_bytes,
                "work_done_hours": result.work_done_hours,
                "seconds": result.seconds,
            },
        )
