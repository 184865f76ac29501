"""Deadline-aware market choice: spot while the deadline's slack allows, on-demand when it no longer does.

The rules are Uniform Progress from "Can't Be Late: Optimizing Spot Instance Savings under Deadlines"
(Wu et al., NSDI'24, https://www.usenix.org/conference/nsdi24/presentation/wu-zhanghao), written from
the paper's description. With W the total work, D the deadline, t the time since submission, d the
restart overhead, cp(t) the progress made and ep(t) = W * t / D the progress of a job that advanced
uniformly to finish exactly at D:
  1. Uniform progress: when idle and cp(t) < ep(t), use on-demand to catch up.
  2. Taking risks: use spot whenever it is available, even when behind; stay on it until preempted.
  3. Hysteresis: on on-demand, stay until cp(t) >= ep(t + 2d).
  4. Safety net: when idle and the time left R(t) < C(t) + 2d (C the remaining run time on
     on-demand), use on-demand until the end.
Work is counted in reference-GPU hours; run time on a concrete pool divides by its relative speed.

Rule 3, refined (spotrelay's, not the paper's): on on-demand and behind ep(t + 2d), the job also goes back
to spot when the caller expects a spot run there to pay for the switch (`spot_run_pays_off`, computed by
`spotrelay.policy.placement.spot_run_pays_off` from the job's own interrupted runs in the pool, or the
pool's interruption rate: a run of T hours costs T x spot, makes (T - d)+ of progress, and the shortfall is
bought back on on-demand at worst). The paper's rule keeps it on on-demand until it has caught up, which
takes (work behind) / (1 - W/D) hours: 13 h of on-demand per hour of work behind for 48 h of work due in
52 h, on-demand all along while spot may be there. The safety net (rule 4) still comes first, so the
deadline guarantee is the paper's. On the Can't Be Late traces this costs less per job than the paper's
rule (`make bench`).

Rule 1, with a band (spotrelay's, not the paper's): an idle job with no spot catches up on on-demand only
once it is behind the uniform line by more than a band of time, b = c x (1 - u) x S, and waits for spot
within it, as a job ahead of the line does. u = W / (k D) is the share of the deadline the work needs on
on-demand (k its speed); S = (1 - cp / W) x (D - W / k) is the slack the job would have on the line at its
progress (every hour behind the line costs an hour of it); c = `CATCH_UP_BAND_SHARE` = 1. (1 - u) is the
share of an on-demand hour that gains on the line: a job with a tight deadline (u near 1: catching up an
hour of time behind takes u / (1 - u) hours of on-demand) gets a band of minutes, one with room to spare
may spend part of it waiting for spot, and the band shrinks with the slack as the work gets done, so the
safety net (at slack 2d) is reached only after the band is crossed, except in the job's last stretch. The
paper's rule fires at any deficit: a job a minute behind, after a spot start lost in its overhead, pays an
on-demand start and stays on on-demand until it is two restarts ahead (rule 3), though spot is back
minutes later (the fleet's p3.16xlarge pools). The safety net is untouched, so the deadline guarantee is
the paper's. Of c = 0, 0.75, 1 and 1.5, each replayed by `make bench` ($/job), c = 1 (the band's natural
scale, no constant of its own) is the cheapest on the single-zone Can't Be Late jobs and close to the
cheapest on the fleet and multi-zone workloads.

Rule 1 pays off only together with rule 3: on-demand is worth its price to catch up for a while, and the
job goes back to spot once it is ahead again. A caller that cannot move a running job from on-demand back
to spot (spotrelay's control plane never re-places a running job) would turn rule 1 into "on-demand
until the end" the first time an idle job is behind with no spot — at its start when no pool has
capacity, or after a preemption — which on the benchmark's traces costs far more than waiting (greedy).
Such a caller passes `returns_to_spot=False`: an idle job behind the uniform line with no spot then waits
for spot instead, and rule 4 alone guards the deadline: it fires while on-demand can still finish (at
time left = on-demand run + 2d, one restart of slack remains beyond the on-demand start's own), the same
guarantee as with rule 1 — provided the caller asks again by the time the net is due: one that sleeps
past it by more than d loses it. Waiting is what the job would do ahead of the line anyway; what it
gives up is only rule 1's early catching-up, which without rule 3 buys no spot later.
`returns_to_spot=True` (the default) is the paper's policy.

Work at risk. The paper's guarantee assumes a preemption loses no work. A job that does not save its
state at the notice (it saves only every `checkpoint.interval_minutes`) loses up to that interval of
work when preempted, which comes out of the slack the net keeps: preempted just outside the net, not
even on-demand finishes in time. The caller passes that interval as `work_at_risk_hours`
(`spotrelay.policy.placement.work_at_risk_hours`), and the net keeps it on top of the two restarts: a
spot (re)start is made only while time left >= on-demand run + 2d + work at risk, so a preemption at
the worst moment still leaves one restart's slack to finish on on-demand. 0 (the default) is the
paper's net.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from spotrelay.models import Market

# c of rule 1's band (module docstring): behind the line by more than c x (1 - u) x S, an idle job catches up.
CATCH_UP_BAND_SHARE = 1.0


class MarketAction(StrEnum):
    SPOT = "spot"  # place on spot
    ON_DEMAND = "on-demand"  # place on on-demand
    WAIT = "wait"  # stay idle: no spot now, and the slack allows waiting for it


class MarketDecision(BaseModel):
    model_config = ConfigDict(frozen=True)

    action: MarketAction
    reason: str
    slack_hours: float | None = None  # time left minus on-demand run time; None without a deadline
    # The slack at which the safety net fires (2 restarts + the work at risk); None: no net applies.
    net_margin_hours: float | None = None
    # WAIT within rule 1's band: behind the line, no spot, and on-demand would be chosen without the band.
    within_band: bool = False

    @property
    def hours_to_safety_net(self) -> float | None:
        """How long an idle job may wait before the safety net is due (<= 0: it is due now)."""
        if self.slack_hours is None or self.net_margin_hours is None:
            return None
        return self.slack_hours - self.net_margin_hours

    @property
    def markets(self) -> frozenset[Market]:
        return {
            MarketAction.SPOT: frozenset({Market.SPOT}),
            MarketAction.ON_DEMAND: frozenset({Market.ON_DEMAND}),
            MarketAction.WAIT: frozenset(),
        }[self.action]


def uniform_progress(
    *,
    total_work_hours: float | None,
    work_done_hours: float,
    deadline_hours: float | None,
    elapsed_hours: float,
    on_demand_run_hours: float | None,
    restart_overhead_hours: float,
    spot_available: bool,
    on_demand_allowed: bool,
    current: Market | None = None,
    returns_to_spot: bool = True,
    work_at_risk_hours: float = 0.0,
    spot_run_pays_off: bool = False,
    catch_up_band_share: float = 0.0,
    out_of_patience: bool = False,
) -> MarketDecision:
    """Which market to run on now. `current` is the job's market if it runs, None if it is idle.

    `on_demand_run_hours` is the run time of the remaining work on the on-demand type the job would
    get (None: no on-demand type fits or none has a price). `spot_run_pays_off`: a job on on-demand behind
    the line goes back to spot too (rule 3, refined: module docstring). `catch_up_band_share`: c of rule 1's
    band (module docstring; 0, the default, is the paper's rule 1). `returns_to_spot`: whether the caller asks
    again while the job runs on on-demand and moves it back to spot when rule 3 says so; when False, an
    idle job behind the uniform line with no spot waits for spot (until the safety net) instead of
    starting an on-demand run it could never leave (module docstring). `out_of_patience` (with
    `returns_to_spot`): the idle job has waited its `limits.max_wait_hours` for a launch; with no spot it
    goes on-demand wherever it is against the line, rather than fail with NoCapacity while on-demand could
    run it, and back to spot by rule 3.
    """
    if deadline_hours is None or total_work_hours is None:
        return _spot_or_wait(spot_available, "no deadline (or no work estimate): spot only", None)
    time_left = deadline_hours - elapsed_hours
    slack = None if on_demand_run_hours is None else time_left - on_demand_run_hours
    if not on_demand_allowed:
        return _spot_or_wait(spot_available, "on_demand_fallback is off: spot only", slack)
    if on_demand_run_hours is None or slack is None:
        return _spot_or_wait(spot_available, "no on-demand type fits within the price cap: spot only", slack)
    progress = work_done_hours
    margin = safety_net_margin_hours(restart_overhead_hours, work_at_risk_hours)
    expected = total_work_hours * min(1.0, elapsed_hours / deadline_hours)

    def decided(action: MarketAction, reason: str, within_band: bool = False) -> MarketDecision:
        return MarketDecision(
            action=action, reason=reason, slack_hours=slack, net_margin_hours=margin, within_band=within_band
        )

    if current is Market.SPOT:
        # Rule 2, second half: a job running on spot stays there until it is preempted.
        return decided(MarketAction.SPOT, "on spot: stay until preempted")
    # Rule 4: the safety net. Also once we are on on-demand inside the net, stay there.
    if time_left < on_demand_run_hours + margin:
        at_risk = f" + {work_at_risk_hours:.2f} h of work at risk" if work_at_risk_hours > 0 else ""
        return decided(
            MarketAction.ON_DEMAND,
            (
                f"safety net: {time_left:.2f} h left, on-demand needs {on_demand_run_hours:.2f} h "
                f"+ 2 x {restart_overhead_hours:.2f} h restart{at_risk}; on-demand until the end"
            ),
        )
    if current is Market.ON_DEMAND:
        # Rule 3: hysteresis.
        ahead_of = total_work_hours * min(1.0, (elapsed_hours + 2 * restart_overhead_hours) / deadline_hours)
        if progress >= ahead_of and spot_available:
            return decided(
                MarketAction.SPOT,
                f"progress {progress:.2f} h >= {ahead_of:.2f} h (uniform line + 2 restarts): back to spot",
            )
        if spot_available and spot_run_pays_off:
            return decided(
                MarketAction.SPOT,
                (
                    f"progress {progress:.2f} h < {ahead_of:.2f} h, but a spot run there is expected to pay for "
                    "the switch: back to spot"
                ),
            )
        return decided(
            MarketAction.ON_DEMAND,
            f"hysteresis: stay on on-demand until progress reaches {ahead_of:.2f} h",
        )
    if spot_available:
        # Rule 2: taking risks.
        return decided(
            MarketAction.SPOT,
            f"spot available; slack {slack:.2f} h of {deadline_hours:g} h allows it",
        )
    if progress < expected and not returns_to_spot:
        # Rule 1 without rule 3 would be on-demand for good: wait for spot; the safety net guards the deadline.
        return decided(
            MarketAction.WAIT,
            (
                f"no spot now; behind schedule (progress {progress:.2f} h < {expected:.2f} h), but an on-demand "
                "run would not return to spot: wait for spot until the safety net"
            ),
        )
    if out_of_patience and returns_to_spot:
        return decided(
            MarketAction.ON_DEMAND,
            (
                "no spot, and the job has waited its max_wait_hours for a launch: on-demand (back to spot when "
                "it is ahead of the line and spot is there)"
            ),
        )
    if progress < expected:
        # Rule 1: behind the uniform line while idle, by more than the band (0: at any deficit, as the paper).
        band = catch_up_band_hours(total_work_hours, deadline_hours, on_demand_run_hours, progress, catch_up_band_share)
        behind_hours = elapsed_hours - progress * deadline_hours / total_work_hours  # of time, behind the line
        if band <= 0 or behind_hours > band:
            beyond = f", {behind_hours:.2f} h behind the line, beyond the {band:.2f} h band" if band > 0 else ""
            return decided(
                MarketAction.ON_DEMAND,
                f"no spot and behind schedule (progress {progress:.2f} h < {expected:.2f} h{beyond}): on-demand",
            )
        return decided(
            MarketAction.WAIT,
            (
                f"no spot now; behind schedule (progress {progress:.2f} h < {expected:.2f} h) by {behind_hours:.2f} h, "
                f"within the {band:.2f} h band: wait for spot"
            ),
            within_band=True,
        )
    return decided(
        MarketAction.WAIT,
        f"no spot now; ahead of schedule (progress {progress:.2f} h >= {expected:.2f} h), wait for spot",
    )


def catch_up_band_hours(
    total_work_hours: float,
    deadline_hours: float,
    on_demand_run_hours: float,
    work_done_hours: float,
    share: float,
) -> float:
    """Rule 1's band (module docstring), in hours of time: c x (1 - u) x S, u = W / (k D) with k the
    on-demand speed (the remaining work over its on-demand run time), S = (1 - cp / W) x (D - W / k) the
    slack on the line at the job's progress; 0 when c is 0, the work is done, or it fits no deadline."""
    remaining = total_work_hours - work_done_hours
    if share <= 0 or deadline_hours <= 0 or remaining <= 0 or on_demand_run_hours <= 0:
        return 0.0
    speed = remaining / on_demand_run_hours
    spare = max(0.0, 1 - total_work_hours / (speed * deadline_hours))  # 1 - u
    slack_on_the_line = remaining / total_work_hours * spare * deadline_hours
    return share * spare * slack_on_the_line


def safety_net_margin_hours(restart_overhead_hours: float, work_at_risk_hours: float = 0.0) -> float:
    """The slack the safety net keeps: two restart overheads (the paper's) plus the work at risk."""
    return 2 * restart_overhead_hours + work_at_risk_hours


def _spot_or_wait(spot_available: bool, why: str, slack: float | None) -> MarketDecision:
    if spot_available:
        return MarketDecision(action=MarketAction.SPOT, reason=why, slack_hours=slack)
    return MarketDecision(action=MarketAction.WAIT, reason=f"{why}; no spot pool now, wait", slack_hours=slack)
