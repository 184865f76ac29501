"""EC2 events: spot interruption warnings, rebalance recommendations and instance state changes.

Dispatched through a table keyed by (source, detail-type), as Karpenter's interruption controller
does: each kind has a `detail` model and a pure `action_for(detail, attempt, job)`. Events arrive at
least once and out of order, so every action is fenced by the attempt it names (an event for an
attempt that has ended, or that is not the job's current attempt, is acknowledged and ignored) and
is safe to apply twice. Unknown kinds are no-ops; a `detail` that does not parse raises
`MalformedEvent` for the function to log, count and acknowledge.

The instance id always comes from `detail.instance-id` (the `resources` ARNs vary in shape).

A spot instance going away before its interruption warning is handled is an interruption, not a loss.
EventBridge keeps no order, and a warning handled late (a throttled or retried invocation) can come
after the instance's `shutting-down` or `terminated`, which AWS sends two minutes after the warning.
By then the agent has seen the notice in IMDS and is committing its final checkpoint, or has committed
it (systemd gives it 150 s past the shutdown). A loss would fail the Run task with InstanceLost: Recover
closes the attempt LOST at once, and the next attempt restores the checkpoint before the final one.
What this handler knows is only that the instance is spot and that no interruption is noted yet; it
cannot see a warning that was sent and not yet handled, nor a checkpoint in flight. So every going-away
state of a live spot attempt with no interruption noted is handled as its warning is (`Interrupt`):
`interrupted_at` is set to the state change's time, the pool blocked, the interruption counted, and the
Run task failed with SpotInterrupted, so that Recover waits (up to FINAL_CHECKPOINT_WAIT_SECONDS) for
the final checkpoint and the next attempt resumes from it. Mistaking a real loss for an interruption
costs at most that wait: both block the pool and count against `limits.max_interruptions`. The reverse
costs the work since the last periodic checkpoint. Only an on-demand instance going away is a loss.

Both orders and duplicates end the same way, because whichever event comes first does the whole job
and those after it find `interrupted_at` set. The warning coming after the state change only
re-blocks the pool (blocks never shorten) and finds the task closed. A state change after the warning
is ignored. Two running concurrently mark the attempt once through the conditional write, and fail
the one task token once with the same error. Once Recover has closed the attempt, the fence ignores
both. So there is one Recover and one relaunch, and a closed attempt is never reopened.

Billing is not fenced. EC2 stops billing an instance when it goes `stopping`, `stopped`, `shutting-down`
or `terminated` (BILLING_ENDS), and that state change is the one report of it, whichever attempt the
instance ran (a closed one, a stale one, a standby, an ended job's): each settles its attempt's bill at
the earliest such time reported (`end_billing`, spotrelay.models.billing), after the lifecycle's action,
and the job's cost is derived again from its ended attempts. A duplicate or a later state of the same
termination changes nothing; one that comes late with an earlier time moves the end back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from spotrelay.config import ERROR_INSTANCE_LOST, ERROR_SPOT_INTERRUPTED
from spotrelay.control.accounting import account, close_standby
from spotrelay.control.decisions import warning_block
from spotrelay.control.jobs import ask_handover, mark_running, update_attempt, update_job, withdraw_handover
from spotrelay.control.ports import Compute, JobStore, NotFoundError, Workflow
from spotrelay.field_problems import field_problems
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, PriceQuote, ensure_transition
from spotrelay.models.billing import billing_end, settle

SPOT_INTERRUPTION = ("aws.ec2", "EC2 Spot Instance Interruption Warning")
REBALANCE = ("aws.ec2", "EC2 Instance Rebalance Recommendation")
STATE_CHANGE = ("aws.ec2", "EC2 Instance State-change Notification")
# The states EC2 does not bill an instance in ("Not billed", Amazon EC2 User Guide, Amazon EC2 instance state
# changes: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html); spotrelay never
# starts a stopped instance again, so the first of them ends its bill.
BILLING_ENDS = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


class MalformedEvent(ValueError):
    pass


# Later than any event: the handler reckons forward from an event's time (a pool is blocked until it plus
# block_minutes), which overflows near the calendar's end (9999-12-31), after the attempt was written
LATEST_EVENT_TIME = datetime(9000, 1, 1, tzinfo=UTC)


class Ec2Event(BaseModel):
    """The EventBridge envelope, as the function parsed it."""

    model_config = ConfigDict(frozen=True)

    id: str
    source: str
    detail_type: str
    time: AwareDatetime = Field(lt=LATEST_EVENT_TIME)
    detail: Mapping[str, Any]


class _Detail(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="allow")

    instance_id: str = Field(alias="instance-id", pattern=r"^i-[0-9a-f]+$")


class InterruptionDetail(_Detail):
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class RebalanceDetail(_Detail):
    pass


class StateChangeDetail(_Detail):
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


# ------------------------------------------------------------------------------------------ actions


class Ignore(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["ignore"] = "ignore"
    reason: str


class Interrupt(BaseModel):
    """Block the pool, count the interruption once, fail the Run task with SpotInterrupted.
    `before_warning`: the state a spot instance went to before any warning was handled (module docstring)."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["interrupt"] = "interrupt"
    first_notice: bool
    before_warning: str | None = None


