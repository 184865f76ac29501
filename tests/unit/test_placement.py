"""Placement: which pool a job goes to, which pools are ruled out and why, and how it explains itself."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import spotrelay.policy.placement as placement_module
from spotrelay.catalog import GPU_MODELS, INSTANCE_TYPES, relative_speed
from spotrelay.models import Attempt, AttemptOutcome, JobSpec, Market, Pool, PriceQuote, ResourcesSpec, parse_job_spec
from spotrelay.policy import (
    DEFAULT_RESTART_OVERHEAD_HOURS,
    InterruptionModel,
    MarketAction,
    MarketDecision,
    Placement,
    PoolObservation,
    band_hourly_rate,
    latest_quotes,
    market_choice,
    place,
)

ZONE_A = "us-east-1a"
ZONE_B = "us-east-1b"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def job_spec(**fields: Any) -> JobSpec:
    """A 1-GPU job with every other field at its default unless given."""
    data: dict[str, Any] = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}
    data.update(fields)
    return parse_job_spec(data)


def spot_pool(instance_type: str, zone: str = ZONE_A) -> Pool:
    return Pool(instance_type=instance_type, availability_zone=zone, market=Market.SPOT)


def quote(instance_type: str, zone: str, price: float, at: datetime | None = None) -> PriceQuote:
    return PriceQuote(pool=spot_pool(instance_type, zone), usd_per_hour=price, timestamp=at)


def ranked_pools(placement: Placement) -> list[Pool]:
    return [r.pool for r in placement.ranked]


def rejection_of(placement: Placement, pool: Pool) -> tuple[str, str]:
    matches = [(r.category, r.reason) for r in placement.rejected if r.pool == pool]
    assert len(matches) == 1, f"{pool} rejected {len(matches)} times: {placement.rejected}"
    return matches[0]


# --- ranking -----------------------------------------------------------------------------------------


def test_with_equal_speeds_the_cheapest_hourly_price_wins() -> None:
    # Given three pools of L4 types (same GPU, same speed, same default Advisor band) at different prices
    spec = job_spec(work_hours=10)
    quotes = [
        quote("g6.2xlarge", ZONE_A, 0.40),
        quote("g6.xlarge", ZONE_B, 0.35),
        quote("g6.xlarge", ZONE_A, 0.30),
    ]
    # When the job is placed
    placement = place(spec, quotes)
    # Then they are ranked by hourly price, cheapest first, all on spot
    assert ranked_pools(placement) == [
        spot_pool("g6.xlarge", ZONE_A),
        spot_pool("g6.xlarge", ZONE_B),
        spot_pool("g6.2xlarge", ZONE_A),
    ]
    assert placement.market.action is MarketAction.SPOT
    assert placement.rejected == ()


def test_expected_cost_to_finish_follows_the_documented_formula() -> None:
    # Given a 10 h job, an L4 spot pool at $0.30/h and an Advisor band of 2 for that type
    spec = job_spec(work_hours=10, checkpoint={"interval_minutes": 30})
    model = InterruptionModel(bands={"g6.xlarge": 2})
    # When it is placed
    best = place(spec, [quote("g6.xlarge", ZONE_A, 0.30)], interruptions=model).best
    # Then cost = price x (run + interruptions x (restart + half a checkpoint interval))
    assert best is not None
    run_hours = 10 / GPU_MODELS["L4"].relative_speed
    interruptions = band_hourly_rate(2) * run_hours
    expected = 0.30 * (run_hours + interruptions * (DEFAULT_RESTART_OVERHEAD_HOURS + 0.25))
    assert best.run_hours == pytest.approx(run_hours)
    assert best.expected_interruptions == pytest.approx(interruptions)
    assert best.expected_cost_to_finish == pytest.approx(expected)


def test_the_specs_restart_overhead_is_used_when_no_override_is_given() -> None:
    # Given a 10 h job whose spec says a restart takes 12 min (0.2 h), and the same Advisor band as above
    spec = job_spec(work_hours=10, checkpoint={"interval_minutes": 30}, placement={"restart_overhead_minutes": 12})
    model = InterruptionModel(bands={"g6.xlarge": 2})
    # When it is placed without a restart overhead
    best = place(spec, [quote("g6.xlarge", ZONE_A, 0.30)], interruptions=model).best
    # Then each expected interruption costs the spec's 0.2 h of restart, not the default 0.1 h
    assert best is not None
    run_hours = 10 / GPU_MODELS["L4"].relative_speed
    interruptions = band_hourly_rate(2) * run_hours
    assert best.expected_cost_to_finish == pytest.approx(0.30 * (run_hours + interruptions * (0.2 + 0.25)))


def test_the_specs_restart_overhead_decides_whether_a_pool_can_start_in_time() -> None:
    # Given 10 h of work due in 10.05 h on a V100 pool (10 h once started), and a spot-only job that restarts
    # in 2 min
    spec = job_spec(
        work_hours=10,
        limits={"deadline_hours": 10.05, "on_demand_fallback": False},
        placement={"restart_overhead_minutes": 2},
    )
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    # When it is placed at submission
    placement = place(spec, [v100])
    # Then the pool is ranked: it starts in 0.033 h and finishes before the deadline
    assert ranked_pools(placement) == [v100.pool]


def test_an_explicit_restart_overhead_overrides_the_specs() -> None:
    # Given the same job, whose spec says 2 min
    spec = job_spec(work_hours=10, limits={"deadline_hours": 10.05}, placement={"restart_overhead_minutes": 2})
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    # When the caller says a restart takes 0.1 h
    placement = place(spec, [v100], restart_overhead_hours=0.1)
    # Then the caller's figure wins: launched now the pool finishes at 10.1 h, after the deadline
    assert placement.ranked == ()
    category, reason = rejection_of(placement, v100.pool)
    assert category == "deadline"
    assert "+ 0.1 h to start" in reason


def test_a_faster_gpu_at_a_higher_hourly_price_wins_when_it_finishes_cheaper() -> None:
    # Given a T4 pool at $0.20/h (19.2 h for 10 h of work) and an L40S pool at $0.50/h (3.5 h)
    spec = job_spec(work_hours=10)
    quotes = [quote("g4dn.xlarge", ZONE_A, 0.20), quote("g6e.xlarge", ZONE_A, 0.50)]
    # When placed on the default objective (cost to finish)
    placement = place(spec, quotes)
    # Then the L40S comes first although its hourly price is higher, because it finishes cheaper
    assert ranked_pools(placement) == [spot_pool("g6e.xlarge"), spot_pool("g4dn.xlarge")]
    first, second = placement.ranked
    assert first.hourly_price > second.hourly_price
    assert first.expected_cost_to_finish < second.expected_cost_to_finish


def test_the_hourly_objective_ranks_by_hourly_price_alone() -> None:
    # Given the same two pools, but a job that asks for the cheapest hourly price
    spec = job_spec(work_hours=10, placement={"objective": "hourly"})
    quotes = [quote("g4dn.xlarge", ZONE_A, 0.20), quote("g6e.xlarge", ZONE_A, 0.50)]
    # When placed
    placement = place(spec, quotes)
    # Then the slower but cheaper-per-hour T4 wins
    assert ranked_pools(placement) == [spot_pool("g4dn.xlarge"), spot_pool("g6e.xlarge")]
    assert placement.ranked[0].expected_cost_to_finish > placement.ranked[1].expected_cost_to_finish


# --- rejections --------------------------------------------------------------------------------------


def test_a_pool_above_max_price_per_hour_is_rejected_and_one_at_the_cap_is_not() -> None:
    # Given a cap of $0.50/h, one pool above it and one exactly at it
    spec = job_spec(limits={"max_price_per_hour": 0.5})
    quotes = [quote("g6.xlarge", ZONE_A, 0.51), quote("g6.xlarge", ZONE_B, 0.50)]
    # When placed
    placement = place(spec, quotes)
    # Then the pool above the cap is rejected with a reason that names the cap; the other is ranked
    assert ranked_pools(placement) == [spot_pool("g6.xlarge", ZONE_B)]
    category, reason = rejection_of(placement, spot_pool("g6.xlarge", ZONE_A))
    assert category == "price-cap"
    assert "max_price_per_hour" in reason
    assert "0.5100" in reason


def test_a_blocked_pool_is_rejected_while_the_same_type_in_another_zone_is_ranked() -> None:
    # Given the cheapest pool is blocked after a recent loss
    spec = job_spec()
    quotes = [quote("g6.xlarge", ZONE_A, 0.30), quote("g6.xlarge", ZONE_B, 0.40)]
    # When placed
    placement = place(spec, quotes, blocked=[spot_pool("g6.xlarge", ZONE_A)])
    # Then the blocked pool is rejected as blocked and the other zone is chosen
    assert ranked_pools(placement) == [spot_pool("g6.xlarge", ZONE_B)]
    category, reason = rejection_of(placement, spot_pool("g6.xlarge", ZONE_A))
    assert category == "blocked"
    assert "blocked" in reason


def test_an_instance_type_not_in_the_catalog_is_rejected() -> None:
    # Given a quote for a type with no GPU in the catalog
    spec = job_spec()
    quotes = [quote("m5.large", ZONE_A, 0.01), quote("g6.xlarge", ZONE_A, 0.30)]
    # When placed
    placement = place(spec, quotes)
    # Then it is rejected as an unknown type, however cheap
    assert ranked_pools(placement) == [spot_pool("g6.xlarge")]
    category, reason = rejection_of(placement, spot_pool("m5.large"))
    assert category == "unknown-type"
    assert "not a GPU instance type" in reason


@pytest.mark.parametrize(
    ("resources", "misfit_type", "fitting_type", "reason_part"),
    [
        pytest.param({"gpus": 1, "gpu_models": ["L4"]}, "g5.xlarge", "g6.xlarge", "A10G not in gpu_models", id="model"),
        pytest.param({"gpus": 4}, "g6.xlarge", "g6.12xlarge", "1 GPU(s) < 4 requested", id="gpu-count"),
        pytest.param({"gpus": 1, "gpu_memory_gib": 40}, "g6.xlarge", "g6e.xlarge", "24 GiB per GPU < 40", id="memory"),
    ],
)
def test_a_type_that_does_not_fit_the_job_is_rejected_with_its_reason(
    resources: dict[str, Any], misfit_type: str, fitting_type: str, reason_part: str
) -> None:
    # Given a job whose resources one quoted type cannot satisfy and another can, at a quarter of its
    # on-demand price but dearer than the misfit
    spec = job_spec(resources=resources)
    on_demand_price = INSTANCE_TYPES[fitting_type].on_demand_usd_per_hour
    assert on_demand_price is not None
    fitting_price = on_demand_price / 4
    quotes = [quote(misfit_type, ZONE_A, 0.10), quote(fitting_type, ZONE_A, fitting_price)]
    # When placed
    placement = place(spec, quotes)
    # Then the misfit is rejected, saying what does not fit, and the fitting type is ranked
    assert ranked_pools(placement) == [spot_pool(fitting_type)]
    category, reason = rejection_of(placement, spot_pool(misfit_type))
    assert category == "misfit"
    assert reason_part in reason


def test_only_the_latest_quote_of_a_pool_counts() -> None:
    # Given a pool quoted twice: cheap an hour ago, dear now (given newest first), and another pool in between
    spec = job_spec()
    quotes = [
        quote("g6.xlarge", ZONE_A, 0.45, at=T0),
        quote("g6.xlarge", ZONE_B, 0.30, at=T0),
        quote("g6.xlarge", ZONE_A, 0.10, at=T0 - timedelta(hours=1)),
    ]
    # When the quotes are reduced and the job placed
    latest = latest_quotes(quotes)
    placement = place(spec, quotes)
    # Then the pool's current (latest) price is the one that counts, wherever it came in the input
    assert latest[spot_pool("g6.xlarge", ZONE_A)].usd_per_hour == 0.45
    assert len(latest) == 2
    assert ranked_pools(placement) == [spot_pool("g6.xlarge", ZONE_B), spot_pool("g6.xlarge", ZONE_A)]
    assert placement.ranked[1].hourly_price == 0.45


def test_untimed_quotes_of_a_pool_keep_the_last_one_given() -> None:
    # Given two untimed quotes of one pool
    quotes = [quote("g6.xlarge", ZONE_A, 0.10), quote("g6.xlarge", ZONE_A, 0.20)]
    # When reduced
    latest = latest_quotes(quotes)
    # Then the last one given counts
    assert latest == {spot_pool("g6.xlarge"): quotes[1]}


def test_a_pool_whose_expected_cost_exceeds_the_budget_left_is_rejected() -> None:
    # Given a 10 h job, an L4 pool (about $3.10 to finish) and an L40S pool (about $1.73), and $2 left
    spec = job_spec(work_hours=10)
    quotes = [quote("g6.xlarge", ZONE_A, 0.30), quote("g6e.xlarge", ZONE_A, 0.50)]
    # When placed with that budget
    placement = place(spec, quotes, budget_left_usd=2.0)
    # Then only the pool that fits the budget is ranked; the other is rejected for the budget
    assert ranked_pools(placement) == [spot_pool("g6e.xlarge")]
    assert placement.ranked[0].expected_cost_to_finish <= 2.0
    category, reason = rejection_of(placement, spot_pool("g6.xlarge"))
    assert category == "budget"
    assert "2.00 budget left" in reason


def test_a_pool_that_cannot_finish_before_the_deadline_is_rejected() -> None:
    # Given 10 h of work due in 5 h: an L4 needs 10.3 h, an L40S 3.5 h
    spec = job_spec(work_hours=10, limits={"deadline_hours": 5})
    quotes = [quote("g6.xlarge", ZONE_A, 0.30), quote("g6e.xlarge", ZONE_A, 0.50)]
    # When placed at submission
    placement = place(spec, quotes)
    # Then the L4 pool is rejected for the deadline and the L40S pool runs on spot
    assert placement.market.action is MarketAction.SPOT
    assert ranked_pools(placement) == [spot_pool("g6e.xlarge")]
    category, reason = rejection_of(placement, spot_pool("g6.xlarge"))
    assert category == "deadline"
    assert "5.00 h left" in reason


def test_a_pool_that_would_finish_only_without_its_launch_overhead_is_rejected_for_the_deadline() -> None:
    # Given 10 h of work due in 10.05 h, and a V100 spot pool that runs it in exactly 10 h once started;
    # starting it (boot, image pull, restore) takes the restart overhead, 0.1 h by default
    spec = job_spec(work_hours=10, limits={"deadline_hours": 10.05})
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    # When the job is placed at submission
    placement = place(spec, [v100])
    # Then the V100 pool is rejected: launched now it finishes at 10.1 h even if never interrupted
    assert placement.ranked == ()
    category, _ = rejection_of(placement, v100.pool)
    assert category == "deadline"


def test_work_done_shortens_the_remaining_run() -> None:
    # Given a 10 h V100 job of which 8 h are checkpointed
    spec = job_spec(work_hours=10, resources={"gpus": 1, "gpu_models": ["V100"]})
    # When placed
    placement = place(spec, [quote("p3.2xlarge", ZONE_A, 1.0)], work_done_hours=8)
    # Then 2 h of reference-GPU work remain, which a V100 runs in 2 h
    assert placement.remaining_work_hours == 2
    assert placement.ranked[0].run_hours == pytest.approx(2)


# --- interruptions -----------------------------------------------------------------------------------


def test_a_worse_advisor_band_ranks_below_an_equally_priced_better_band() -> None:
    # Given two L4 types at the same price; the name tie-break alone would put g6.2xlarge first
    spec = job_spec(work_hours=10)
    quotes = [quote("g6.2xlarge", ZONE_A, 0.40), quote("g6.xlarge", ZONE_A, 0.40)]
    model = InterruptionModel(bands={"g6.2xlarge": 4, "g6.xlarge": 0})
    # When placed with Advisor bands that make g6.2xlarge the most interrupted
    placement = place(spec, quotes, interruptions=model)
    # Then the better band wins on expected cost to finish
    assert ranked_pools(placement) == [spot_pool("g6.xlarge"), spot_pool("g6.2xlarge")]
    better, worse = placement.ranked
    assert worse.expected_interruptions > better.expected_interruptions
    assert worse.expected_cost_to_finish > better.expected_cost_to_finish
    assert ">20%" in worse.interruption_basis


def test_observed_interruptions_raise_a_pools_rate_and_push_it_down_the_ranking() -> None:
    # Given one type priced equally in two zones; zone A wins the name tie-break without observations
    spec = job_spec(work_hours=10)
    quotes = [quote("g6.xlarge", ZONE_A, 0.40), quote("g6.xlarge", ZONE_B, 0.40)]
    assert ranked_pools(place(spec, quotes))[0] == spot_pool("g6.xlarge", ZONE_A)
    seen = {"g6.xlarge:us-east-1a": PoolObservation(interruptions=5, instance_hours=10)}
    model = InterruptionModel(observed=seen)
    # When we have seen 5 interruptions in 10 instance-hours in zone A
    placement = place(spec, quotes, interruptions=model)
    # Then zone A's rate is above the Advisor prior, and zone B now ranks first
    assert model.hourly_rate(spot_pool("g6.xlarge", ZONE_A)) > model.hourly_rate(spot_pool("g6.xlarge", ZONE_B))
    assert model.hourly_rate(spot_pool("g6.xlarge", ZONE_B)) == band_hourly_rate(1)
    assert ranked_pools(placement) == [spot_pool("g6.xlarge", ZONE_B), spot_pool("g6.xlarge", ZONE_A)]
    assert "sharpened by 5 interruption(s)" in placement.ranked[1].interruption_basis


# --- the market: spot or on-demand -------------------------------------------------------------------


def test_with_the_deadline_nearly_spent_only_on_demand_pools_are_ranked_at_catalog_prices() -> None:
    # Given 10 h of work due at 12 h, 8.4 h elapsed: 3.6 h left, less than on-demand L40S's 3.45 h + 2 restarts
    spec = job_spec(work_hours=10, limits={"deadline_hours": 12})
    quotes = [quote("g6e.xlarge", ZONE_A, 0.50), quote("g6.xlarge", ZONE_B, 0.30)]
    # When placed now
    placement = place(spec, quotes, elapsed_hours=8.4)
    # Then the safety net puts the job on on-demand, ranks only on-demand pools, priced from the catalog,
    # in the zones we have quotes for
    assert placement.market.action is MarketAction.ON_DEMAND
    assert "safety net" in placement.market.reason
    assert placement.ranked
    for r in placement.ranked:
        assert r.pool.market is Market.ON_DEMAND
        assert r.pool.availability_zone in {ZONE_A, ZONE_B}
        assert r.hourly_price == INSTANCE_TYPES[r.pool.instance_type].on_demand_usd_per_hour
        assert r.run_hours <= 3.6
        assert r.expected_interruptions == 0
    best = placement.best
    assert best is not None
    assert best.pool.instance_type == "g6e.xlarge"
    # and the spot pool that could still run is rejected because of the market, not dropped
    category, _ = rejection_of(placement, spot_pool("g6e.xlarge", ZONE_A))
    assert category == "market"


def behind_with_no_spot(**kwargs: Any) -> Placement:
    """10 h of work due at 20 h, 3 h done at 10 h (the uniform line is at 5 h: 4 h of time behind it, beyond
    rule 1's 3.27 h band on an L4), far from the safety net; the only spot pool is blocked."""
    spec = job_spec(work_hours=10, limits={"deadline_hours": 20}, resources={"gpus": 1, "gpu_models": ["L4"]})
    quotes = [quote("g6.xlarge", ZONE_A, 0.30)]
    return place(spec, quotes, work_done_hours=3, elapsed_hours=10, blocked=[spot_pool("g6.xlarge", ZONE_A)], **kwargs)


def test_an_idle_job_behind_schedule_with_no_spot_waits_when_the_caller_does_not_migrate() -> None:
    # Given an idle job behind schedule with no spot pool, placed as the control plane does (no migrates)
    # When placed
    placement = behind_with_no_spot()
    # Then it waits for spot: an on-demand run now would never come back to spot
    assert placement.market.action is MarketAction.WAIT
    assert "until the safety net" in placement.market.reason
    assert placement.ranked == ()


def test_an_idle_job_behind_schedule_with_no_spot_catches_up_on_demand_when_the_caller_migrates() -> None:
    # Given the same job, placed by a caller that moves on-demand jobs back to spot
    # When placed
    placement = behind_with_no_spot(migrates=True)
    # Then it goes on-demand to catch up (Uniform Progress's rule 1), in the zone that has a quote
    assert placement.market.action is MarketAction.ON_DEMAND
    assert "behind schedule" in placement.market.reason
    assert placement.ranked
    assert {r.pool.market for r in placement.ranked} == {Market.ON_DEMAND}
    assert {r.pool.availability_zone for r in placement.ranked} == {ZONE_A}


def test_an_idle_job_a_little_behind_schedule_with_no_spot_waits_within_rule_1s_band() -> None:
    # Given the same job 1 h of time behind the line instead of 4 (4.5 h done at 10 h; rule 1's band is 2.57 h
    # on an L4 on-demand instance)
    spec = job_spec(work_hours=10, limits={"deadline_hours": 20}, resources={"gpus": 1, "gpu_models": ["L4"]})
    quotes = [quote("g6.xlarge", ZONE_A, 0.30)]
    blocked = [spot_pool("g6.xlarge", ZONE_A)]
    # When placed by a caller that migrates
    placement = place(spec, quotes, work_done_hours=4.5, elapsed_hours=10, blocked=blocked, migrates=True)
    # Then it waits for spot: no on-demand start for a deficit within the band
    assert placement.market.action is MarketAction.WAIT
    assert "band" in placement.market.reason
    assert placement.ranked == ()


@pytest.mark.parametrize(
    ("migrates", "current_market", "returns_to_spot"),
    [
        (False, None, False),
        (True, None, True),
        (False, Market.ON_DEMAND, True),
        (False, Market.SPOT, False),
    ],
)
def test_the_market_choice_is_told_whether_the_caller_can_return_a_job_to_spot(
    monkeypatch: pytest.MonkeyPatch, migrates: bool, current_market: Market | None, returns_to_spot: bool
) -> None:
    # Given a recorder around the market choice inside place()
    seen: list[bool] = []
    original = market_choice.uniform_progress

    def recording(**kwargs: Any) -> MarketDecision:
        seen.append(kwargs["returns_to_spot"])
        return original(**kwargs)

    monkeypatch.setattr(placement_module, "uniform_progress", recording)
    # When a job is placed with or without migrates, idle or running
    place(job_spec(work_hours=10), [quote("g6.xlarge", ZONE_A, 0.30)], migrates=migrates, current_market=current_market)
    # Then a return to spot is assumed only when the caller migrates, or is re-placing an on-demand job
    assert seen == [returns_to_spot]


def test_a_job_re_placed_while_on_on_demand_goes_back_to_spot_once_two_restarts_ahead() -> None:
    # Given a job running on on-demand, 6 h done at 10 h of a 10 h job due at 20 h: past ep(10 + 2 x 0.1) = 5.1 h
    spec = job_spec(work_hours=10, limits={"deadline_hours": 20}, resources={"gpus": 1, "gpu_models": ["L4"]})
    # When it is re-placed with spot available (without saying migrates: re-placing it is migrating)
    placement = place(
        spec, [quote("g6.xlarge", ZONE_A, 0.30)], work_done_hours=6, elapsed_hours=10, current_market=Market.ON_DEMAND
    )
    # Then Uniform Progress's hysteresis lets it back to spot
    assert placement.market.action is MarketAction.SPOT
    assert "back to spot" in placement.market.reason
    assert ranked_pools(placement) == [spot_pool("g6.xlarge", ZONE_A)]


def test_with_on_demand_fallback_off_the_job_stays_on_spot_near_the_deadline() -> None:
    # Given the same nearly spent deadline, but a job that never wants on-demand
    spec = job_spec(work_hours=10, limits={"deadline_hours": 12, "on_demand_fallback": False})
    quotes = [quote("g6e.xlarge", ZONE_A, 0.50), quote("g6.xlarge", ZONE_B, 0.30)]
    # When placed
    placement = place(spec, quotes, elapsed_hours=8.4)
    # Then only spot pools are ranked
    assert placement.market.action is MarketAction.SPOT
    assert ranked_pools(placement) == [spot_pool("g6e.xlarge", ZONE_A)]


def test_with_on_demand_fallback_off_and_no_spot_pool_the_job_waits() -> None:
    # Given a job with time to spare whose only spot pool is blocked now, with on-demand not allowed
    spec = job_spec(work_hours=10, limits={"deadline_hours": 24, "on_demand_fallback": False})
    blocked = Pool(instance_type="g6.xlarge", availability_zone=ZONE_A)
    quotes = [quote("g6.xlarge", ZONE_A, 0.30)]
    # When placed
    placement = place(spec, quotes, elapsed_hours=2, blocked=[blocked])
    # Then it waits: nothing is ranked, and nothing is on-demand
    assert placement.market.action is MarketAction.WAIT
    assert placement.ranked == ()
    assert placement.best is None
    assert not placement.deadline_lost


def test_a_deadline_no_usable_pool_can_meet_runs_on_spot_when_on_demand_is_not_allowed() -> None:
    # Given a job behind schedule whose only usable pool (spot; on-demand not allowed) can no longer
    # finish in time: 10 h of work on an L4, 3.6 h left
    spec = job_spec(work_hours=10, limits={"deadline_hours": 12, "on_demand_fallback": False})
    quotes = [quote("g6.xlarge", ZONE_A, 0.30)]
    # When placed, Then it is late whatever it does: it runs on spot now, and says the deadline is lost
    placement = place(spec, quotes, elapsed_hours=8.4)
    assert placement.deadline_lost
    assert [r.pool.offering for r in placement.ranked] == [f"g6.xlarge:{ZONE_A}"]
    assert "the deadline can no longer be met" in placement.market.reason


def test_a_deadline_lost_ignores_types_above_the_price_cap() -> None:
    # Given a V100 job with a cap that leaves out every faster type: only p3 fits under $4/h, and it can
    # no longer finish in time (an H100 could, at $6.88/h on-demand, above the cap)
    spec = job_spec(
        work_hours=10,
        resources={"gpus": 1, "gpu_models": ["V100", "H100"]},
        limits={"deadline_hours": 10.05, "max_price_per_hour": 4.0},
    )
    quotes = [quote("p3.2xlarge", ZONE_A, 0.90)]
    # When placed an hour in, Then the deadline counts as lost (no usable pool can meet it): the job is
    # placed, not left waiting for a pool it may not use
    placement = place(spec, quotes, elapsed_hours=1.0)
    assert placement.deadline_lost
    assert placement.best is not None
    assert placement.best.pool.instance_type == "p3.2xlarge"


def test_when_no_on_demand_pool_is_usable_the_safety_net_takes_spot() -> None:
    # Given a job at its safety net whose on-demand pools are all over the budget left, spot within it
    spec = job_spec(work_hours=10, resources={"gpus": 1, "gpu_models": ["V100"]}, limits={"deadline_hours": 10.5})
    quotes = [quote("p3.2xlarge", ZONE_A, 0.90)]
    placement = place(spec, quotes, elapsed_hours=0.35, budget_left_usd=20.0)
    # Then spot is ranked rather than nothing: waiting for an unusable on-demand pool helps no one
    assert [r.pool.market for r in placement.ranked] == [Market.SPOT]
    assert "no on-demand pool is usable: spot instead" in placement.market.reason


# --- explaining --------------------------------------------------------------------------------------


def test_explain_names_the_chosen_pool_and_summarises_the_rejections() -> None:
    # Given a placement with a winner and one rejection of each of three kinds
    spec = job_spec(work_hours=10, resources={"gpus": 1, "gpu_models": ["L4"]})
    quotes = [
        quote("g6.xlarge", ZONE_A, 0.30),
        quote("g6.xlarge", ZONE_B, 0.35),
        quote("g5.xlarge", ZONE_A, 0.10),
        quote("m5.large", ZONE_A, 0.01),
    ]
    placement = place(spec, quotes, blocked=[spot_pool("g6.xlarge", ZONE_B)])
    # When it explains itself
    lines = placement.explain()
    # Then one line names the chosen pool, and one counts the rejections by kind
    chosen = [line for line in lines if line.startswith("chosen:")]
    assert len(chosen) == 1
    assert "g6.xlarge in us-east-1a (spot)" in chosen[0]
    assert "$0.3000/h" in chosen[0]
    assert "rejected 3 candidates: 1 blocked, 1 misfit, 1 unknown-type" in lines
    assert any("g5.xlarge" in line and "not in gpu_models" in line for line in lines)


def test_explain_says_when_no_pool_can_take_the_job() -> None:
    # Given only a blocked pool
    spec = job_spec()
    placement = place(spec, [quote("g6.xlarge", ZONE_A, 0.30)], blocked=[spot_pool("g6.xlarge")])
    # When it explains itself
    lines = placement.explain()
    # Then it says so instead of naming a pool
    assert "no pool can take the job now" in lines
    assert not any(line.startswith("chosen:") for line in lines)


def test_to_json_dict_has_exactly_the_documented_keys() -> None:
    # Given a placement with one ranked and one rejected pool
    spec = job_spec(work_hours=10)
    placement = place(spec, [quote("g6.xlarge", ZONE_A, 0.30), quote("m5.large", ZONE_A, 0.01)])
    # When turned into JSON
    data = placement.to_json_dict()
    # Then it has exactly these keys, with plain JSON values
    assert set(data) == {"ranked", "rejected"}
    assert [set(row) for row in data["ranked"]] == [
        {"instance_type", "availability_zone", "market", "hourly_price", "expected_cost_to_finish"}
    ]
    assert [set(row) for row in data["rejected"]] == [{"instance_type", "availability_zone", "reason"}]
    assert data["ranked"][0]["market"] == "spot"
    assert type(data["ranked"][0]["market"]) is str
    assert data["ranked"][0]["hourly_price"] == 0.30
    assert data["rejected"][0]["instance_type"] == "m5.large"


# --- properties --------------------------------------------------------------------------------------

ZONES = [f"us-east-1{z}" for z in "abcdef"]
UNKNOWN_TYPES = ["m5.large", "c7i.4xlarge", "inf2.xlarge"]
QUOTED_TYPES = sorted(INSTANCE_TYPES) + UNKNOWN_TYPES
MEMORY_CHOICES = [8.0, 16.0, 24.0, 32.0, 40.0, 48.0, 80.0, 141.0]


@st.composite
def job_specs(draw: st.DrawFn) -> JobSpec:
    # Most jobs people submit take one GPU of any kind; skew towards them so that most examples rank something.
    resources: dict[str, Any] = {"gpus": draw(st.just(1) | st.integers(1, 8))}
    models = draw(
        st.none() | st.none() | st.lists(st.sampled_from(sorted(GPU_MODELS)), min_size=1, max_size=4, unique=True)
    )
    if models is not None:
        resources["gpu_models"] = models
    memory = draw(st.none() | st.none() | st.sampled_from(MEMORY_CHOICES))
    if memory is not None:
        resources["gpu_memory_gib"] = memory
    try:
        fitting = ResourcesSpec.model_validate(resources).fitting_types()
    except ValidationError:
        # No catalog type satisfies this combination; such a spec is refused at the edge.
        reject()
    limits: dict[str, Any] = {"on_demand_fallback": draw(st.booleans())}
    cap = draw(st.none() | st.floats(0.05, 60.0))
    if cap is not None:
        limits["max_price_per_hour"] = cap
    work_hours = draw(st.none() | st.floats(0.5, 200.0))
    if work_hours is not None and draw(st.booleans()):  # a deadline needs a work estimate
        # Long enough for the fastest accepted GPU (or the spec is invalid), often for slower ones too.
        fastest = max(relative_speed(t) for t in fitting)
        speed = draw(st.just(fastest) | st.sampled_from(sorted(relative_speed(t) for t in fitting)))
        limits["deadline_hours"] = work_hours / speed * draw(st.floats(1.0, 5.0))
    fields: dict[str, Any] = {
        "resources": resources,
        "limits": limits,
        "placement": {
            "objective": draw(st.sampled_from(["cost-to-finish", "hourly"])),
            "restart_overhead_minutes": draw(st.sampled_from([3.0, 6.0, 12.0])),
        },
    }
    if work_hours is not None:
        fields["work_hours"] = work_hours
    return job_spec(**fields)


@st.composite
def price_tables(draw: st.DrawFn) -> list[PriceQuote]:
    """Spot quotes over real and unknown types in up to 6 zones; a pool may be quoted more than once,
    always at distinct times, so its latest price is well defined whatever the order."""
    zones = ZONES[: draw(st.integers(1, 6))]
    rows = draw(
        st.lists(
            st.tuples(
                st.sampled_from(QUOTED_TYPES), st.sampled_from(zones), st.floats(0.0, 5.0) | st.floats(0.0, 120.0)
            ),
            min_size=4,
            max_size=40,
        )
    )
    minutes = draw(st.permutations(range(len(rows))))
    return [
        quote(instance_type, zone, price, at=T0 + timedelta(minutes=m))
        for (instance_type, zone, price), m in zip(rows, minutes, strict=True)
    ]


@st.composite
def placement_inputs(draw: st.DrawFn) -> tuple[JobSpec, list[PriceQuote], dict[str, Any]]:
    spec = draw(job_specs())
    quotes = draw(price_tables())
    quoted_pools = sorted({q.pool for q in quotes}, key=lambda p: (p.instance_type, p.availability_zone))
    blocked: set[Pool] = set()
    if quoted_pools:
        blocked = draw(st.sets(st.sampled_from(quoted_pools), max_size=3))
        # An on-demand offering may be blocked too.
        blocked |= {
            p.model_copy(update={"market": Market.ON_DEMAND})
            for p in draw(st.sets(st.sampled_from(quoted_pools), max_size=3))
        }
    observed: dict[str, PoolObservation] = {}
    if quoted_pools:
        for pool in draw(st.sets(st.sampled_from(quoted_pools), max_size=4)):
            observed[pool.offering] = PoolObservation(
                interruptions=draw(st.integers(0, 10)), instance_hours=draw(st.floats(0.0, 100.0))
            )
    deadline = spec.limits.deadline_hours
    kwargs: dict[str, Any] = {
        "blocked": blocked,
        "elapsed_hours": draw(
            st.floats(0.0, 50.0)
            if deadline is None
            else st.floats(0.0, 0.5 * deadline) | st.floats(0.0, 1.1 * deadline)
        ),
        "work_done_hours": draw(st.floats(0.0, spec.work_hours if spec.work_hours is not None else 10.0)),
        "budget_left_usd": draw(st.none() | st.none() | st.floats(0.01, 500.0)),
        "migrates": draw(st.booleans()),
        "interruptions": InterruptionModel(
            bands=draw(st.dictionaries(st.sampled_from(sorted(INSTANCE_TYPES)), st.integers(0, 4), max_size=8)),
            observed=observed,
        ),
    }
    return spec, quotes, kwargs


PROPERTY_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


@PROPERTY_SETTINGS
@given(placement_inputs())
def test_placement_never_ranks_an_infeasible_blocked_or_overpriced_pool(
    case: tuple[JobSpec, list[PriceQuote], dict[str, Any]],
) -> None:
    # Given any job, price table, blocked set, budget and clock
    spec, quotes, kwargs = case
    # When placed
    placement = place(spec, quotes, **kwargs)
    event(f"market {placement.market.action}, {'some' if placement.ranked else 'no'} pool ranked")
    # Then every ranked pool fits the job, is not blocked, is within the cap, the budget and the deadline,
    # and is on the market the decision chose
    cap = spec.limits.max_price_per_hour
    deadline = spec.limits.deadline_hours
    for r in placement.ranked:
        itype = INSTANCE_TYPES.get(r.pool.instance_type)
        assert itype is not None
        assert spec.resources.misfit(itype) is None
        assert r.pool not in kwargs["blocked"]
        assert cap is None or r.hourly_price <= cap
        assert kwargs["budget_left_usd"] is None or r.expected_cost_to_finish <= kwargs["budget_left_usd"]
        # without a work estimate, no deadline test; a deadline no pool can meet any more rejects none
        if deadline is not None and spec.work_hours is not None and not placement.deadline_lost:
            assert r.run_hours <= deadline - kwargs["elapsed_hours"]
        if placement.deadline_lost:  # lost only when even this pool cannot finish in time
            assert deadline is not None
            assert r.run_hours + spec.placement.restart_overhead_hours > deadline - kwargs["elapsed_hours"]
        assert r.pool.market in placement.market.markets
        if r.pool.market is Market.ON_DEMAND:
            assert spec.limits.on_demand_fallback
            assert r.hourly_price == itype.on_demand_usd_per_hour


@PROPERTY_SETTINGS
@given(placement_inputs())
def test_ranking_is_sorted_by_the_jobs_objective(case: tuple[JobSpec, list[PriceQuote], dict[str, Any]]) -> None:
    # Given any job and price table
    spec, quotes, kwargs = case
    # When placed
    placement = place(spec, quotes, **kwargs)
    # Then the ranking is in ascending order of the objective, so the first pool is the minimum
    if spec.placement.objective == "hourly":
        keys = [r.hourly_price for r in placement.ranked]
    else:
        keys = [r.expected_cost_to_finish for r in placement.ranked]
    assert keys == sorted(keys)
    if placement.ranked:
        assert keys[0] == min(keys)
        assert all(math.isfinite(k) for k in keys)


@PROPERTY_SETTINGS
@given(placement_inputs())
def test_every_spot_pool_quoted_is_either_ranked_or_rejected_exactly_once(
    case: tuple[JobSpec, list[PriceQuote], dict[str, Any]],
) -> None:
    # Given any job and price table
    spec, quotes, kwargs = case
    # When placed
    placement = place(spec, quotes, **kwargs)
    # Then each quoted spot pool appears exactly once among the ranked and the rejected: none is dropped
    outcome = Counter(r.pool for r in placement.ranked if r.pool.market is Market.SPOT)
    outcome.update(r.pool for r in placement.rejected if r.pool.market is Market.SPOT)
    assert outcome == Counter({q.pool for q in quotes})


@PROPERTY_SETTINGS
@given(placement_inputs(), st.randoms(use_true_random=False))
def test_placement_is_deterministic_and_independent_of_quote_order(
    case: tuple[JobSpec, list[PriceQuote], dict[str, Any]], rng: random.Random
) -> None:
    # Given any job and price table, and the same quotes in another order
    spec, quotes, kwargs = case
    shuffled = list(quotes)
    rng.shuffle(shuffled)
    # When placed twice on the same input and once on the shuffled one
    first = place(spec, quotes, **kwargs)
    again = place(spec, quotes, **kwargs)
    reordered = place(spec, shuffled, **kwargs)
    # Then all three placements are equal
    assert again == first
    assert reordered == first


def cheapest_usable_on_demand(
    spec: JobSpec, quotes: list[PriceQuote], kwargs: dict[str, Any], placement: Placement
) -> float | None:
    """USD per reference-GPU hour on the cheapest on-demand pool the job could be given: a type that fits,
    in a quoted zone, not blocked, within the cap, the deadline (unless lost) and the budget."""
    cap, deadline = spec.limits.max_price_per_hour, spec.limits.deadline_hours
    time_left = None if deadline is None or placement.deadline_lost else deadline - kwargs["elapsed_hours"]
    units = []
    for t in INSTANCE_TYPES.values():
        price = t.on_demand_usd_per_hour
        if price is None or spec.resources.misfit(t) is not None or (cap is not None and price > cap):
            continue
        run_hours = placement.remaining_work_hours / relative_speed(t)
        if time_left is not None and run_hours + spec.placement.restart_overhead_hours > time_left + 1e-9:
            continue
        budget = kwargs["budget_left_usd"]
        if budget is not None and price * run_hours > budget:
            continue
        pools = {
            Pool(instance_type=t.name, availability_zone=q.pool.availability_zone, market=Market.ON_DEMAND)
            for q in quotes
        }
        if pools - kwargs["blocked"]:
            units.append(price / relative_speed(t))
    return min(units, default=None)


@PROPERTY_SETTINGS
@given(placement_inputs())
def test_spot_is_ranked_only_when_cheaper_than_the_on_demand_the_job_could_get(
    case: tuple[JobSpec, list[PriceQuote], dict[str, Any]],
) -> None:
    # Given any job, price table, blocked set, budget and clock
    spec, quotes, kwargs = case
    # When placed
    placement = place(spec, quotes, **kwargs)
    yardstick = cheapest_usable_on_demand(spec, quotes, kwargs, placement)
    applies = (
        spec.limits.on_demand_fallback
        and spec.limits.deadline_hours is not None
        and spec.work_hours is not None
        and yardstick is not None
    )
    dearer = [r for r in placement.rejected if r.category == "dearer-than-on-demand"]
    event(f"{len(dearer)} dearer-than-on-demand")
    # Then a spot pool is rejected as dearer than on-demand only for a job whose market choice can pick
    # on-demand, when an on-demand pool it could get costs less per unit of work; never leaving it with nothing
    # while it is behind schedule
    if dearer:
        assert applies
        assert placement.ranked or placement.market.action is MarketAction.WAIT
    # And when the rule applies, every ranked spot pool costs less per unit of work than that on-demand pool
    if applies:
        assert yardstick is not None
        for r in placement.ranked:
            if r.pool.market is Market.SPOT:
                assert placement_module.unit_cost(r, spec.placement.objective) < yardstick


def test_a_spot_pool_dearer_than_on_demand_is_rejected_and_the_job_goes_on_demand_or_waits() -> None:
    # Given a 1-GPU V100 job due in 12 h, and spot only on an 8-GPU p3.16xlarge at $7.96/h (its one GPU runs at
    # the same speed there), while a 1-GPU p3.2xlarge costs $3.06/h on-demand
    spec = job_spec(work_hours=6, resources={"gpus": 1, "gpu_models": ["V100"]}, limits={"deadline_hours": 12})
    big = quote("p3.16xlarge", ZONE_A, 7.955)
    # When it is placed at submission (on the uniform line) and again 3.5 h later with no progress (beyond rule
    # 1's band: (1 - 6/12) x 6 h of slack = 3 h)
    at_start = place(spec, [big], migrates=True)
    behind = place(spec, [big], elapsed_hours=3.5, migrates=True)
    # Then the 8-GPU spot pool is never ranked, and says why
    for placement in (at_start, behind):
        assert all(r.pool.market is Market.ON_DEMAND for r in placement.ranked)
        category, reason = rejection_of(placement, big.pool)
        assert category == "dearer-than-on-demand"
        assert "on p3.2xlarge on-demand" in reason
    # And the job waits for cheaper spot while it is on schedule, then catches up on a 1-GPU on-demand instance
    assert at_start.market.action is MarketAction.WAIT
    assert behind.market.action is MarketAction.ON_DEMAND
    assert behind.best is not None
    assert behind.best.pool.instance_type == "p3.2xlarge"


def test_a_job_without_a_deadline_takes_spot_however_dear() -> None:
    # Given the same 1-GPU job with no deadline (its market choice is spot or wait, never on-demand)
    spec = job_spec(work_hours=6, resources={"gpus": 1, "gpu_models": ["V100"]})
    big = quote("p3.16xlarge", ZONE_A, 7.955)
    # When it is placed
    placement = place(spec, [big])
    # Then the 8-GPU spot pool is ranked: rejecting it would leave the job waiting for nothing
    assert ranked_pools(placement) == [big.pool]


def test_spot_is_measured_against_the_on_demand_pools_the_job_can_get() -> None:
    # Given the 1-GPU job due in 12 h, an hour behind schedule, with spot only on p3.16xlarge at $7.96/h
    spec = job_spec(work_hours=6, resources={"gpus": 1, "gpu_models": ["V100"]}, limits={"deadline_hours": 12})
    big = quote("p3.16xlarge", ZONE_A, 7.955)
    one_gpu = Pool(instance_type="p3.2xlarge", availability_zone=ZONE_A, market=Market.ON_DEMAND)
    four_gpus = Pool(instance_type="p3.8xlarge", availability_zone=ZONE_A, market=Market.ON_DEMAND)
    eight_gpus = Pool(instance_type="p3.16xlarge", availability_zone=ZONE_A, market=Market.ON_DEMAND)
    # When the 1-GPU on-demand pool is blocked (a refused launch), and then every V100 on-demand pool is
    no_p3_2xlarge = place(spec, [big], elapsed_hours=1, migrates=True, blocked={one_gpu})
    none = place(spec, [big], elapsed_hours=1, migrates=True, blocked={one_gpu, four_gpus, eight_gpus})
    # Then the spot pool at $7.96/h beats the 4-GPU on-demand one at $12.24/h, and is taken
    assert ranked_pools(no_p3_2xlarge) == [big.pool]
    # And with no on-demand pool to be had, the spot pool is simply spot: taken
    assert ranked_pools(none) == [big.pool]
    assert none.market.action is MarketAction.SPOT


def test_a_job_without_on_demand_fallback_takes_spot_however_dear() -> None:
    # Given the same job, not allowed on-demand
    spec = job_spec(
        work_hours=6,
        resources={"gpus": 1, "gpu_models": ["V100"]},
        limits={"deadline_hours": 12, "on_demand_fallback": False},
    )
    big = quote("p3.16xlarge", ZONE_A, 7.955)
    # When it is placed
    placement = place(spec, [big])
    # Then the 8-GPU spot pool is its only choice, and it is taken
    assert ranked_pools(placement) == [big.pool]


# --- back to spot from on-demand ---------------------------------------------------------------------


def test_a_spot_run_pays_for_the_switch_unless_the_pool_loses_its_capacity_within_minutes() -> None:
    # Given V100 spot at $0.97/h against $3.06/h on-demand and restarts of 0.2 h
    pays = {"spot_unit": 0.97, "on_demand_unit": 3.06, "overhead_hours": 0.2}
    # Then runs of 1-3 h pay for a switch, runs mostly shorter than the restart do not
    assert placement_module.spot_run_pays_off(**pays, runs=[2.0, 3.0, 1.0], hourly_rate=0.0)
    assert not placement_module.spot_run_pays_off(**pays, runs=[0.15, 0.2, 0.25, 0.1], hourly_rate=0.0)
    # And with no run of its own, the pool's interruption rate decides: break-even near r d = 0.37 here
    # (0.317 + x = exp(-x))
    assert placement_module.spot_run_pays_off(**pays, runs=[], hourly_rate=1.5)  # r d = 0.3
    assert not placement_module.spot_run_pays_off(**pays, runs=[], hourly_rate=2.0)  # r d = 0.4
    # And a restart is billed at the on-demand type's price per hour, not per unit of work: a 1.5 h run on a
    # T4 (0.52x V100) at $0.16/h does not pay for leaving an L40S (2.9x) at $1.86/h, though it would on a GPU
    # as fast as the on-demand one
    t4: dict[str, Any] = {
        "spot_unit": 0.16 / 0.52,
        "on_demand_unit": 1.861 / 2.8964,
        "overhead_hours": 0.2,
        "runs": [1.5],
    }
    assert not placement_module.spot_run_pays_off(**t4, hourly_rate=0.0, speed_ratio=2.8964 / 0.52)
    assert placement_module.spot_run_pays_off(**t4, hourly_rate=0.0, speed_ratio=1.0)
    # And spot at the on-demand price never pays
    assert not placement_module.spot_run_pays_off(
        spot_unit=3.06, on_demand_unit=3.06, overhead_hours=0.2, runs=[], hourly_rate=0.0
    )


def test_a_job_on_demand_behind_schedule_goes_back_to_spot_unless_its_runs_there_were_short() -> None:
    # Given a 6 h V100 job due in 12 h, on on-demand, 2 h in with 0.5 h done: behind the uniform line, far
    # outside the safety net; spot at $0.97/h in one pool
    spec = job_spec(work_hours=6, resources={"gpus": 1, "gpu_models": ["V100"]}, limits={"deadline_hours": 12})
    v100 = quote("p3.2xlarge", ZONE_A, 0.97)
    state: dict[str, Any] = {"work_done_hours": 0.5, "elapsed_hours": 2, "current_market": Market.ON_DEMAND}
    # When it is re-placed with no run of its own there, and with three runs there of 5 to 8 minutes
    fresh = place(spec, [v100], **state)
    burnt = place(spec, [v100], **state, spot_runs={v100.pool.offering: [0.1, 0.08, 0.13]})
    # Then it goes back to spot in the first case (the paper's hysteresis alone would keep it on on-demand)
    assert fresh.market.action is MarketAction.SPOT
    assert "pay for the switch" in fresh.market.reason
    assert ranked_pools(fresh) == [v100.pool]
    # And stays on on-demand in the second: those runs end before a restart of 6 min pays off
    assert burnt.market.action is MarketAction.ON_DEMAND
    assert "hysteresis" in burnt.market.reason
    assert "no spot pool where a run would pay for the switch" in burnt.market.reason
    # And with a second pool where it never ran, it moves there, and says why not to the first
    other = quote("p3.2xlarge", ZONE_B, 0.99)
    mixed = place(spec, [v100, other], **state, spot_runs={v100.pool.offering: [0.1, 0.08, 0.13]})
    assert ranked_pools(mixed) == [other.pool]
    category, reason = rejection_of(mixed, v100.pool)
    assert category == "short-runs"
    assert "3 interrupted run(s) here averaged 6 min" in reason


def test_spot_run_hours_are_the_interrupted_spot_attempts_from_launch_to_notice() -> None:
    # Given a job's attempts: two interrupted spot runs in one pool, a lost one, an on-demand one, an open one
    pool = Pool(instance_type="p3.2xlarge", availability_zone=ZONE_A)
    base = Attempt(job_id="j", attempt=1, pool=pool, hourly_price=0.97, started_at=T0)
    attempts = [
        base.model_copy(
            update={
                "interrupted_at": T0 + timedelta(minutes=30),
                "ended_at": T0 + timedelta(minutes=32),
                "outcome": AttemptOutcome.INTERRUPTED,
            }
        ),
        base.model_copy(
            update={"attempt": 2, "ended_at": T0 + timedelta(hours=2), "outcome": AttemptOutcome.INTERRUPTED}
        ),
        base.model_copy(update={"attempt": 3, "ended_at": T0 + timedelta(hours=1), "outcome": AttemptOutcome.LOST}),
        base.model_copy(
            update={
                "attempt": 4,
                "pool": pool.model_copy(update={"market": Market.ON_DEMAND}),
                "ended_at": T0 + timedelta(hours=1),
                "outcome": AttemptOutcome.INTERRUPTED,
            }
        ),
        base.model_copy(update={"attempt": 5}),
    ]
    # When the runs are read
    runs = placement_module.spot_run_hours(attempts)
    # Then only the interrupted spot runs count, each up to its notice (else its end)
    assert runs == {pool.offering: [0.5, 2.0]}


def test_a_job_that_cannot_save_at_the_notice_keeps_a_checkpoint_interval_in_the_safety_net() -> None:
    # Given 10 h of V100 work due at 20 h, 9.55 h elapsed (10.45 h left), restarts of 6 min and spot available:
    # outside the net of two restarts (10.2 h), inside it with a 30-minute checkpoint interval at risk (10.7 h)
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    resources = {"gpus": 1, "gpu_models": ["V100"]}
    saves = job_spec(
        work_hours=10, limits={"deadline_hours": 20}, resources=resources, checkpoint={"interval_minutes": 30}
    )
    periodic = job_spec(
        work_hours=10,
        limits={"deadline_hours": 20},
        resources=resources,
        checkpoint={"interval_minutes": 30, "grace_seconds": 0},
    )
    assert placement_module.work_at_risk_hours(saves) == 0
    assert placement_module.work_at_risk_hours(periodic) == pytest.approx(0.5)
    # When both are placed
    on_spot = place(saves, [v100], elapsed_hours=9.55)
    on_demand = place(periodic, [v100], elapsed_hours=9.55)
    # Then the job that saves at the notice (grace to do it) starts on spot; the one given no grace, which a
    # preemption could set back 30 minutes, goes on-demand
    assert on_spot.market.action is MarketAction.SPOT
    assert ranked_pools(on_spot) == [v100.pool]
    assert on_demand.market.action is MarketAction.ON_DEMAND
    assert all(r.pool.market is Market.ON_DEMAND for r in on_demand.ranked)


def test_a_job_that_can_no_longer_meet_its_deadline_is_placed_on_demand_at_once() -> None:
    # Given 10 h of V100 work due at 10.05 h, relaunched 1 h after submission with nothing done (a preemption
    # lost its work): no V100 pool, spot or on-demand, can finish in time any more
    spec = job_spec(work_hours=10, limits={"deadline_hours": 10.05}, resources={"gpus": 1, "gpu_models": ["V100"]})
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    # When it is placed
    placement = place(spec, [v100], elapsed_hours=1.0)
    # Then no pool is rejected for the deadline (waiting would only fail it after max_wait_hours): it finishes as
    # soon as it can, on on-demand
    assert placement.deadline_lost
    assert "can no longer be met" in placement.market.reason
    assert placement.market.action is MarketAction.ON_DEMAND
    assert placement.best is not None
    assert placement.best.pool.market is Market.ON_DEMAND
    assert placement.best.pool.instance_type.startswith("p3.")
    assert "deadline" not in {r.category for r in placement.rejected}


def test_a_deadline_a_faster_type_can_still_meet_is_not_lost() -> None:
    # Given the same job accepting any GPU: a faster on-demand type still finishes in the 9.05 h left
    spec = job_spec(work_hours=10, limits={"deadline_hours": 10.05})
    v100 = quote("p3.2xlarge", ZONE_A, 0.90)
    placement = place(spec, [v100], elapsed_hours=1.0)
    # Then the deadline stands: the V100 pool is rejected for it, and only types that finish in time are ranked
    assert not placement.deadline_lost
    assert rejection_of(placement, v100.pool)[0] == "deadline"
    assert all(r.run_hours + 0.1 <= 9.05 for r in placement.ranked)
