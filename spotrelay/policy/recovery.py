"""Recovery strategies: what to do when an attempt ends without finishing the job.

Each strategy is a small named class, chosen per job (`recovery: {strategy: ...}`), whose `decide`
is a pure function of (job, attempts, event) -> next action. Backoff and retries are not here: they
live in the state machine's Retry/Wait states. Limits common to every strategy come first: too many
interruptions, too many restarts of failing user code, or the budget spent end the job.

A block steers the job away from a lost pool, to the next one. It has nowhere to steer a job whose
last placement (`Job.placement`, the ranking the lost attempt was launched from) offered no other spot
pool — a job confined to one zone and type, as in the Can't Be Late setting: there a block only keeps
the job idle while the pool's capacity comes back (on the Can't Be Late traces outages last a median
20-40 minutes, less than the default 60-minute block), and a waiting job with a deadline drifts into
the safety net and runs on on-demand to the end. So neither strategy blocks the only spot pool a job
has: it prefers it (`Relaunch.prefer`), which exempts the job from that pool's blocks (the blocks are
per pool, for every job: the interruption warning's and a refused launch's stay in force for the
others); a relaunch there while it still has no capacity is refused, and the Wait state's backoff paces
the retries. A job with no recorded placement (none yet, or a record written without one) has the lost
pool blocked, as a job with another pool to go to does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict

from spotrelay.models import Attempt, AttemptOutcome, Job, Market, Pool, RecoveryStrategyName


class EndKind(StrEnum):
    """Why an attempt ended; the values are the error names the state machine sees."""

    SPOT_INTERRUPTED = "SpotInterrupted"
    MIGRATED = "Migrating"  # the control plane moved the job off on-demand (the agent checkpointed first)
    INSTANCE_LOST = "InstanceLost"
    HEARTBEAT_TIMEOUT = "HeartbeatTimeout"
    JOB_FAILED = "JobFailed"
    INSUFFICIENT_CAPACITY = "InsufficientInstanceCapacity"
    PRICE_ABOVE_CAP = "PriceAboveCap"

    @property
    def is_interruption(self) -> bool:
        """The instance was taken from us (counts against `limits.max_interruptions`)."""
        return self in {EndKind.SPOT_INTERRUPTED, EndKind.INSTANCE_LOST, EndKind.HEARTBEAT_TIMEOUT}

    @property
    def is_launch_failure(self) -> bool:
        return self in {EndKind.INSUFFICIENT_CAPACITY, EndKind.PRICE_ABOVE_CAP}

    @property
    def outcome(self) -> AttemptOutcome:
        if self is EndKind.SPOT_INTERRUPTED:
            return AttemptOutcome.INTERRUPTED
        if self is EndKind.MIGRATED:
            return AttemptOutcome.MIGRATED
        if self is EndKind.JOB_FAILED:
            return AttemptOutcome.FAILED
        if self.is_launch_failure:
            return AttemptOutcome.LAUNCH_FAILED
        return AttemptOutcome.LOST


class AttemptEnded(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: EndKind
    pool: Pool
    at: AwareDatetime
    attempt: int
    exit_code: int | None = None


class BlockedPool(BaseModel):
    model_config = ConfigDict(frozen=True)

    pool: Pool
    until: AwareDatetime
    reason: str


class Relaunch(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: Literal["relaunch"] = "relaunch"
    reason: str
    block: tuple[BlockedPool, ...] = ()
    prefer: Pool | None = None  # try this pool first if placement still finds it feasible
    counts_interruption: bool = False
    counts_restart: bool = False


class Fail(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: Literal["fail"] = "fail"
    error: str  # the state machine's error name: TooManyInterruptions, JobFailed, BudgetExhausted
    reason: str


NextAction = Relaunch | Fail


class RecoveryStrategy(Protocol):
    name: RecoveryStrategyName

    def decide(self, job: Job, attempts: Sequence[Attempt], event: AttemptEnded) -> NextAction: ...


def _limits(job: Job, event: AttemptEnded) -> Fail | None:
    limits = job.spec.limits
    if event.kind.is_interruption and job.interruptions + 1 > limits.max_interruptions:
        return Fail(
            error="TooManyInterruptions",
            reason=f"{job.interruptions + 1} interruptions; limits.max_interruptions is {limits.max_interruptions}",
        )
    if event.kind is EndKind.JOB_FAILED and job.restarts + 1 > limits.max_restarts:
        return Fail(
            error="JobFailed",
            reason=(
                f"the job exited with code {event.exit_code} on attempt {event.attempt}; "
                f"{job.restarts} restart(s) already, limits.max_restarts is {limits.max_restarts}"
            ),
        )
    if limits.max_total_cost is not None and job.cost_usd >= limits.max_total_cost:
        return Fail(
            error="BudgetExhausted",
            reason=f"spent ${job.cost_usd:.2f}; limits.max_total_cost is ${limits.max_total_cost:g}",
        )
    return None


def has_other_spot_pool(job: Job, pool: Pool) -> bool:
    """Whether the job's last placement offered a spot pool other than `pool` to move to (True when no
    placement is recorded: nothing says the block would be useless)."""
    if not job.placement:
        return True
    return any(p.pool != pool and p.pool.market is Market.SPOT for p in job.placement)


def _migrated(event: AttemptEnded) -> Relaunch:
    """The control plane moved the job off on-demand through a checkpoint: nothing was lost or refused,
    no block, no interruption counted; Place chooses again (spot, as the decision to migrate said)."""
    return Relaunch(reason=f"moved off {event.pool} to go back to spot")


def _only_pool(event: AttemptEnded) -> Relaunch:
    """The lost pool is the only spot pool the job had: no block of the job's own, and the job is exempt
    from the pool's blocks (the warning's, a refused launch's), as a preferred pool is."""
    return Relaunch(
        reason=f"{event.kind} in {event.pool}, the only spot pool placement offered: back to it when it has capacity",
        prefer=event.pool,
        counts_interruption=event.kind.is_interruption,
    )


