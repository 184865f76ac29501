"""In-memory fakes of every port in `spotrelay.control.ports`, with the same semantics as the boto3
adapters (conditional writes, idempotency, "gone" is not an error), and fault injection:
`fake.fail_next["method"] = SomeError(...)` makes the next call of that method raise it
(throttling, ConditionalCheckFailed as ConflictError, InsufficientInstanceCapacity, ...).
The job store refuses a job DynamoDB could not store (text that does not encode, an item over 400 KB).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID, TAG_JOB_NAME, TAG_MANAGED
from spotrelay.control.ports import (
    CheckpointPointer,
    ConflictError,
    InstanceRef,
    InstanceState,
    LaunchRefused,
    LaunchRequest,
    NotFoundError,
    QueueMessage,
)
from spotrelay.models import Attempt, Job, JobState, Market, Pool, PriceQuote
from spotrelay.policy import BlockedPool, PoolObservation


class FunctionStopped(BaseException):
    """The function stopped right here (a Lambda timeout, a crash): unlike an error, which the code may
    catch and carry on past (the dispatcher does, message by message), nothing after it runs."""


class FaultInjection:
    """`fail_next[method] = exception`: the next call of `method` raises it (once). An `Exception` is an
    error the service answered; `FunctionStopped` is the function stopping there."""

    def __init__(self) -> None:
        self.fail_next: dict[str, BaseException] = {}

    def _maybe_fail(self, method: str) -> None:
        fault = self.fail_next.pop(method, None)
        if fault is not None:
            raise fault


# --- JobStore ---------------------------------------------------------------------------------------

DYNAMODB_MAX_ITEM_BYTES = 400 * 1024


class ItemTooLarge(Exception):
    """What DynamoDB answers a write of an item over 400 KB (a ValidationException, from the adapter)."""


def storable(job: Job) -> Job:
    """A copy of `job`, refused as the adapter's write would be: its JSON must encode (no unpaired
    surrogate: pydantic raises) and fit in one DynamoDB item."""
    record = job.model_dump_json()
    if len(record.encode("utf-8")) > DYNAMODB_MAX_ITEM_BYTES:
        raise ItemTooLarge(f"job {job.job_id}: Item size has exceeded the maximum allowed size")
    return job.model_copy(deep=True)


class FakeJobStore(FaultInjection):
    def __init__(self) -> None:
        super().__init__()
        self.jobs: dict[str, tuple[Job, int]] = {}
        self.attempt_records: dict[tuple[str, int], Attempt] = {}
        self.attempt_versions: dict[tuple[str, int], int] = {}
        # Called once each, in order, right after a versioned read (a read-modify-write's read): a concurrent writer.
        self.after_attempt_read: list[Callable[[], None]] = []
        self.instance_refs: dict[str, InstanceRef] = {}
        self.blocks: dict[tuple[str, Market], BlockedPool] = {}
        self.pool_stats: dict[str, PoolObservation] = {}
        self.checkpoints: dict[str, CheckpointPointer] = {}
        self.early_cancels: set[str] = set()

    def create_job(self, job: Job) -> bool:
        self._maybe_fail("create_job")
        if job.job_id in self.jobs:
            return False
        self.jobs[job.job_id] = (storable(job), 1)
        return True

    def get_job(self, job_id: str) -> tuple[Job, int]:
        self._maybe_fail("get_job")
        if job_id not in self.jobs:
            raise NotFoundError(f"job {job_id}")
        job, version = self.jobs[job_id]
        return job.model_copy(deep=True), version

    def put_job(self, job: Job, expected_version: int) -> int:
        self._maybe_fail("put_job")
        current = self.jobs.get(job.job_id)
        if current is None or current[1] != expected_version:
            raise ConflictError(f"job {job.job_id} is no longer at version {expected_version}")
        self.jobs[job.job_id] = (storable(job), expected_version + 1)
        return expected_version + 1

    def queued_jobs(self, limit: int) -> list[Job]:
        self._maybe_fail("queued_jobs")
        queued = [job for job, _ in self.jobs.values() if job.state is JobState.QUEUED]
        queued.sort(key=lambda j: (j.spec.priority.rank, j.submitted_at, j.job_id))
        return [j.model_copy(deep=True) for j in queued[: max(limit, 0)]]

    def active_jobs(self) -> list[Job]:
        self._maybe_fail("active_jobs")
        return [
            job.model_copy(deep=True)
            for job, _ in self.jobs.values()
            if job.state is not JobState.QUEUED and not job.state.is_terminal
        ]

    def put_attempt(self, attempt: Attempt, expected_version: int | None = None) -> int:
        self._maybe_fail("put_attempt")
        key = (attempt.job_id, attempt.attempt)
        current = self.attempt_versions.get(key, 0)
        if expected_version is not None and current != expected_version:
            raise ConflictError(f"attempt {attempt.attempt} of job {attempt.job_id} is no longer at {expected_version}")
        self.attempt_records[key] = attempt.model_copy(deep=True)
        self.attempt_versions[key] = current + 1
        return current + 1

    def get_attempt(self, job_id: str, attempt: int) -> Attempt:
        self._maybe_fail("get_attempt")
        if (job_id, attempt) not in self.attempt_records:
            raise NotFoundError(f"attempt {attempt} of job {job_id}")
        return self.attempt_records[(job_id, attempt)].model_copy(deep=True)

    def get_attempt_versioned(self, job_id: str, attempt: int) -> tuple[Attempt, int]:
        read = self.get_attempt(job_id, attempt)
        version = self.attempt_versions.get((job_id, attempt), 0)
        hook = self.after_attempt_read.pop(0) if self.after_attempt_read else None
        if hook is not None:  # a concurrent writer, between this read and the caller's write
            hook()
        return read, version

    def attempts(self, job_id: str) -> list[Attempt]:
        self._maybe_fail("attempts")
        found = [a.model_copy(deep=True) for (jid, _), a in self.attempt_records.items() if jid == job_id]
        return sorted(found, key=lambda a: a.attempt)

    def request_cancel_before_admission(self, job_id: str) -> None:
        self._maybe_fail("request_cancel_before_admission")
        self.early_cancels.add(job_id)

    def cancel_requested_before_admission(self, job_id: str) -> bool:
        self._maybe_fail("cancel_requested_before_admission")
        return job_id in self.early_cancels

    def forget_cancel_before_admission(self, job_id: str) -> None:
        self._maybe_fail("forget_cancel_before_admission")
        self.early_cancels.discard(job_id)

    def put_instance_ref(self, ref: InstanceRef) -> None:
        self._maybe_fail("put_instance_ref")
        self.instance_refs[ref.instance_id] = ref

    def get_instance_ref(self, instance_id: str) -> InstanceRef | None:
        self._maybe_fail("get_instance_ref")
        return self.instance_refs.get(instance_id)

    def block_pool(self, block: BlockedPool) -> None:
        self._maybe_fail("block_pool")
        key = (block.pool.offering, block.pool.market)
        current = self.blocks.get(key)
        if current is None or current.until < block.until:  # never shorten a block
            self.blocks[key] = block

    def blocked_pools(self, now: datetime) -> list[BlockedPool]:
        self._maybe_fail("blocked_pools")
        return [b for b in self.blocks.values() if b.until > now]

    def record_pool_usage(self, pool: Pool, instance_hours: float, interruptions: int) -> None:
        self._maybe_fail("record_pool_usage")
        seen = self.pool_stats.get(pool.offering, PoolObservation())
        self.pool_stats[pool.offering] = PoolObservation(
            interruptions=seen.interruptions + interruptions,
            instance_hours=seen.instance_hours + instance_hours,
        )

    def pool_observations(self) -> dict[str, PoolObservation]:
        self._maybe_fail("pool_observations")
        return dict(self.pool_stats)

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool:
        self._maybe_fail("advance_checkpoint")
        current = self.checkpoints.get(pointer.job_id)
        if current is not None and (pointer.attempt, pointer.seq) <= (current.attempt, current.seq):
            return False
        self.checkpoints[pointer.job_id] = pointer
        return True

    def get_checkpoint(self, job_id: str) -> CheckpointPointer | None:
        self._maybe_fail("get_checkpoint")
        return self.checkpoints.get(job_id)


# --- Compute ----------------------------------------------------------------------------------------


class FakeCompute(FaultInjection):
    """`prices[(type, zone)] = usd` (a price that always held), `price_changes[(type, zone)] = [(since, usd),
    ...]` (a series: each price from its time on, over `prices`); `refuse[pool] = "InsufficientInstanceCapacity"`
    makes launches there raise LaunchRefused; `set_state(instance_id, "terminated")` plays EC2's part.
    `history_requests` lists every spot_price_history call (pool, start, end)."""

    def __init__(self, prices: dict[tuple[str, str], float] | None = None) -> None:
        super().__init__()
        self.prices: dict[tuple[str, str], float] = dict(prices or {})
        self.price_changes: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
        self.history_requests: list[tuple[Pool, datetime, datetime]] = []
        self.refuse: dict[Pool, str] = {}
        self.instances: dict[str, InstanceState] = {}
        self.launches: list[LaunchRequest] = []  # every request that got an instance, repeats included
        self.terminated: list[str] = []
        self._by_token: dict[str, str] = {}
        self._ids = itertools.count(1)

    def _changes(self, key: tuple[str, str]) -> list[tuple[datetime, float]]:
        return sorted(self.price_changes.get(key, []), key=lambda change: change[0])

    def _price_at(self, key: tuple[str, str], when: datetime) -> float | None:
        in_effect = [usd for at, usd in self._changes(key) if at <= when]
        return in_effect[-1] if in_effect else self.prices.get(key)

    def spot_prices(self, instance_types: Sequence[str], zones: Sequence[str], now: datetime) -> list[PriceQuote]:
        self._maybe_fail("spot_prices")
        quotes = []
        for itype, zone in sorted({*self.prices, *self.price_changes}):
            price = self._price_at((itype, zone), now)
            if price is not None and itype in instance_types and (not zones or zone in zones):
                pool = Pool(instance_type=itype, availability_zone=zone)
                quotes.append(PriceQuote(pool=pool, usd_per_hour=price, timestamp=now))
        return quotes

    def spot_price_history(self, pool: Pool, start: datetime, end: datetime) -> list[PriceQuote]:
        """As EC2 answers: the price in effect at `start`, stamped when it took effect (`start` for a price
        that always held), then each change in (start, end]."""
        self._maybe_fail("spot_price_history")
        self.history_requests.append((pool, start, end))
        key = (pool.instance_type, pool.availability_zone)
        changes = self._changes(key)
        first = self._price_at(key, start)
        since = max((at for at, _ in changes if at <= start), default=start)
        window = [*([(since, first)] if first is not None else []), *((a, u) for a, u in changes if start < a <= end)]
        spot = Pool(instance_type=pool.instance_type, availability_zone=pool.availability_zone, market=Market.SPOT)
        return [PriceQuote(pool=spot, usd_per_hour=usd, timestamp=at) for at, usd in window]

    def launch(self, request: LaunchRequest) -> str:
        self._maybe_fail("launch")
        if request.pool in self.refuse:
            raise LaunchRefused(self.refuse[request.pool], f"no capacity for {request.pool}")
        instance_id = self._by_token.get(request.client_token)
        if instance_id is None:
            instance_id = f"i-{next(self._ids):017x}"
            self._by_token[request.client_token] = instance_id
            tags = {
                TAG_MANAGED: "true",
                TAG_JOB_ID: request.job_id,
                TAG_ATTEMPT: str(request.attempt),
                TAG_JOB_NAME: request.job_name,
                "Name": f"spotrelay-{request.job_name}-{request.attempt}",
            }
            tags |= {key: value for key, value in request.tags.items() if not key.startswith("spotrelay:")}
            self.instances[instance_id] = InstanceState(instance_id=instance_id, state="pending", tags=tags)
        self.launches.append(request)
        return instance_id

    def set_state(self, instance_id: str, state: str) -> None:
        self.instances[instance_id] = self.instances[instance_id].model_copy(update={"state": state})

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self._maybe_fail("terminate")
        for instance_id in instance_ids:
            if instance_id in self.instances:
                self.set_state(instance_id, "terminated")
                self.terminated.append(instance_id)

    def managed_instances(self) -> list[InstanceState]:
        self._maybe_fail("managed_instances")
        return [i for i in self.instances.values() if i.tags.get(TAG_MANAGED) == "true" and i.state != "terminated"]

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        self._maybe_fail("instance_states")
        return {i: self.instances[i].state for i in instance_ids if i in self.instances}


# --- Workflow ---------------------------------------------------------------------------------------


@dataclass
class FakeExecution:
    job_id: str  # the execution's name: the job id, or `<job id>-run<n>` for a resumed run
    payload: dict[str, object]
    status: str = "RUNNING"
    stop_cause: str | None = None


@dataclass
class TaskResult:
    task_token: str
    output: dict[str, object] | None = None  # on success
    error: str | None = None  # on failure
    cause: str | None = None


class FakeWorkflow(FaultInjection):
    """`open_task(token)` plays a Run state waiting for its token; closed or unknown tokens answer False."""

    def __init__(self) -> None:
        super().__init__()
        self.executions: dict[str, FakeExecution] = {}
        self.open_tokens: set[str] = set()
        self.task_results: list[TaskResult] = []

    def open_task(self, task_token: str) -> None:
        self.open_tokens.add(task_token)

    def start(self, execution: str, payload: dict[str, object]) -> bool:
        self._maybe_fail("start")
        if execution in self.executions:
            return False
        self.executions[execution] = FakeExecution(job_id=execution, payload=dict(payload))
        return True

    def succeed_task(self, task_token: str, output: dict[str, object]) -> bool:
        self._maybe_fail("succeed_task")
        if task_token not in self.open_tokens:
            return False
        self.open_tokens.discard(task_token)
        self.task_results.append(TaskResult(task_token=task_token, output=dict(output)))
        return True

    def fail_task(self, task_token: str, error: str, cause: str) -> bool:
        self._maybe_fail("fail_task")
        if task_token not in self.open_tokens:
            return False
        self.open_tokens.discard(task_token)
        self.task_results.append(TaskResult(task_token=task_token, error=error, cause=cause))
        return True

    def status(self, execution: str) -> str | None:
        self._maybe_fail("status")
        found = self.executions.get(execution)
        return None if found is None else found.status

    def stop(self, execution: str, cause: str) -> None:
        self._maybe_fail("stop")
        found = self.executions.get(execution)
        if found is not None and found.status == "RUNNING":
            found.status = "ABORTED"
            found.stop_cause = cause


# --- JobQueue ---------------------------------------------------------------------------------------


@dataclass
class DeadLetter:
    message: QueueMessage
    reason: str


class FakeQueue(FaultInjection):
    """`send(body)` enqueues; `receive` hands each message out once until it is deleted or `redeliver()`."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[QueueMessage] = []
        self.dlq: list[DeadLetter] = []
        self.in_flight: set[str] = set()
        self._ids = itertools.count(1)

    def send(self, body: str, submission_id: str | None = None) -> QueueMessage:
        n = next(self._ids)
        message = QueueMessage(message_id=f"msg-{n}", receipt_handle=f"rh-{n}", body=body, submission_id=submission_id)
        self.messages.append(message)
        return message

    def redeliver(self) -> None:
        """The visibility timeout passed: messages received and not deleted come back."""
        self.in_flight.clear()

    def receive(self, max_messages: int) -> list[QueueMessage]:
        self._maybe_fail("receive")
        visible = [m for m in self.messages if m.message_id not in self.in_flight][: max(max_messages, 0)]
        self.in_flight.update(m.message_id for m in visible)
        return visible

    def delete(self, message: QueueMessage) -> None:
        self._maybe_fail("delete")
        self.messages = [m for m in self.messages if m.message_id != message.message_id]
        self.in_flight.discard(message.message_id)

    def dead_letter(self, message: QueueMessage, reason: str) -> None:
        self._maybe_fail("dead_letter")
        self.dlq.append(DeadLetter(message=message, reason=reason))
        self.delete(message)


# --- Wakeup and Clock -------------------------------------------------------------------------------


class FakeWakeup(FaultInjection):
    def __init__(self) -> None:
        super().__init__()
        self.reasons: list[str] = []

    def wake_dispatcher(self, reason: str) -> None:
        self._maybe_fail("wake_dispatcher")
        self.reasons.append(reason)


class FakeClock:
    def __init__(self, start: datetime = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)) -> None:
        self.current = start

    def now(self) -> datetime:
        return self.current

    def advance(self, by: timedelta | float) -> datetime:
        """Move forward by a timedelta or a number of seconds; returns the new now."""
        self.current += by if isinstance(by, timedelta) else timedelta(seconds=by)
        return self.current
