"""A replay scenario (`spotrelay replay SCENARIO.yaml`): the market, the jobs, the recorded events to
inject and what must come out.

```yaml
name: interruption-relaunch
region: us-east-1
start: 2026-11-30T00:00:00Z
seed: 7                      # optional (default 0; `--seed` overrides)
horizon: 24h                 # optional: stop the replay this long after start (default 48h)
stack:                       # optional: the stack's settings for this replay (CDK context names)
  max_concurrent_jobs: 8
  spot_vcpu_quotas: {g: 32}
  budget_usd_per_hour: 50
market: {...}                # spotrelay.market.spec: prices, outages, traces, price_history
jobs:
  - {at: 0m, spec: {file: ../jobs/resnet50.yaml}, work_hours: 4}
  - {at: 10m, name: burst, count: 50, priority: low, spec: {...inline job spec...}}
  - {at: 0m, name: broken, body: "{not json"}          # a raw queue message
events:                      # recorded AWS events, injected as they are, bound to a job's attempt
  - {at: 1h, file: ../recorded/spot-interruption-warning.json, instance: {job: resnet50, attempt: 1}}
  - {file: incident.jsonl}   # `spotrelay events export` output: times kept relative to its first event
outages_of_functions:        # the control plane down: every Lambda invocation in the window fails
  - {from: 30m, to: 60m}
operator:                    # what an operator runs afterwards, as the CLI runs it (the README's runbook)
  - {at: 70m, run: redrive-dlq}                        # spotrelay admin redrive
  - {at: 70m, run: replay-archive, from: 30m, to: 60m}  # spotrelay admin replay-archive
expect:
  - {job: resnet50, state: SUCCEEDED, min_attempts: 2}
  - {max_running_instances: 8}
```

Durations are "2h", "90m", "30s", "1h30m" or numbers of hours; `at` may also be a timestamp. Paths
are relative to the scenario's file. Errors name the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from spotrelay.field_problems import Loc, SpecFieldError, field_problems
from spotrelay.local.faults import MAX_HOURS, Fault
from spotrelay.market import MarketSpec, parse_duration
from spotrelay.models import JobSpecError, JobState, Market
from spotrelay.models.job_spec import DocumentLimits, decode_document, decode_json, read_document

DEFAULT_HORIZON_HOURS = 48.0


class ScenarioError(ValueError):
    """A scenario we cannot replay; the message names the file and the field."""


def _hours(value: object) -> float:
    return parse_duration(value)


Hours = Annotated[float, BeforeValidator(_hours)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StackSettings(_Spec):
    """The deployed stack's settings for this replay (the CDK context keys of the same names); the
    functions' environment variables are changed in moto, the template is not synthesized again."""

    max_concurrent_jobs: int | None = Field(default=None, ge=1)
    budget_usd_per_hour: float | None = Field(default=None, gt=0)
    spot_vcpu_quotas: dict[str, int] | None = None
    block_minutes: float | None = Field(default=None, gt=0)
    heartbeat_seconds: int | None = Field(default=None, ge=60)


class JobEntry(_Spec):
    at: Hours = 0.0
    spec: dict[str, Any] | None = Field(default=None, description="{file: job.yaml} or an inline job spec")
    body: str | None = Field(default=None, description="a raw queue message instead of a spec")
    name: str | None = Field(default=None, description="the job's name (default: the spec's)")
    work_hours: float | None = Field(default=None, gt=0)
    count: int = Field(default=1, ge=1, le=1000)
    priority: str | None = None

    @model_validator(mode="after")
    def _spec_or_body(self) -> Self:
        if (self.spec is None) == (self.body is None):
            raise ValueError("give spec ({file: ...} or inline) or body (a raw message), not both")
        if self.body is not None and self.count != 1:
            raise ValueError("a raw body is sent once (count: 1)")
        return self


class InstanceBinding(_Spec):
    job: str
    attempt: int = Field(default=1, ge=1)


class EventEntry(_Spec):
    at: Hours | None = Field(default=None, description="when (after start); default for .jsonl: as recorded")
    file: str
    instance: InstanceBinding | None = None


