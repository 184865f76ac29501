"""What must hold after every step of every replay, whatever its scenario (the replay's `invariants`).

    monitor = InvariantMonitor(reconcile_period=timedelta(minutes=5))
    monitor.check(peek(runtime, stack), now, agents=workers)       # after a step: moto's backends, read directly
    monitor.check(read(runtime, stack), now, agents=workers, finished=True)   # at the end: through the API
    monitor.violations                                               # each broken invariant once, when first seen

The checks are one pure function, `check_invariants(Snapshot) -> [Violation]`, of what the table, EC2 and
Step Functions hold at one instant, plus what the replay has seen so far (the checkpoints committed, the
checkpoint each agent resumed from, the terminal state each job first reached):

- outcome: every job reaches one terminal state and keeps it (FAILED and CANCELLED with a
  `failure_reason`), or is visibly progressing: not terminal and its execution RUNNING (a QUEUED job
  waits for admission, without one); at the end of a replay that finished, every job is terminal;
- instances: no managed instance (`TAG_MANAGED`) pending or running without a live attempt naming it,
  nor for an ended job, for longer than one reconcile period plus reconcile's own grace for a fresh
  instance (`ORPHAN_GRACE_SECONDS`): the safety net must have terminated it by then;
- resume: an agent starts the job from the newest checkpoint committed before it (an attempt record's
  `work_done_hours_at_start` is no less than the newest committed before the attempt started);
- one runner: at most one live attempt per job that is not a standby (a make-before-break standby,
  `Attempt.is_standby`, runs beside the attempt it replaces);
- readable: every job, attempt, checkpoint pointer and blocked-pool record reads back with this
  version's models;
- billing: every managed instance pending or running is named by exactly one attempt record, and no two
  attempt records name the same instance; every settled bill (`Attempt.cost_usd`) is the price in effect:
  the scenario's spot prices integrated from the attempt's launch to its `billed_until`, as EC2 would
  bill it (spotrelay.models.billing); and no instance still pending or running has had its bill ended.

`peek` reads moto's in-process backends (asking moto's API for a Scan, a DescribeInstances and a
ListExecutions after every step would take longer than most replay steps); `read` asks the same of the API, and
the replay uses it for its last check. Both read the same state (tests/local/test_invariants.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ValidationError

from spotrelay.config import ORPHAN_GRACE_SECONDS, SCHEDULE_MINUTES, TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED
from spotrelay.control.ports import CheckpointPointer
from spotrelay.field_problems import field_problems
from spotrelay.models import Attempt, Job, JobState, Market
from spotrelay.models.billing import billed_usd
from spotrelay.policy import BlockedPool

if TYPE_CHECKING:
    from spotrelay.local.deploy import LocalStack
    from spotrelay.local.runtime import LocalRuntime
    from spotrelay.market import SpotMarket

RUNNING_STATES = frozenset({"pending", "running"})  # an instance that is billed (and could run a job)
WORK_EPSILON = 1e-9  # reference-GPU hours: floats that round-trip through JSON exactly, compared with slack


# ------------------------------------------------------------------------------------------ the snapshot


@dataclass(frozen=True)
class InstanceView:
    """A managed instance as EC2 describes it."""

    instance_id: str
    state: str
    launched_at: datetime
    job_id: str | None = None  # its tags
    attempt: int | None = None


@dataclass(frozen=True)
class UnreadableRecord:
    pk: str
    sk: str
    error: str


@dataclass(frozen=True)
class CommittedCheckpoint:
    job_id: str
    attempt: int
    seq: int
    work_done_hours: float | None
    at: datetime

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempt, self.seq)


@dataclass(frozen=True)
class JobStart:
    """An agent started the job: resuming from `restored` (attempt, seq), or from nothing."""

    job_id: str
    attempt: int
    at: datetime
    restored: tuple[int, int] | None


@dataclass(frozen=True)
class Observed:
    """What moto holds at one instant: the table's records, the managed instances, the executions."""

    jobs: Mapping[str, Job]
    attempts: Mapping[str, Sequence[Attempt]]  # by job id, in attempt order
    pointers: Mapping[str, CheckpointPointer]  # by job id
    instances: Sequence[InstanceView]  # pending or running
    executions: Mapping[str, str]  # execution name (`Job.execution_name`) -> status
    unreadable: Sequence[UnreadableRecord] = ()


