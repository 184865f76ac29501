"""The instances of a replay (spotrelay.local.workers): what the agent did, as its worker records it.

`AgentEvent`s, the agent's log lines that say what it did (`_AGENT_LINES`, read by
`InstanceWorker.on_log`), the handler that takes those lines during a replay (`AgentLogbook`) and the
task-token port that counts the agent's heartbeats (`CountingTokens`). Siblings:
spotrelay.local.workers_clock (the instance's clock), spotrelay.local.workers (the instance worker, and
the overview).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotrelay.agent.logs import LOGGER_NAME
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.local.clock import VirtualClock

if TYPE_CHECKING:
    from spotrelay.local.workers import InstanceWorker


@dataclass(frozen=True)
class AgentEvent:
    at: datetime
    event: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"at": _iso(self.at), "event": self.event, **self.details}


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _error_of(record: logging.LogRecord) -> dict[str, Any]:
    """The exception a log line carries (`log.exception`), as its last line: type and message."""
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        return {"error": f"{type(error).__name__}: {error}"[:500]}
    return {}


def _pick(record: logging.LogRecord, *names: str) -> dict[str, Any]:
    return {name: getattr(record, name) for name in names if getattr(record, name, None) is not None}


# The agent's log lines that say what it did (message -> event and the fields it keeps)
_AGENT_LINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "checkpoint restored": ("restored", ("checkpoint", "files", "bytes", "work_done_hours")),
    "job started": ("job-started", ("resumed",)),
    "re-attached to the running job": ("reattached", ("stopping_for",)),
    "rebalance recommendation: checkpointing early": ("rebalance-seen", ("notice_time",)),
    "spot interruption notice: stopping the job and checkpointing": ("notice-seen", ("action_time", "grace_seconds")),
    "migration back to spot requested: stopping the job and checkpointing": ("migrate-seen", ("requested_at",)),
    "SIGTERM sent to the job": ("sigterm", ()),
    "the job did not exit within grace_seconds: SIGKILL": ("sigkill", ("grace_seconds",)),
    "the job has stopped": ("job-stopped", ("exit_code",)),
    "checkpoint failed; the next one will try again": ("checkpoint-failed", ("reason",)),
    "the final checkpoint failed": ("checkpoint-failed", ("reason",)),
    "checkpoint dropped": ("checkpoint-dropped", ("reason",)),
    "IMDS did not answer": ("imds-unanswered", ("error",)),
    "heartbeat failed": ("heartbeat-failed", ("error",)),
    "not starting the job": ("not-started", ("reason",)),
    "agent stopped; the job keeps running and the next agent re-attaches": ("agent-stopped", ()),
}


class AgentLogbook(logging.Handler):
    """Takes the agents' log lines during a replay (instead of stdout) and hands each to its worker,
    stamped with virtual time (the line is logged by a process holding the clock's baton)."""

    def __init__(self, clock: VirtualClock, workers: dict[tuple[str, int], InstanceWorker]) -> None:
        super().__init__(logging.INFO)
        self.clock = clock
        self.workers = workers  # by (job id, attempt): the replay's own map, read as lines come
        self._saved: tuple[list[logging.Handler], bool, int] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        worker = self.workers.get((str(getattr(record, "job_id", "")), int(getattr(record, "attempt", 0) or 0)))
        if worker is not None:
            worker.on_log(record, self.clock.now())

    def __enter__(self) -> AgentLogbook:
        logger = logging.getLogger(LOGGER_NAME)
        self._saved = (list(logger.handlers), logger.propagate, logger.level)
        logger.handlers[:] = [self]
        logger.propagate = False
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(LOGGER_NAME)
        assert self._saved is not None
        logger.handlers[:], logger.propagate, level = self._saved
        logger.setLevel(level)


class CountingTokens:
    """The agent's task-token port (the real Step Functions client), counting its heartbeats (its report
    on the token is its own log line, `reported`)."""

    def __init__(self, inner: StepFunctionsTaskTokens, worker: InstanceWorker) -> None:
        self.inner = inner
        self.worker = worker

    def heartbeat(self, task_token: str) -> bool:
        self.worker.heartbeats += 1
        self.worker.last_heartbeat = self.worker.host.now()
        self.worker.first_heartbeat = self.worker.first_heartbeat or self.worker.last_heartbeat
        return self.inner.heartbeat(task_token)

    def succeed(self, task_token: str, output: dict[str, Any]) -> bool:
        return self.inner.succeed(task_token, output)

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        return self.inner.fail(task_token, error, cause)


__all__ = ["AgentEvent", "AgentLogbook", "CountingTokens"]
