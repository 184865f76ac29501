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

import math
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spotrelay.agent.ports import TransferCancelled
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
        number = float(value)
    except ValueError:
        return _duration(value, "seconds") * _HOUR
    if not math.isfinite(number):
        raise ValueError(f"seconds: {value!r} is not a finite number of seconds")
    return number


MAX_HOURS = 24.0 * 366  # a fault is at most a year into a scenario, and lasts at most a year
MAX_SECONDS = 86_400.0  # an answer waits at most a day
_WINDOW = frozenset({"for"})
# The fields each kind takes besides job, attempt, kind and at (anything else is a mistake in the scenario)
FIELDS: dict[FaultKind, frozenset[str]] = {
    FaultKind.AGENT_DIES: frozenset(),
    FaultKind.AGENT_RESTARTS: frozenset({"after"}),
    FaultKind.IMDS_SLOW: _WINDOW | {"seconds"},
    FaultKind.IMDS_ERROR: _WINDOW | {"status"},
    FaultKind.S3_FAIL: _WINDOW,
    FaultKind.S3_STALL: _WINDOW | {"seconds"},
    FaultKind.IGNORE_SIGTERM: frozenset(),
    FaultKind.JOB_CRASH: frozenset({"exit_code"}),
    FaultKind.JOB_HANG: frozenset(),
}


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    job: str
    attempt: int = Field(default=1, ge=1, le=10_000)
    kind: FaultKind
    at: float = Field(default=0.0, ge=0, le=MAX_HOURS, description="hours from the scenario's start")
    for_hours: float | None = Field(
        default=None, alias="for", gt=0, le=MAX_HOURS, description="how long a window fault lasts"
    )
    after: float | None = Field(
        default=None, ge=0, le=MAX_HOURS, description="agent-restarts: hours until the agent is back"
    )
    seconds: float | None = Field(
        default=None, ge=0, le=MAX_SECONDS, description="imds-slow / s3-stall: how long each answer waits"
    )
    status: int = Field(
        default=503, ge=500, le=599, description="imds-error: the HTTP status (5xx: a 404 would read as no notice)"
    )
    exit_code: int = Field(default=1, ge=1, le=255, description="job-crash: the exit code (0 would be success)")

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            kind = data.get("kind")
            if isinstance(kind, str) and kind in set(FaultKind):
                given = set(data) - {"job", "attempt", "kind", "at"}
                known = {"for", "after", "seconds", "status", "exit_code"}  # other keys: pydantic says "extra"
                stray = sorted((given & known) - FIELDS[FaultKind(kind)])
                if stray:
                    allowed = ", ".join(sorted(FIELDS[FaultKind(kind)])) or "none"
                    raise ValueError(f"{kind} takes no {', '.join(stray)} (its own fields: {allowed})")
            if isinstance(data.get("seconds"), bool):
                raise ValueError("seconds: a number of seconds or a duration, not true/false")
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