@dataclass(frozen=True)
class Snapshot:
    """What the checks look at: the state now and what the replay has seen so far."""

    now: datetime
    jobs: Mapping[str, Job]
    attempts: Mapping[str, Sequence[Attempt]]
    instances: Sequence[InstanceView] = ()
    executions: Mapping[str, str] = field(default_factory=dict)
    unreadable: Sequence[UnreadableRecord] = ()
    commits: Sequence[CommittedCheckpoint] = ()  # every checkpoint committed so far
    starts: Sequence[JobStart] = ()  # every start of the job by an agent so far
    # the terminal state each job reached, with the run it ended (`spotrelay resume` starts a new run)
    first_terminal: Mapping[str, tuple[int, JobState]] = field(default_factory=dict)
    finished: bool = False  # the end of a replay in which every job ended
    final: bool = False  # the end of the replay, every job ended or not
    submitted: Mapping[str, datetime] = field(default_factory=dict)  # job id -> when SQS accepted its message
    reconcile_period: timedelta = timedelta(minutes=SCHEDULE_MINUTES)
    orphan_grace: timedelta = timedelta(seconds=ORPHAN_GRACE_SECONDS)
    market: SpotMarket | None = None  # the scenario's: the prices a bill is checked against (None: not checked)


@dataclass(frozen=True)
class Violation:
    kind: str
    job_id: str | None
    detail: str
    at: datetime  # the snapshot that showed it
    instance_id: str | None = None
    attempt: int | None = None
    subject: str = ""  # what else tells two violations of a kind apart (a record's keys, a start's time)

    @property
    def key(self) -> tuple[str, str | None, str | None, int | None, str]:
        """One broken invariant, whatever step shows it again."""
        return (self.kind, self.job_id, self.instance_id, self.attempt, self.subject)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "job_id": self.job_id,
            "instance_id": self.instance_id,
            "attempt": self.attempt,
            "detail": self.detail,
            "at": _iso(self.at),
        }


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------------ the checks


def check_invariants(snapshot: Snapshot) -> list[Violation]:
    return [
        *check_outcomes(snapshot),
        *check_instances(snapshot),
        *check_resumes(snapshot),
        *check_one_runner(snapshot),
        *check_readable(snapshot),
        *check_bills(snapshot),
    ]


def check_outcomes(s: Snapshot) -> list[Violation]:
    found: list[Violation] = []
    if s.final:  # an accepted message is a job: admitted, or FAILED with its reason, never lost
        for job_id, at in sorted(s.submitted.items()):
            if job_id not in s.jobs:
                found.append(
                    Violation("never-recorded", job_id, f"submitted at {_iso(at)}, no record at the end", s.now)
                )
    for job_id, job in sorted(s.jobs.items()):
        first = s.first_terminal.get(job_id)
        if first is not None and (job.run < first[0] or (job.run == first[0] and job.state is not first[1])):
            ended = f"run {first[0]} ended {first[1]}, now run {job.run} {job.state}"
            found.append(Violation("terminal-state-changed", job_id, ended, s.now))
        if job.state.is_terminal:
            if job.state is not JobState.SUCCEEDED and not job.failure_reason:
                found.append(Violation("no-failure-reason", job_id, f"{job.state} without a failure_reason", s.now))
        elif s.finished:
            found.append(Violation("unfinished", job_id, f"{job.state} at the end of the replay", s.now))
        elif job.state is not JobState.QUEUED and (status := s.executions.get(job.execution_name)) != "RUNNING":
            found.append(
                Violation("not-progressing", job_id, f"{job.state}, its execution {status or 'missing'}", s.now)
            )
    return found


