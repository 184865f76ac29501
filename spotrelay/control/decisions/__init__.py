"""The control plane's decisions, as functions of what a step has read: no port, no clock, no I/O.

The JobLifecycle steps (spotrelay.control.lifecycle) and reconcile read the job, its attempts and the
market through the ports, call these, and carry out what they answer; the benchmark's `spotrelay` policy
(spotrelay.bench.policies) calls the same functions on its simulated market, so what it measures is what
the Lambdas decide; `spotrelay status` asks `rank_pools` what Place will do once a waiting job's patience
is spent. The decisions that change a job (`plan_place`, `plan_standby`, `plan_recovery`, `count_attempt`,
`forget_preference`) change the `Job` they are given, as a step does inside its conditional write
(`spotrelay.control.jobs.update_job`, which calls them again on a fresh read after a conflict), and return
the step's result; the others only answer.

- **Place**: `rank_pools` is `place()` for the job with the market as seen (`MarketSeen`: the spot quotes
  of its launchable types in the deployment's zones, the pools' blocks and interruption record); `plan_place`
  turns the ranking into the step's answer: launch (the best PLAN_DEPTH pools, the preferred one first), wait
  (`place_wait_seconds`, or `throttled_wait_seconds` after a throttled launch), or give up once the job's
  patience (`patience_hours`) is spent.
- **Launch**: `launch_order` is the plan's pools Launch tries, in order; a refused one is blocked for every
  job (`refusal_block`) and, if it was the job's preferred pool, the preference is forgotten
  (`forget_preference`); a launch counts on the job (`count_attempt`).
- **Recover**: `plan_recovery` accounts the ended attempt and asks the job's recovery strategy
  (spotrelay.policy.recovery): relaunch, with pools to block and one to prefer, or fail.
- **Reconcile** (back to spot): `standby_pools` is where a job on on-demand that the market choice sends
  back to spot launches its standby; its other decisions (orphans, instances gone, the budget, a
  standby's supervision) are in `reconciling`.
- **Finalize** (and reconcile's repair of a job whose execution ended first): `ending`.

Modules: `placing` (Place, Launch, Recover, the move back's pools), `ending`, `reconciling`; every public
name of each is here too.
"""

from spotrelay.control.decisions.ending import (
    FinalOutcome,
    closing_outcome,
    end_job,
    execution_ended_reason,
    final_outcome,
    instances_to_terminate,
    keep_failed_until,
)
from spotrelay.control.decisions.placing import (
    MAX_FAILURE_REASON_CHARS,
    MIN_WAIT_SECONDS,
    PLAN_DEPTH,
    REFUSED_POOL_BLOCK_MINUTES,
    SPOT_NOTICE,
    STANDBY_POOLS_TRIED,
    THROTTLED_NOTE,
    THROTTLED_WAIT_MAX_SECONDS,
    THROTTLED_WAIT_MIN_SECONDS,
    WAIT_BASE_SECONDS,
    WAIT_MAX_SECONDS,
    MarketSeen,
    Recovery,
    StepResult,
    blocked_for,
    catalog_on_demand_prices,
    count_attempt,
    forget_preference,
    launch_order,
    launch_throttled,
    launchable_types,
    one_line,
    patience_hours,
    patience_spent,
    place_wait_seconds,
    plan_place,
    plan_reclaim_wait,
    plan_recovery,
    plan_standby,
    rank_pools,
    reclaim_ends,
    refusal_block,
    standby_pools,
    throttled_wait_seconds,
    waiting_on_throttling,
    warning_block,
)
from spotrelay.control.decisions.reconciling import (
    GONE_STATES,
    STANDBY_BOOT_SECONDS,
    STANDBY_HANDOVER_SECONDS,
    STANDBY_RETRY_SECONDS,
    AskHandover,
    DropStandby,
    Untracked,
    bill_overdue,
    billing_ends_by,
    budget_cause,
    handover_seconds,
    instance_gone,
    moves_back_considered,
    over_budget,
    runs_on_demand,
    standby_retry_at,
    supervise_standby,
    untracked_instance,
)

__all__ = [
    "GONE_STATES",
    "MAX_FAILURE_REASON_CHARS",
    "MIN_WAIT_SECONDS",
    "PLAN_DEPTH",
    "REFUSED_POOL_BLOCK_MINUTES",
    "SPOT_NOTICE",
    "STANDBY_BOOT_SECONDS",
    "STANDBY_HANDOVER_SECONDS",
    "STANDBY_POOLS_TRIED",
    "STANDBY_RETRY_SECONDS",
    "THROTTLED_NOTE",
    "THROTTLED_WAIT_MAX_SECONDS",
    "THROTTLED_WAIT_MIN_SECONDS",
    "WAIT_BASE_SECONDS",
    "WAIT_MAX_SECONDS",
    "AskHandover",
    "DropStandby",
    "FinalOutcome",
    "MarketSeen",
    "Recovery",
    "StepResult",
    "Untracked",
    "bill_overdue",
    "billing_ends_by",
    "blocked_for",
    "budget_cause",
    "catalog_on_demand_prices",
    "closing_outcome",
    "count_attempt",
    "end_job",
    "execution_ended_reason",
    "final_outcome",
    "forget_preference",
    "handover_seconds",
    "instance_gone",
    "instances_to_terminate",
    "keep_failed_until",
    "launch_order",
    "launch_throttled",
    "launchable_types",
    "moves_back_considered",
    "one_line",
    "over_budget",
    "patience_hours",
    "patience_spent",
    "place_wait_seconds",
    "plan_place",
    "plan_reclaim_wait",
    "plan_recovery",
    "plan_standby",
    "rank_pools",
    "reclaim_ends",
    "refusal_block",
    "runs_on_demand",
    "standby_pools",
    "standby_retry_at",
    "supervise_standby",
    "throttled_wait_seconds",
    "untracked_instance",
    "waiting_on_throttling",
    "warning_block",
]