class Expectation(_Spec):
    job: str | None = Field(default=None, description="a job's name, or a job entry's name (all its copies)")
    state: JobState | None = None
    min_attempts: int | None = None
    max_attempts: int | None = None
    min_interruptions: int | None = None
    max_interruptions: int | None = None
    max_cost: float | None = None
    max_lost_work_hours: float | None = None
    last_pool: str | None = Field(default=None, description="instance_type:availability_zone of the last attempt")
    last_market: Market | None = None
    reason_contains: str | None = None
    in_dlq: bool | None = None
    max_wait: Hours | None = Field(default=None, description="from submission to the first launch")
    finished_within: Hours | None = Field(default=None, description="from submission to the end")
    max_running_instances: int | None = Field(default=None, description="scenario-wide: instances at once")
    max_notice_to_checkpoint_seconds: float | None = Field(
        default=None, gt=0, description="from a spot notice to the agent's committed final checkpoint, per attempt"
    )


_WITHIN = {"ge": 0, "le": MAX_HOURS}  # after start, within a year of it (as faults are)


class FunctionOutage(_Spec):
    """From `from` to `to` (after start) every invocation of every function fails before its handler runs,
    as the Lambda service fails it (spotrelay.local.outages)."""

    start: Annotated[Hours, Field(alias="from", **_WITHIN)]
    end: Annotated[Hours, Field(alias="to", **_WITHIN)]

    @model_validator(mode="after")
    def _a_window(self) -> Self:
        if self.end <= self.start:
            raise ValueError(f"to ({self.end:g} h) must come after from ({self.start:g} h)")
        return self


class OperatorAction(StrEnum):
    REDRIVE_DLQ = "redrive-dlq"  # spotrelay admin redrive: the functions' DLQs and the rule targets', invoked again
    REPLAY_ARCHIVE = "replay-archive"  # spotrelay admin replay-archive: StartReplay of the event archive


class OperatorStep(_Spec):
    """An operator's recovery step at `at`, calling what the CLI command calls (spotrelay.aws.recovery)."""

    at: Annotated[Hours, Field(**_WITHIN)]
    run: OperatorAction
    start: Annotated[Hours | None, Field(alias="from", **_WITHIN)] = None
    end: Annotated[Hours | None, Field(alias="to", **_WITHIN)] = None

    @model_validator(mode="after")
    def _window_for_a_replay(self) -> Self:
        window = self.start is not None or self.end is not None
        if self.run is OperatorAction.REDRIVE_DLQ and window:
            raise ValueError("redrive-dlq takes no from/to: it redrives every message in the DLQs")
        if self.run is OperatorAction.REPLAY_ARCHIVE:
            if self.start is None or self.end is None:
                raise ValueError("replay-archive needs from and to: the window of events to deliver again")
            if self.end <= self.start:
                raise ValueError(f"to ({self.end:g} h) must come after from ({self.start:g} h)")
            if self.end > self.at:
                raise ValueError(f"to ({self.end:g} h) is after the step itself (at {self.at:g} h): not archived yet")
        return self


def _events_list(value: object) -> object:
    return [value] if isinstance(value, Mapping) else value


class Scenario(_Spec):
    name: str
    region: str = "us-east-1"
    start: AwareDatetime
    seed: int = 0
    horizon: Hours = DEFAULT_HORIZON_HOURS
    schedule_minutes: float = Field(default=5, gt=0, description="the safety-net schedule's rate")
    stack: StackSettings = StackSettings()
    market: MarketSpec = MarketSpec()
    jobs: list[JobEntry] = []
    events: Annotated[list[EventEntry], BeforeValidator(_events_list)] = []
    faults: list[Fault] = Field(default=[], description="spotrelay.local.faults: agent, IMDS, S3 and job faults")
    outages_of_functions: list[FunctionOutage] = Field(
        default=[], max_length=100, description="windows when every Lambda invocation fails (the control plane down)"
    )
    operator: list[OperatorStep] = Field(
        default=[], max_length=100, description="recovery steps an operator runs: redrive-dlq, replay-archive"
    )
    expect: list[Expectation] = []
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _times_on_the_calendar(self) -> Self:
        """Every time the replay reckons from `start` is a date (`horizon: 1e300` is no OverflowError later)."""
        offsets: dict[Loc, float] = {("horizon",): self.horizon}
        offsets |= {("jobs", i, "at"): job.at for i, job in enumerate(self.jobs)}
        offsets |= {("events", i, "at"): event.at for i, event in enumerate(self.events) if event.at is not None}
        offsets |= {("outages_of_functions", i, "to"): outage.end for i, outage in enumerate(self.outages_of_functions)}
        offsets |= {("operator", i, "at"): step.at for i, step in enumerate(self.operator)}
        for field, hours in offsets.items():
            try:
                self.at(hours)
            except OverflowError:
                raise SpecFieldError(
                    field,
                    f"{hours:g} h after start ({self.start:%Y-%m-%d}) is past the last date a replay can reach "
                    "(9999-12-31)",
                ) from None
        return self

    def at(self, hours: float) -> datetime:
        return self.start + timedelta(hours=hours)