def check_instances(s: Snapshot) -> list[Violation]:
    named: dict[str, list[Attempt]] = {}
    for attempts in s.attempts.values():
        for record in attempts:
            if record.instance_id is not None:
                named.setdefault(record.instance_id, []).append(record)
    found: list[Violation] = []
    for instance_id, owners in sorted(named.items()):
        if len(owners) > 1:
            which = ", ".join(f"{a.job_id} attempt {a.attempt}" for a in owners)
            found.append(
                Violation("billed-twice", owners[0].job_id, f"{instance_id} is named by {which}", s.now, instance_id)
            )
    limit = s.reconcile_period + s.orphan_grace
    for instance in s.instances:
        if instance.state not in RUNNING_STATES:
            continue
        owners = named.get(instance.instance_id, [])
        job_id = owners[0].job_id if owners else instance.job_id
        attempt = owners[0].attempt if owners else instance.attempt
        tagged = s.jobs.get(instance.job_id) if instance.job_id is not None else None
        # Launch records its attempt a moment after RunInstances returns, and again when a throttled or
        # crashed Launch is retried (the same client token: the same instance): an instance its tags give to
        # a live job is that job's for reconcile's grace (ORPHAN_GRACE_SECONDS), as reconcile itself holds
        being_recorded = (
            tagged is not None and not tagged.state.is_terminal and s.now - instance.launched_at <= s.orphan_grace
        )
        if not owners and not being_recorded:
            found.append(
                Violation(
                    "unattributed-instance",
                    job_id,
                    f"{instance.instance_id} ({instance.state}, launched {_iso(instance.launched_at)}) is named "
                    "by no attempt record: its hours are billed to no job",
                    s.now,
                    instance.instance_id,
                )
            )
        job = s.jobs.get(job_id) if job_id is not None else None
        live = [a for a in owners if a.outcome is None]
        ended_job = job is not None and job.state.is_terminal
        if live and not ended_job:
            continue
        # orphaned since its launch, the end of its last attempt, or (its attempt left open) its job's end
        since = max([instance.launched_at, *(a.ended_at for a in owners if a.ended_at is not None)])
        if live and job is not None and job.ended_at is not None:
            since = max(since, job.ended_at)
        if s.now - since <= limit:
            continue
        minutes = (s.now - since).total_seconds() / 60
        if ended_job and job is not None:
            kind, why = "instance-of-ended-job", f"runs {minutes:.0f} min after its job ended {job.state}"
        else:
            kind, why = "orphan-instance", f"runs {minutes:.0f} min without a live attempt"
        found.append(
            Violation(
                kind,
                job_id,
                f"{instance.instance_id} ({instance.state}) {why} (allowed: {limit.total_seconds() / 60:g} min)",
                s.now,
                instance.instance_id,
                attempt,
            )
        )
    return found


def _newest_before(commits: Sequence[CommittedCheckpoint], when: datetime) -> CommittedCheckpoint | None:
    before = [c for c in commits if c.at < when]
    return max(before, key=lambda c: c.order) if before else None


def _order(order: tuple[int, int] | None) -> str:
    return f"{order[0]}-{order[1]}" if order is not None else "none"


