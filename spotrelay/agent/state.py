"""The agent's state file: what a restarted agent needs so it never runs the job twice.

`<state dir>/<job_id>-<attempt>.json` (default state dir `/var/lib/spotrelay`, systemd's
`StateDirectory=spotrelay`), rewritten atomically (temporary file, fsync, rename) at every step:

- `process`: the job's supervisor (pid, kernel start time, exit file, log file) once started. A
  restarted agent that finds it re-attaches: it watches that pid and exit file instead of starting
  the job again. Written right after the start; a crash between the start and this write is the one
  window where a restart would start a second copy, and it is milliseconds wide.
- `checkpoints` (`next_seq`, `files`, `last_manifest`, `work_done_hours`): the checkpoint sequence (a sequence
  number is reserved before its upload starts, so a restarted agent never reuses one) and the index
  that makes the next checkpoint incremental.
- `notice`: the interruption notice, or the control plane's migration request (`reason: migrate`),
  once seen: a restarted agent goes on with the stop and the final checkpoint, never the job.
- `rebalance_handled`: the `noticeTime` of the last rebalance recommendation acted on.
- `outcome`: what was reported on the task token. An agent that finds an outcome does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from spotrelay.agent.checkpointer import CheckpointerState
from spotrelay.agent.runner import JobProcess

DEFAULT_STATE_DIR = Path("/var/lib/spotrelay")

OutcomeKind = Literal["succeeded", "failed", "interrupted", "migrated", "corrupt", "vanished", "stale"]
NoticeReason = Literal["spot", "migrate"]


class NoticeRecord(BaseModel):
    """Why the job is being stopped: a spot interruption notice (IMDS `spot/instance-action`), or the
    control plane's request to move the job back to spot (the attempt record's `migrate_requested_at`)."""

    model_config = ConfigDict(frozen=True)

    action: str  # the instance action (terminate, stop, hibernate); "migrate" for a migration request
    time: str  # the instance action's time; for a migration, when the control plane asked for it
    seen_at: AwareDatetime  # when the agent saw it: the grace period counts from here
    reason: NoticeReason = "spot"


class Outcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: OutcomeKind
    exit_code: int | None = None
    error: str | None = None  # the task failure's error name, None for success
    cause: dict[str, Any] = Field(default_factory=dict)
    token_accepted: bool = False  # False: the token was closed already (the control plane moved on)
    reported_at: AwareDatetime


class AgentState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    job_id: str
    attempt: int
    process: JobProcess | None = None
    resumed: bool = False
    checkpoints: CheckpointerState = Field(default_factory=CheckpointerState)
    notice: NoticeRecord | None = None
    rebalance_handled: str | None = None
    outcome: Outcome | None = None
    # Bytes of the job's output file forwarded to the log, as an agent that was stopped left it: the
    # restarted agent goes on from there (after a crash it starts from the end, to never repeat lines).
    output_forwarded: int | None = None


class StateFile:
    def __init__(self, state_dir: Path, job_id: str, attempt: int) -> None:
        self.path = state_dir / f"{job_id}-{attempt}.json"

    def load(self) -> AgentState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return AgentState.model_validate_json(text)

    def save(self, state: AgentState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        with tmp.open("w") as f:
            f.write(state.model_dump_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def job_files(self) -> tuple[Path, Path]:
        """(exit file, log file) of the job, next to the state file."""
        stem = self.path.name.removesuffix(".json")
        return self.path.with_name(f"{stem}.exit"), self.path.with_name(f"{stem}.log")