# -------------------------------------------------------------------------------------------- loading


def parse_scenario(data: Any, base_dir: Path, source: str = "scenario") -> Scenario:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: a scenario is a mapping (name, start, market, jobs, events, expect)")
    try:
        return Scenario.model_validate({**data, "base_dir": base_dir})
    except ValidationError as e:
        problems = field_problems(e, model=Scenario, show_input=True)
        raise ScenarioError(f"{source}: {'; '.join(problems)}") from None


# A scenario is a few KiB (events/scenarios/: 3 KiB at most); a market's inline price rows are a few nodes
# each. Bounded as a job spec is (spotrelay.models.job_spec), far above any real scenario: a longer market
# belongs in a price or trace file.
SCENARIO_LIMITS = DocumentLimits(max_bytes=2 * 1024 * 1024, max_depth=32, max_nodes=50_000, what="a scenario")
# An events file (`spotrelay events export`'s .jsonl) is about 1 KiB an event. Each event (a line, or the .json
# file) is decoded within these limits, as a queue message is (decode_json: depth, nodes, digits)
EVENTS_FILE_LIMITS = replace(SCENARIO_LIMITS, max_bytes=64 * 1024 * 1024, what="recorded events (JSON)")


def load_scenario(path: str | Path) -> Scenario:
    file = Path(path)
    try:
        data = decode_document(read_document(file, SCENARIO_LIMITS), str(file), SCENARIO_LIMITS)
    except JobSpecError as e:  # the file's reading and decoding, not a job spec's
        raise ScenarioError(str(e)) from None
    return parse_scenario(data, file.resolve().parent, str(file))


# ------------------------------------------------------------------------------------------ messages


class Submission(BaseModel):
    """One message the replay sends to the job queue."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    entry: str  # the job entry's name (shared by its copies)
    name: str  # this job's name
    body: str


def _load_spec(entry: JobEntry, base_dir: Path, where: str) -> dict[str, Any]:
    spec = dict(entry.spec or {})
    if set(spec) == {"file"}:
        file = base_dir / str(spec["file"])
        try:
            loaded = decode_document(read_document(file), str(file))  # a job file, bounded as `submit` reads one
        except JobSpecError as e:
            raise ScenarioError(f"{where}.spec.file: {e}") from None
        if not isinstance(loaded, dict):
            raise ScenarioError(f"{where}.spec.file: {file} is not a job spec (a mapping)")
        spec = loaded
    return spec


def submissions(scenario: Scenario) -> list[Submission]:
    """The queue messages of the scenario's jobs, in time order (then the order given)."""
    out: list[Submission] = []
    for i, entry in enumerate(scenario.jobs):
        when = scenario.at(entry.at)
        if entry.body is not None:
            out.append(
                Submission(at=when, entry=entry.name or "invalid", name=entry.name or "invalid", body=entry.body)
            )
            continue
        spec = _load_spec(entry, scenario.base_dir, f"jobs[{i}]")
        base_name = entry.name or str(spec.get("name", f"job{i + 1}"))
        for copy in range(entry.count):
            name = base_name if entry.count == 1 else f"{base_name}-{copy + 1:02d}"
            body = {**spec, "name": name}
            if entry.work_hours is not None:
                body["work_hours"] = entry.work_hours
            if entry.priority is not None:
                body["priority"] = entry.priority
            try:
                text = json.dumps(body, sort_keys=True)
            except (TypeError, ValueError) as e:  # a YAML date, set or binary value; keys of mixed types
                raise ScenarioError(
                    f"jobs[{i}].spec: cannot be sent as a queue message ({e}): a message is JSON, its keys text; "
                    "quote dates, and give lists, not sets"
                ) from None
            out.append(Submission(at=when, entry=base_name, name=name, body=text))
    return sorted(out, key=lambda s: s.at)