def check_resumes(s: Snapshot) -> list[Violation]:
    by_job: dict[str, list[CommittedCheckpoint]] = {}
    for commit in s.commits:
        by_job.setdefault(commit.job_id, []).append(commit)
    found: list[Violation] = []
    for start in s.starts:
        newest = _newest_before(by_job.get(start.job_id, []), start.at)
        if newest is not None and (start.restored is None or start.restored < newest.order):
            found.append(
                Violation(
                    "stale-resume",
                    start.job_id,
                    f"attempt {start.attempt} started the job at {_iso(start.at)} from checkpoint "
                    f"{_order(start.restored)}; {_order(newest.order)} was committed at {_iso(newest.at)}",
                    s.now,
                    attempt=start.attempt,
                    subject=_iso(start.at),
                )
            )
    for job_id, attempts in sorted(s.attempts.items()):
        for attempt in attempts:
            newest = _newest_before(by_job.get(job_id, []), attempt.started_at)
            if newest is None or newest.work_done_hours is None:
                continue
            if attempt.work_done_hours_at_start + WORK_EPSILON < newest.work_done_hours:
                found.append(
                    Violation(
                        "stale-start-record",
                        job_id,
                        f"attempt {attempt.attempt} (started {_iso(attempt.started_at)}) records "
                        f"{attempt.work_done_hours_at_start:.4f} h done at its start; checkpoint "
                        f"{_order(newest.order)} held {newest.work_done_hours:.4f} h",
                        s.now,
                        attempt.instance_id,
                        attempt.attempt,
                    )
                )
    return found


def check_one_runner(s: Snapshot) -> list[Violation]:
    found: list[Violation] = []
    for job_id, attempts in sorted(s.attempts.items()):
        running = [a for a in attempts if a.outcome is None and not a.is_standby]
        if len(running) > 1:
            which = ", ".join(f"attempt {a.attempt} on {a.instance_id or 'no instance'}" for a in running)
            last = running[-1]
            found.append(
                Violation("runs-twice", job_id, f"live at once: {which}", s.now, last.instance_id, last.attempt)
            )
    return found


# A settled bill against the scenario's prices: DescribeSpotPriceHistory gives prices to 6 decimals and
# times to the second (spotrelay.local.ec2_market)
BILL_TOLERANCE_USD = 1e-4


def scenario_bill(market: SpotMarket, attempt: Attempt) -> float | None:
    """What EC2 bills `attempt`'s spot instance from its launch to its `billed_until` at the scenario's prices
    (the launch price where the market has none). None if its bill is not ended, or it is not spot."""
    end = attempt.billed_until
    if end is None or attempt.pool.market is not Market.SPOT:
        return None
    changes = market.price_changes(attempt.pool, market.to_hours(attempt.started_at), market.to_hours(end))
    return billed_usd(
        attempt.hourly_price, [(market.to_datetime(t), usd) for t, usd in changes], attempt.started_at, end
    )


def check_bills(s: Snapshot) -> list[Violation]:
    states = {i.instance_id: i.state for i in s.instances}
    found: list[Violation] = []
    for job_id, attempts in sorted(s.attempts.items()):
        for a in attempts:
            state = states.get(a.instance_id or "")
            if a.billed_until is not None and state in RUNNING_STATES:
                found.append(
                    Violation(
                        "bill-ended-early",
                        job_id,
                        f"{a.instance_id} ({state}) is billed to attempt {a.attempt} only until {_iso(a.billed_until)}",
                        s.now,
                        a.instance_id,
                        a.attempt,
                    )
                )
            expected = scenario_bill(s.market, a) if s.market is not None and a.cost_usd is not None else None
            if expected is not None and a.cost_usd is not None and abs(a.cost_usd - expected) > BILL_TOLERANCE_USD:
                found.append(
                    Violation(
                        "billed-off-price",
                        job_id,
                        f"attempt {a.attempt} on {a.pool.offering} is billed ${a.cost_usd:.4f} from "
                        f"{_iso(a.started_at)} to {_iso(a.billed_until or s.now)}; at the prices in effect "
                        f"it is ${expected:.4f}",
                        s.now,
                        a.instance_id,
                        a.attempt,
                    )
                )
    return found


def check_readable(s: Snapshot) -> list[Violation]:
    return [
        Violation(
            "unreadable-record",
            r.pk.removeprefix("JOB#") if r.pk.startswith("JOB#") else None,
            f"{r.pk} {r.sk}: {r.error}",
            s.now,
            subject=f"{r.pk} {r.sk}",
        )
        for r in s.unreadable
    ]