class NoteRebalance(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["rebalance"] = "rebalance"


class MarkRunning(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["running"] = "running"


class Lose(BaseModel):
    """The instance went away without a spot notice: fail the Run task with InstanceLost."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["lost"] = "lost"
    state: str


Action = Ignore | Interrupt | NoteRebalance | MarkRunning | Lose


def _fence(attempt: Attempt, job: Job) -> Ignore | None:
    if job.state.is_terminal:
        return Ignore(reason=f"job is {job.state}")
    if attempt.attempt != job.attempts:
        return Ignore(reason=f"stale: attempt {attempt.attempt}, the job is on attempt {job.attempts}")
    if attempt.outcome is not None:
        return Ignore(reason=f"attempt {attempt.attempt} already ended ({attempt.outcome})")
    return None


def interruption_action(detail: InterruptionDetail, attempt: Attempt, job: Job) -> Action:
    return _fence(attempt, job) or Interrupt(first_notice=attempt.interrupted_at is None)


def rebalance_action(detail: RebalanceDetail, attempt: Attempt, job: Job) -> Action:
    fenced = _fence(attempt, job)
    if fenced is not None:
        return fenced
    if attempt.rebalance_at is not None:
        return Ignore(reason="rebalance recommendation already noted")
    return NoteRebalance()


def state_change_action(detail: StateChangeDetail, attempt: Attempt, job: Job) -> Action:
    fenced = _fence(attempt, job)
    if fenced is not None:
        return fenced
    if detail.state == "pending":
        return Ignore(reason="pending")
    if detail.state == "running":
        return Ignore(reason="already running") if attempt.running_at is not None else MarkRunning()
    if attempt.interrupted_at is not None:
        return Ignore(reason=f"{detail.state} after the interruption warning: already handled")
    if attempt.pool.market is Market.SPOT:
        # Its warning may not have been handled yet: the agent may still be committing its final checkpoint.
        return Interrupt(first_notice=True, before_warning=detail.state)
    return Lose(state=detail.state)


class EventKind(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    detail_model: type[_Detail]
    action_for: Callable[[Any, Attempt, Job], Action]


HANDLERS: dict[tuple[str, str], EventKind] = {
    SPOT_INTERRUPTION: EventKind(name="interruption", detail_model=InterruptionDetail, action_for=interruption_action),
    REBALANCE: EventKind(name="rebalance", detail_model=RebalanceDetail, action_for=rebalance_action),
    STATE_CHANGE: EventKind(name="state-change", detail_model=StateChangeDetail, action_for=state_change_action),
}


class EventOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    action: str
    reason: str = ""
    job_id: str | None = None
    attempt: int | None = None
    instance_id: str | None = None
    billed_until: datetime | None = None  # a state change that ends the bill: where the attempt's bill ends


def handle_ec2_event(
    event: Ec2Event, *, store: JobStore, workflow: Workflow, compute: Compute, block_minutes: float
) -> EventOutcome:
    kind = HANDLERS.get((event.source, event.detail_type))
    if kind is None:
        return EventOutcome(kind="unknown", action="ignore", reason=f"{event.source} / {event.detail_type}")
    try:
        detail = kind.detail_model.model_validate(event.detail)
    except ValidationError as e:
        problems = "; ".join(field_problems(e, show_input=True))
        raise MalformedEvent(f"{kind.name} event {event.id}: {problems}") from None
    ref = store.get_instance_ref(detail.instance_id)
    if ref is None:
        return EventOutcome(
            kind=kind.name, action="ignore", reason="not a spotrelay instance", instance_id=detail.instance_id
        )
    try:
        job, _ = store.get_job(ref.job_id)
        attempt = store.get_attempt(ref.job_id, ref.attempt)
    except NotFoundError:
        return EventOutcome(kind=kind.name, action="ignore", reason="job or attempt not found", job_id=ref.job_id)
    base = EventOutcome(
        kind=kind.name, action="ignore", job_id=ref.job_id, attempt=ref.attempt, instance_id=detail.instance_id
    )
    outcome = _act(kind, event, detail, attempt, job, base, store=store, workflow=workflow, block_minutes=block_minutes)
    if isinstance(detail, StateChangeDetail) and detail.state in BILLING_ENDS:  # unfenced: module docstring
        # last: the lifecycle's action (a warning's part, say) never waits on a price read
        billed = end_billing(store, compute, attempt, event.time)
        outcome = outcome.model_copy(update={"billed_until": billed.billed_until})
    return outcome


def _act(
    kind: EventKind,
    event: Ec2Event,
    detail: _Detail,
    attempt: Attempt,
    job: Job,
    base: EventOutcome,
    *,
    store: JobStore,
    workflow: Workflow,
    block_minutes: float,
) -> EventOutcome:
    """What the event does to the attempt's lifecycle (fenced), through the ports."""
    job_id, number = attempt.job_id, attempt.attempt
    if attempt.is_standby:
        handled = _standby_event(event, detail, attempt, job, base, store=store, block_minutes=block_minutes)
        if handled is not None:
            return handled
        # Launch adopted the standby while this event was handled: it is the job's attempt now, even
        # before Launch's next write moves job.attempts onto it
        job, _ = store.get_job(job_id)
        attempt = store.get_attempt(job_id, number)
        if attempt.handover_from == job.attempts and attempt.task_token is not None:
            job = job.model_copy(update={"attempts": attempt.attempt})
    action = kind.action_for(detail, attempt, job)
    if isinstance(action, Ignore):
        return base.model_copy(update={"reason": action.reason})
    if isinstance(action, Interrupt):
        record_interruption(attempt, event.time, first=action.first_notice, store=store, block_minutes=block_minutes)
        closed = not _fail_task(workflow, attempt, ERROR_SPOT_INTERRUPTED, event, detail.instance_id)
        reasons = [f"{action.before_warning} before any interruption warning"] if action.before_warning else []
        reasons += ["task already closed"] if closed else []
        return base.model_copy(update={"action": "interrupt", "reason": "; ".join(reasons)})
    if isinstance(action, NoteRebalance):
        update_attempt(store, job_id, number, lambda fresh: fresh.model_copy(update={"rebalance_at": event.time}))
        return base.model_copy(update={"action": "rebalance"})
    if isinstance(action, MarkRunning):
        update_attempt(store, job_id, number, mark_running(event.time))
        update_job(store, job_id, _running(number, event.time))
        return base.model_copy(update={"action": "running"})
    closed = not _fail_task(workflow, attempt, ERROR_INSTANCE_LOST, event, detail.instance_id)
    return base.model_copy(
        update={"action": "lost", "reason": f"{action.state}{'; task already closed' if closed else ''}"}
    )


def _standby_event(
    event: Ec2Event,
    detail: _Detail,
    standby: Attempt,
    job: Job,
    base: EventOutcome,
    *,
    store: JobStore,
    block_minutes: float,
) -> EventOutcome | None:
    """An event for a standby: a spot instance reconcile launched ahead of moving a job off on-demand.
    `running`: ask the current attempt's agent to hand the job back (it checkpoints, the task fails
    with Migrating, Launch adopts the standby). A notice or the instance going away: the standby is
    closed, and the request withdrawn if the agent has not acted on it yet (if it has, Place and Launch
    place the job as after any handover). The job's Run task is never touched: the standby has none.
    None if Launch adopted the standby before it could be closed: the event is then the job's attempt's."""
    if job.state.is_terminal:
        return base.model_copy(update={"reason": f"standby of a job that is {job.state}"})
    if isinstance(detail, StateChangeDetail) and detail.state == "pending":
        return base.model_copy(update={"reason": "standby pending"})
    if isinstance(detail, RebalanceDetail):
        return base.model_copy(update={"reason": "standby: rebalance recommendation noted by nobody"})
    previous = standby.handover_from
    assert previous is not None
    if isinstance(detail, StateChangeDetail) and detail.state == "running":
        update_attempt(store, standby.job_id, standby.attempt, mark_running(event.time))
        _, asked = update_attempt(store, standby.job_id, previous, ask_handover(event.time))
        return base.model_copy(
            update={"action": "handover", "reason": f"asked attempt {previous} to hand over" if asked else "asked"}
        )
    interrupted = isinstance(detail, InterruptionDetail)
    if interrupted:
        record_interruption(
            standby, event.time, first=standby.interrupted_at is None, store=store, block_minutes=block_minutes
        )
    outcome = AttemptOutcome.INTERRUPTED if interrupted else AttemptOutcome.LOST
    closed_standby = close_standby(store, standby, outcome, event.time)
    if closed_standby is None:
        fresh = store.get_attempt(standby.job_id, standby.attempt)
        if fresh.outcome is None and fresh.task_token is not None:
            return None  # adopted meanwhile
        return base.model_copy(update={"reason": f"standby already ended ({fresh.outcome})"})
    update_attempt(store, standby.job_id, previous, withdraw_handover)
    return base.model_copy(update={"action": "standby-lost", "reason": str(outcome)})


def end_billing(store: JobStore, compute: Compute, attempt: Attempt, gone_at: datetime) -> Attempt:
    """`attempt`'s instance was reported gone at `gone_at` (its state change; reconcile finding it gone):
    settle its bill at the earliest such report (`spotrelay.models.billing.settle`), at the prices in effect
    from its launch (DescribeSpotPriceHistory, asked only when the report moves the end), by a conditional
    write. Then, if the attempt has ended, derive the job's cost again (`account`: it totals the ended
    attempts), whether or not this call settled it: a retried handler redoes what a failure left undone.
    Returns the attempt as stored."""
    history: list[list[PriceQuote]] = []  # asked for once, and only if a fresh read needs it

    def change(fresh: Attempt) -> Attempt | None:
        if billing_end(fresh, gone_at) is None:
            return None
        if not history:
            spot = fresh.pool.market is Market.SPOT
            end = max(gone_at, fresh.started_at)
            history.append(compute.spot_price_history(fresh.pool, fresh.started_at, end) if spot else [])
        return settle(fresh, history[0], gone_at)

    settled, _ = update_attempt(store, attempt.job_id, attempt.attempt, change)
    if settled.outcome is not None:
        update_job(store, attempt.job_id, lambda fresh: account(fresh, store.attempts(fresh.job_id), None, gone_at))
    return settled


def record_interruption(attempt: Attempt, at: datetime, *, first: bool, store: JobStore, block_minutes: float) -> None:
    if first:
        # The first warning to be recorded counts the interruption (a duplicate delivered concurrently
        # finds the field set on its fresh read and counts nothing).
        _, marked = update_attempt(
            store,
            attempt.job_id,
            attempt.attempt,
            lambda fresh: fresh.model_copy(update={"interrupted_at": at}) if fresh.interrupted_at is None else None,
        )
        if marked:
            store.record_pool_usage(attempt.pool, 0.0, 1)
    # For every job (a job whose only spot pool this is is exempt: its recovery prefers the pool)
    store.block_pool(warning_block(attempt, at, block_minutes))


def _fail_task(workflow: Workflow, attempt: Attempt, error: str, event: Ec2Event, instance_id: str) -> bool:
    if attempt.task_token is None:
        return False
    cause = json.dumps(
        {
            "instance_id": instance_id,
            "attempt": attempt.attempt,
            "instance_type": attempt.pool.instance_type,
            "availability_zone": attempt.pool.availability_zone,
            "event_id": event.id,
            "event_time": event.time.isoformat(),
        }
    )
    return workflow.fail_task(attempt.task_token, error, cause)


def _running(attempt_number: int, at: datetime) -> Callable[[Job], None]:
    def change(job: Job) -> None:
        if job.attempts == attempt_number and job.state is JobState.LAUNCHING:
            job.state = ensure_transition(job.state, JobState.RUNNING)
            job.updated_at = at

    return change