# ------------------------------------------------------------------------------------------- events


class Injection(BaseModel):
    """One recorded event to inject, and the job attempt whose instance it is about."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    event: dict[str, Any]
    job: str | None
    attempt: int | None
    source: str


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# What every EventBridge event has, and what the replay routes and reads an event by
# (https://docs.aws.amazon.com/eventbridge/latest/ref/overiew-event-structure.html)
EVENT_KEYS = ("source", "detail-type", "detail")


def _check_event(event: object, where: str) -> None:
    if not isinstance(event, dict):
        raise ScenarioError(f"{where} is not an event (a JSON object)")
    missing = [key for key in EVENT_KEYS if key not in event]
    if missing or not isinstance(event.get("detail"), dict):
        raise ScenarioError(
            f"{where} is not an EventBridge event: it has no {', '.join(missing) or 'detail object'} "
            f"(an event has {', '.join(EVENT_KEYS)}, as AWS sends it: see events/)"
        )


def _decode_event(text: str, source: str, field: str) -> dict[str, Any]:
    """One recorded event, decoded within EVENTS_FILE_LIMITS; a ScenarioError naming `field` and `source` if
    it is not JSON, or not an EventBridge event."""
    try:
        event = decode_json(text, source, EVENTS_FILE_LIMITS)
    except JobSpecError as e:
        raise ScenarioError(f"{field}: {e}") from None
    _check_event(event, f"{field}: {source}")
    return dict(event)


def injections(scenario: Scenario) -> list[Injection]:
    """The scenario's events, each with its injection time, in time order (then the order given).

    A `.json` file is one event, injected at `at`. A `.jsonl` file (`spotrelay events export`) is many:
    each keeps its recorded offset from the file's first event (plus `at`), and is bound to the
    attempt its `spotrelay` annotation names ({"job": name, "attempt": n}) unless `instance` says."""
    out: list[Injection] = []
    for i, entry in enumerate(scenario.events):
        file = scenario.base_dir / entry.file
        try:
            text = read_document(file, EVENTS_FILE_LIMITS)
        except JobSpecError as e:
            raise ScenarioError(f"events[{i}].file: {e}") from None
        offset = scenario.at(entry.at or 0.0)
        if file.suffix == ".jsonl":
            events = []
            for n, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                events.append(_decode_event(line, f"{file}:{n}", f"events[{i}].file"))
            times = [t for e in events if (t := _parse_time(e.get("time"))) is not None]
            first = min(times) if times else None
            for n, event in enumerate(events, start=1):
                recorded = _parse_time(event.get("time"))
                try:
                    when = offset + (recorded - first if recorded is not None and first is not None else timedelta(0))
                except OverflowError:
                    raise ScenarioError(
                        f"events[{i}].file: {file}:{n}: time {event['time']} is too far from the file's first event "
                        f"({first}): the replay's clock cannot reach it"
                    ) from None
                note = event.pop("spotrelay", None) or {}
                if not isinstance(note, dict):
                    raise ScenarioError(
                        f"events[{i}].file: {file}:{n}: spotrelay: the annotation is {{job: name, attempt: n}} "
                        f"(as `spotrelay events export` writes it), not {type(note).__name__}"
                    )
                binding = entry.instance
                job = binding.job if binding else note.get("job")
                attempt = binding.attempt if binding else note.get("attempt")
                out.append(
                    Injection(
                        at=when,
                        event=event,
                        job=job if isinstance(job, str) else None,
                        attempt=attempt if isinstance(attempt, int) else None,
                        source=f"{entry.file}:{n}",
                    )
                )
        else:
            event = _decode_event(text, str(file), f"events[{i}].file")
            out.append(
                Injection(
                    at=offset,
                    event=event,
                    job=entry.instance.job if entry.instance else None,
                    attempt=entry.instance.attempt if entry.instance else None,
                    source=entry.file,
                )
            )
    return sorted(out, key=lambda x: x.at)