def _block(job: Job, event: AttemptEnded) -> BlockedPool:
    minutes = job.spec.recovery.block_minutes
    return BlockedPool(
        pool=event.pool,
        until=event.at + timedelta(minutes=minutes),
        reason=f"{event.kind} on attempt {event.attempt}",
    )


def _restart_same_code(event: AttemptEnded) -> Relaunch:
    # The user's code failed: the pool is not to blame, so nothing is blocked.
    return Relaunch(reason=f"job exited with code {event.exit_code}: restart", counts_restart=True)


def _before_the_strategy(job: Job, event: AttemptEnded) -> NextAction | None:
    """What every strategy answers before its own rule: the job's limits end it, a job that failed is
    restarted with the same code, a migration goes on; None: the strategy decides."""
    failed = _limits(job, event)
    if failed is not None:
        return failed
    if event.kind is EndKind.JOB_FAILED:
        return _restart_same_code(event)
    if event.kind is EndKind.MIGRATED:
        return _migrated(event)
    return None


class EagerNextPool:
    """Block the pool just lost for `recovery.block_minutes` and take the next best one now; a job whose
    last placement had no other spot pool is not blocked from its only one (module docstring)."""

    name = RecoveryStrategyName.EAGER_NEXT_POOL

    def decide(self, job: Job, attempts: Sequence[Attempt], event: AttemptEnded) -> NextAction:
        common = _before_the_strategy(job, event)
        if common is not None:
            return common
        if not has_other_spot_pool(job, event.pool):
            return _only_pool(event)
        return Relaunch(
            reason=f"{event.kind} in {event.pool}: block it, take the next best pool",
            block=(_block(job, event),),
            counts_interruption=event.kind.is_interruption,
        )


class SamePoolFirst:
    """Go back to the pool just lost once (spot capacity often returns within minutes); if that pool
    is lost again on the very next attempt, or it has no capacity, block it and move on."""

    name = RecoveryStrategyName.SAME_POOL_FIRST

    def decide(self, job: Job, attempts: Sequence[Attempt], event: AttemptEnded) -> NextAction:
        common = _before_the_strategy(job, event)
        if common is not None:
            return common
        earlier = [a for a in attempts if a.attempt < event.attempt]
        previous = max(earlier, key=lambda a: a.attempt, default=None)
        lost_here_before = (
            previous is not None
            and previous.pool == event.pool
            and previous.outcome in {AttemptOutcome.INTERRUPTED, AttemptOutcome.LOST}
        )
        if (event.kind.is_launch_failure or lost_here_before) and not has_other_spot_pool(job, event.pool):
            return _only_pool(event)
        if event.kind.is_launch_failure or lost_here_before:
            why = "no capacity there" if event.kind.is_launch_failure else "lost there twice in a row"
            return Relaunch(
                reason=f"{event.kind} in {event.pool}, {why}: block it, take the next best pool",
                block=(_block(job, event),),
                counts_interruption=event.kind.is_interruption,
            )
        return Relaunch(
            reason=f"{event.kind} in {event.pool}: try the same pool first",
            prefer=event.pool,
            counts_interruption=event.kind.is_interruption,
        )


STRATEGIES: dict[RecoveryStrategyName, RecoveryStrategy] = {
    RecoveryStrategyName.EAGER_NEXT_POOL: EagerNextPool(),
    RecoveryStrategyName.SAME_POOL_FIRST: SamePoolFirst(),
}


def strategy_for(job: Job) -> RecoveryStrategy:
    return STRATEGIES[job.spec.recovery.strategy]


def decide_recovery(job: Job, attempts: Sequence[Attempt], event: AttemptEnded) -> NextAction:
    return strategy_for(job).decide(job, attempts, event)


def active_blocks(blocks: Iterable[BlockedPool], now: datetime) -> frozenset[Pool]:
    """The pools still blocked at `now` (a block lapses at its `until`)."""
    return frozenset(b.pool for b in blocks if b.until > now)
