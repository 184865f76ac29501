"""The brain: placement, deadline-aware market choice and recovery. Pure: no I/O, no AWS."""

from spotrelay.policy.interruptions import InterruptionModel, PoolObservation, band_hourly_rate
from spotrelay.policy.market_choice import MarketAction, MarketDecision, uniform_progress
from spotrelay.policy.placement import (
    DEFAULT_RESTART_OVERHEAD_HOURS,
    Placement,
    RankedPool,
    Rejection,
    latest_quotes,
    place,
)
from spotrelay.policy.recovery import (
    STRATEGIES,
    AttemptEnded,
    BlockedPool,
    EagerNextPool,
    EndKind,
    Fail,
    NextAction,
    RecoveryStrategy,
    Relaunch,
    SamePoolFirst,
    active_blocks,
    decide_recovery,
    strategy_for,
)

__all__ = [
    "DEFAULT_RESTART_OVERHEAD_HOURS",
    "STRATEGIES",
    "AttemptEnded",
    "BlockedPool",
    "EagerNextPool",
    "EndKind",
    "Fail",
    "InterruptionModel",
    "MarketAction",
    "MarketDecision",
    "NextAction",
    "Placement",
    "PoolObservation",
    "RankedPool",
    "RecoveryStrategy",
    "Rejection",
    "Relaunch",
    "SamePoolFirst",
    "active_blocks",
    "band_hourly_rate",
    "decide_recovery",
    "latest_quotes",
    "place",
    "strategy_for",
    "uniform_progress",
]
