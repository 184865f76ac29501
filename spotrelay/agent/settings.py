"""The worker agent's settings and results: `AgentSettings` (how often it polls, heartbeats, scans and
reads, how long it waits, and where the job's files are), `AgentResult` (what `Agent.run` returns) and
the two exceptions that end a run early (`AgentError`, `AgentStopped`).

One concern of the worker agent (`spotrelay.agent.agent`, which takes these settings and returns these
results); its siblings are `heartbeat`, `handover`, `background`, `output` and `startup`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.agent.checkpoint_contents import DEFAULT_REFRESH_AFTER
from spotrelay.agent.checkpointer import CheckpointResult
from spotrelay.agent.runner import JobUser
from spotrelay.agent.state import DEFAULT_STATE_DIR, Outcome

# How long a standby attempt's agent waits to be handed the job (its task token); the control plane gives
# up on a standby (terminates it and closes its attempt) 30 minutes after the instance is running.
STANDBY_WAIT_SECONDS = 1800.0


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    state_dir: Path = DEFAULT_STATE_DIR
    poll_seconds: float = Field(default=5.0, gt=0)
    heartbeat_seconds: float | None = Field(
        default=None,
        gt=0,
        description="how often the task token is heartbeaten; None: paced by the Run task's heartbeat timeout "
        "that Launch records with the attempt (HEARTBEATS_PER_TIMEOUT beats within it)",
    )
    handover_scan_seconds: float = Field(
        default=10.0, gt=0, description="how often the checkpoint dir is scanned for a save (deferred handover)"
    )
    handover_quiet_seconds: float = Field(
        default=15.0, ge=0, description="how long the checkpoint dir must stay unchanged after a save"
    )
    migrate_poll_seconds: float = Field(
        default=60.0, gt=0, description="how often the attempt record is read for a migration request"
    )
    previous_checkpoint_wait_seconds: float = Field(default=150.0, ge=0)
    attempt_record_wait_seconds: float = Field(default=300.0, ge=0)
    standby_wait_seconds: float = Field(
        default=STANDBY_WAIT_SECONDS,
        ge=0,
        description="how long a standby attempt waits for its job to be handed over, from its first read",
    )
    checkpoint_dir: Path | None = Field(default=None, description="instead of the spec's checkpoint.dir")
    refresh_after: timedelta | None = DEFAULT_REFRESH_AFTER
    log_tail_lines: int = Field(default=20, ge=0)
    kill_wait_seconds: float = Field(default=10.0, gt=0)
    job_user: JobUser | None = Field(default=None, description="who the job runs as (None: as the agent)")


class AgentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: Outcome | None  # None: the agent was stopped and left the job running (re-attach later)
    already_reported: bool = False
    reattached: bool = False
    restored: tuple[int, int] | None = None  # (attempt, seq) of the checkpoint restored
    checkpoints: tuple[CheckpointResult, ...] = ()


class AgentError(Exception):
    """The agent cannot go on (no attempt record, no task token): exit non-zero, systemd retries."""


class AgentStopped(Exception):
    """`Agent.stop()` was called: leave the job running, keep the state file, return."""