# ------------------------------------------------------------------------------------------ reading moto


_MODELS: dict[str, type[BaseModel]] = {
    "JOB": Job,
    "ATTEMPT": Attempt,
    "CHECKPOINT": CheckpointPointer,
    "BLOCK": BlockedPool,
}


def _model_of(sk: str) -> type[BaseModel] | None:
    return _MODELS.get(sk.split("#", 1)[0])


class ReadCache:
    """What reading moto step after step keeps: each record parsed once per version of its text (a step
    changes a few records of many), and moto's backends of the replay (`peek`)."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], tuple[str, BaseModel | str]] = {}
        self.backends: tuple[Any, Any, Any] | None = None  # DynamoDB table, EC2, Step Functions

    def parse(self, pk: str, sk: str, text: str | None) -> BaseModel | UnreadableRecord | None:
        model = _model_of(sk)
        if model is None:
            return None
        if text is None:
            return UnreadableRecord(pk, sk, "no `record` attribute")
        cached = self._parsed.get((pk, sk))
        if cached is None or cached[0] != text:
            parsed: BaseModel | str
            try:
                parsed = model.model_validate_json(text)
            except ValidationError as e:
                parsed = f"does not read as {model.__name__}: {'; '.join(field_problems(e, at_most=1))}"
            cached = self._parsed[(pk, sk)] = (text, parsed)
        return UnreadableRecord(pk, sk, cached[1]) if isinstance(cached[1], str) else cached[1]


def _observed(
    records: Iterable[tuple[str, str, str | None]],
    instances: Iterable[InstanceView],
    executions: Mapping[str, str],
    cache: ReadCache,
) -> Observed:
    jobs: dict[str, Job] = {}
    attempts: dict[str, list[Attempt]] = {}
    pointers: dict[str, CheckpointPointer] = {}
    unreadable: list[UnreadableRecord] = []
    for pk, sk, text in records:
        parsed = cache.parse(pk, sk, text)
        if isinstance(parsed, UnreadableRecord):
            unreadable.append(parsed)
        elif isinstance(parsed, Job):
            jobs[parsed.job_id] = parsed
        elif isinstance(parsed, Attempt):
            attempts.setdefault(parsed.job_id, []).append(parsed)
        elif isinstance(parsed, CheckpointPointer):
            pointers[parsed.job_id] = parsed
    return Observed(
        jobs=jobs,
        attempts={job_id: sorted(found, key=lambda a: a.attempt) for job_id, found in attempts.items()},
        pointers=pointers,
        instances=sorted(instances, key=lambda i: i.instance_id),
        executions=executions,
        unreadable=unreadable,
    )


def _instance(instance_id: str, state: str, launched: datetime, tags: Mapping[str, str]) -> InstanceView:
    attempt = tags.get(TAG_ATTEMPT, "")
    return InstanceView(
        instance_id=instance_id,
        state=state,
        launched_at=launched if launched.tzinfo is not None else launched.replace(tzinfo=UTC),
        job_id=tags.get(TAG_JOB_ID),
        attempt=int(attempt) if attempt.isdigit() else None,
    )


def read(runtime: LocalRuntime, stack: LocalStack, cache: ReadCache | None = None) -> Observed:
    """Through the API, as any client would: one Scan of the table, one DescribeInstances of the managed
    instances pending or running, one ListExecutions of JobLifecycle (each paginated)."""
    records: list[tuple[str, str, str | None]] = []
    for page in runtime.dynamodb.get_paginator("scan").paginate(TableName=stack.table_name, ConsistentRead=True):
        for item in page.get("Items", []):
            text = item.get("record", {}).get("S")
            records.append((item["pk"].get("S", ""), item["sk"].get("S", ""), text))
    instances: list[InstanceView] = []
    pages = runtime.ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": sorted(RUNNING_STATES)},
        ]
    )
    for described_page in pages:
        for reservation in described_page.get("Reservations", []):
            for described in reservation.get("Instances", []):
                tags = {t.get("Key", ""): t.get("Value", "") for t in described.get("Tags", [])}
                instances.append(
                    _instance(
                        described.get("InstanceId", ""),
                        described.get("State", {}).get("Name", ""),
                        described.get("LaunchTime", datetime.min.replace(tzinfo=UTC)),
                        tags,
                    )
                )
    executions: dict[str, str] = {}
    listed = runtime.sfn.get_paginator("list_executions").paginate(stateMachineArn=stack.state_machine_arn)
    for listed_page in listed:
        for execution in listed_page.get("executions", []):
            executions[execution["name"]] = execution["status"]
    return _observed(records, instances, executions, cache or ReadCache())


def peek(runtime: LocalRuntime, stack: LocalStack, cache: ReadCache | None = None) -> Observed:
    """The same as `read`, from moto's in-process backends: no request and response to serialize. Only
    while every process of the clock is blocked on it (the replay checks between steps): nothing else
    changes the backends then."""
    cache = cache or ReadCache()
    if cache.backends is None:
        from moto.dynamodb.models import dynamodb_backends
        from moto.ec2.models import ec2_backends
        from moto.stepfunctions.responses import get_backend

        account, region = stack.account_id, runtime.region
        table = dynamodb_backends[account][region].get_table(stack.table_name)
        sfn = get_backend(account, region)  # moto's interpreter's backend (execute_state_machine)
        cache.backends = (table, ec2_backends[account][region], sfn.describe_state_machine(stack.state_machine_arn))
    table, ec2, state_machine = cache.backends
    records: list[tuple[str, str, str | None]] = []
    groups: Any = table.items.values()  # `all_items()`, unsorted: hash key -> range key -> item
    for group in groups:
        for item in group.values() if table.range_key_attr else [group]:
            attrs = item.attrs
            record = attrs.get("record")
            records.append((str(attrs["pk"].value), str(attrs["sk"].value), str(record.value) if record else None))
    instances = []
    for reservation in ec2.reservations.values():
        for instance in reservation.instances:
            if instance.state not in RUNNING_STATES:
                continue
            tags = ec2.tags.get(instance.id, {})  # `get_tags()` searches every resource's tags
            if tags.get(TAG_MANAGED) == "true":
                launched = instance.launch_time
                if isinstance(launched, str):
                    launched = datetime.fromisoformat(launched.replace("Z", "+00:00"))
                instances.append(_instance(instance.id, instance.state, launched, tags))
    executions: dict[str, str] = {}
    for execution in state_machine.executions:
        status = getattr(execution, "exec_status", None) or getattr(execution, "status", None)
        executions[execution.name] = str(getattr(status, "value", status))
    return _observed(records, instances, executions, cache)


# ------------------------------------------------------------------------------------------ the monitor


class AgentActivity(Protocol):
    """What a simulated instance (spotrelay.local.workers.InstanceWorker) reports of its agent."""

    job_id: str
    attempt: int

    @property
    def instance_id(self) -> str: ...

    @property
    def events(self) -> Sequence[Any]: ...  # AgentEvent: at, event, details


def _checkpoint_order(text: Any) -> tuple[int, int] | None:
    attempt, _, seq = str(text).partition("-")
    return (int(attempt), int(seq)) if attempt.isdigit() and seq.isdigit() else None


class InvariantMonitor:
    """Checks each snapshot of a replay; keeps the history the checks need and each violation once."""

    def __init__(
        self, *, reconcile_period: timedelta = timedelta(minutes=SCHEDULE_MINUTES), market: SpotMarket | None = None
    ) -> None:
        self.reconcile_period = reconcile_period
        self.market = market
        self.cache = ReadCache()
        self.checked = 0
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str | None, str | None, int | None, str]] = set()
        self._first_terminal: dict[str, tuple[int, JobState]] = {}
        self._commits: dict[tuple[str, int, int], CommittedCheckpoint] = {}
        self._starts: list[JobStart] = []
        self._read: dict[str, int] = {}  # instance id -> agent events taken
        self._restored: dict[str, tuple[int, int] | None] = {}  # instance id -> the agent's latest restore
        self._restored_at: dict[str, datetime] = {}

    def _take_agent_events(self, agents: Iterable[AgentActivity]) -> None:
        for agent in agents:
            events = agent.events
            start = self._read.get(agent.instance_id, 0)
            for event in events[start:]:
                details = event.details
                if event.event == "checkpoint" and details.get("committed") and isinstance(details.get("seq"), int):
                    key = (agent.job_id, agent.attempt, int(details["seq"]))
                    work = details.get("work_done_hours")
                    self._commits.setdefault(
                        key, CommittedCheckpoint(*key, float(work) if work is not None else None, event.at)
                    )
                elif event.event == "restored":
                    self._restored[agent.instance_id] = _checkpoint_order(details.get("checkpoint"))
                    self._restored_at[agent.instance_id] = event.at
                elif event.event == "job-started":
                    restored = self._restored.pop(agent.instance_id, None)
                    at = self._restored_at.pop(agent.instance_id, event.at)
                    self._starts.append(JobStart(agent.job_id, agent.attempt, at, restored))
            self._read[agent.instance_id] = len(events)

    def check(
        self,
        observed: Observed,
        now: datetime,
        *,
        agents: Iterable[AgentActivity] = (),
        finished: bool = False,
        final: bool = False,
        submitted: Mapping[str, datetime] | None = None,
    ) -> list[Violation]:
        """Check one snapshot; returns the violations not seen before (also added to `violations`)."""
        self._take_agent_events(agents)
        for pointer in observed.pointers.values():  # the pointer as observed, for a commit no agent reported
            key = (pointer.job_id, pointer.attempt, pointer.seq)
            self._commits.setdefault(
                key, CommittedCheckpoint(*key, pointer.work_done_hours, min(pointer.committed_at, now))
            )
        snapshot = Snapshot(
            now=now,
            jobs=observed.jobs,
            attempts=observed.attempts,
            instances=observed.instances,
            executions=observed.executions,
            unreadable=observed.unreadable,
            commits=list(self._commits.values()),
            starts=self._starts,
            first_terminal=self._first_terminal,
            finished=finished,
            final=final,
            submitted=submitted or {},
            reconcile_period=self.reconcile_period,
            market=self.market,
        )
        new = [v for v in check_invariants(snapshot) if v.key not in self._seen]
        for violation in new:
            self._seen.add(violation.key)
        self.violations.extend(new)
        self.checked += 1
        for job_id, job in observed.jobs.items():
            known = self._first_terminal.get(job_id)
            if job.state.is_terminal and (known is None or known[0] < job.run):
                self._first_terminal[job_id] = (job.run, job.state)
        return new


def report_json(checked: int, violations: Sequence[Violation]) -> dict[str, Any]:
    """The replay's JSON `invariants`."""
    return {"checked": checked, "violations": [v.to_json() for v in violations]}


def summary(checked: int, violations: Sequence[Violation]) -> list[str]:
    """The replay's text report: one line, and one more per violation."""
    if not violations:
        return [f"invariants: {checked} checks, no violation"]
    count = len(violations)
    lines = [f"invariants: {checked} checks, {count} violation{'s' if count > 1 else ''}"]
    lines += [f"  {_iso(v.at)}  {v.kind}  {v.job_id or '-'}: {v.detail}" for v in violations]
    return lines


__all__ = [
    "CommittedCheckpoint",
    "InstanceView",
    "InvariantMonitor",
    "JobStart",
    "Observed",
    "ReadCache",
    "Snapshot",
    "UnreadableRecord",
    "Violation",
    "check_invariants",
    "peek",
    "read",
    "report_json",
    "summary",
]
