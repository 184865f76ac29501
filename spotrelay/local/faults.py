"""Faults a scenario injects into one attempt's instance: its agent, its IMDS, its S3, its job.

```yaml
faults:
  - {job: resnet50, attempt: 1, at: 40m, kind: agent-dies}                  # no word: the heartbeat times out
  - {job: resnet50, attempt: 1, at: 40m, kind: agent-restarts, after: 30s}  # re-attaches (its state file)
  - {job: resnet50, attempt: 1, at: 40m, kind: imds-slow, seconds: 3, for: 10m}   # answers late
  - {job: resnet50, attempt: 1, at: 40m, kind: imds-error, status: 503, for: 10m}
  - {job: resnet50, attempt: 1, at: 40m, kind: s3-fail, for: 10m}           # uploads fail
  - {job: resnet50, attempt: 1, at: 40m, kind: s3-stall, seconds: 300, for: 10m}  # an upload hangs that long
  - {job: resnet50, attempt: 1, kind: ignore-sigterm}                        # the job: only SIGKILL stops it
  - {job: resnet50, attempt: 1, at: 40m, kind: job-crash, exit_code: 3}
  - {job: resnet50, attempt: 1, at: 40m, kind: job-hang}
```

`at` is from the scenario's start (as events are; default: from the start, i.e. always); `for`, `after`
and `seconds` are durations. A fault applies to the instance of that attempt of that job (default
attempt 1) once it runs. The agent and the job are the real agent and the simulated job
(spotrelay.local.sim_job); what a fault changes is only what it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotrelay.agent.checkpoints import TransferCancelled
from spotrelay.clock import ClockEvent, WaitingClock
from spotrelay.market import parse_duration

_HOUR = 3600.0


class FaultKind(StrEnum):
    AGENT_DIES = "agent-dies"
    AGENT_RESTARTS = "agent-restarts"
    IMDS_SLOW = "imds-slow"
    IMDS_ERROR = "imds-error"
    S3_FAIL = "s3-fail"
    S3_STALL = "s3-stall"
    IGNORE_SIGTERM = "ignore-sigterm"
    JOB_CRASH = "job-crash"
    JOB_HANG = "job-hang"


def _duration(value: object, field: str) -> float:
    return parse_duration(value, field)


def _seconds(value: str) -> float:
    """`seconds` given as text: a number of seconds ("3"), or a duration ("30s", "5m")."""
    try:
        return float(value)
    except ValueError:
        return _duration(value, "seconds") * _HOUR


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    job: str
    attempt: int = Field(default=1, ge=1)
    kind: FaultKind
    at: float = Field(default=0.0, description="hours from the scenario's start")
    for_hours: float | None = Field(default=None, alias="for", description="how long a window fault lasts")
    after: float | None = Field(default=None, description="agent-restarts: hours until the agent is back")
    seconds: float | None = Field(default=None, ge=0, description="imds-slow / s3-stall: how long each answer waits")
    status: int = Field(default=503, ge=400, le=599, description="imds-error: the HTTP status")
    exit_code: int = Field(default=1, description="job-crash: the exit code")

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("at", "for", "after"):
                if key in data and data[key] is not None:
                    data[key] = _duration(data[key], key)
            if "seconds" in data and isinstance(data["seconds"], str):
                data["seconds"] = _seconds(data["seconds"])
        return data

    @model_validator(mode="after")
    def _needs(self) -> Fault:
        if self.kind in {FaultKind.IMDS_SLOW, FaultKind.S3_STALL} and self.seconds is None:
            raise ValueError(f"{self.kind} needs seconds: how long each answer waits")
        if self.kind is FaultKind.AGENT_RESTARTS and self.after is None:
            raise ValueError("agent-restarts needs after: how long until the agent is back")
        return self

    def window(self, start_monotonic: float) -> tuple[float, float]:
        """[from, to) on the clock's monotonic() seconds, given the scenario start's."""
        begin = start_monotonic + self.at * _HOUR
        end = begin + self.for_hours * _HOUR if self.for_hours is not None else float("inf")
        return begin, end


class S3Unavailable(Exception):
    """A simulated S3 failure (s3-fail)."""


class FaultyStorage:
    """The agent's checkpoint storage with the s3-fail and s3-stall windows of its instance applied to
    uploads and copies (restores and manifests go through)."""

    def __init__(
        self, inner: Any, clock: WaitingClock, windows: Sequence[tuple[FaultKind, float, float, float]]
    ) -> None:
        self.inner = inner
        self.clock = clock
        self.windows = list(windows)  # (kind, from, to, seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _apply(self, cancel: ClockEvent | None) -> None:
        now = self.clock.monotonic()
        for kind, begin, end, seconds in self.windows:
            if not begin <= now < end:
                continue
            if kind is FaultKind.S3_FAIL:
                raise S3Unavailable("simulated S3 failure: the upload did not go through")
            if kind is FaultKind.S3_STALL:
                waiter = cancel if cancel is not None else self.clock.event()
                if waiter.wait(seconds):
                    raise TransferCancelled([])

    def upload(self, items: Sequence[tuple[Path, str]], cancel: Any = None) -> list[str]:
        if items:
            self._apply(cancel)
        result: list[str] = self.inner.upload(items, cancel)
        return result

    def copy(self, items: Sequence[tuple[str, str]], cancel: Any = None) -> list[str]:
        if items:
            self._apply(cancel)
        result: list[str] = self.inner.copy(items, cancel)
        return result
