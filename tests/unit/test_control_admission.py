"""Admission: which queued jobs start now, within concurrency, the $/h budget and the spot vCPU quotas."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from control_builders import T0, limits, make_job

from spotrelay.control.admission import Held, admit, live_usd_per_hour
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, Pool


def ids(jobs: tuple[Job, ...]) -> list[str]:
    return [j.job_id for j in jobs]


def held_reasons(held: tuple[Held, ...]) -> dict[str, str]:
    return {h.job.job_id: h.reason for h in held}


def running(job_id: str, **spec_fields: Any) -> Job:
    return make_job(job_id, state=JobState.RUNNING, **spec_fields)


# --- order ---------------------------------------------------------------------------------------------


def test_higher_priority_is_admitted_first_even_when_submitted_later() -> None:
    # Given room for two jobs, and a high-priority job submitted after two normal and one low
    queued = [
        make_job("low-old", priority="low", submitted_at=T0),
        make_job("normal-1", priority="normal", submitted_at=T0 + timedelta(minutes=1)),
        make_job("normal-2", priority="normal", submitted_at=T0 + timedelta(minutes=2)),
        make_job("high-new", priority="high", submitted_at=T0 + timedelta(minutes=3)),
    ]
    # When admission runs
    plan = admit(queued, [], limits(max_concurrent_jobs=2))
    # Then the high-priority job goes first, then the oldest normal one; the rest wait
    assert ids(plan.admitted) == ["high-new", "normal-1"]
    assert sorted(held_reasons(plan.held)) == ["low-old", "normal-2"]


def test_within_a_priority_the_oldest_job_is_admitted_first() -> None:
    # Given three normal jobs handed over newest first
    queued = [make_job(f"job-{n}", submitted_at=T0 + timedelta(minutes=n)) for n in (3, 2, 1)]
    # When there is room for one
    plan = admit(queued, [], limits(max_concurrent_jobs=1))
    # Then the oldest starts
    assert ids(plan.admitted) == ["job-1"]


# --- concurrency ---------------------------------------------------------------------------------------


def test_max_concurrent_jobs_counts_the_jobs_already_running() -> None:
    # Given one running job, a limit of 2 and three queued jobs
    active = [running("busy")]
    queued = [make_job(f"job-{n}", submitted_at=T0 + timedelta(minutes=n)) for n in (1, 2, 3)]
    # When admission runs
    plan = admit(queued, active, limits(max_concurrent_jobs=2))
    # Then one more starts and the others wait, saying why
    assert ids(plan.admitted) == ["job-1"]
    assert held_reasons(plan.held) == {
        "job-2": "max_concurrent_jobs 2 reached",
        "job-3": "max_concurrent_jobs 2 reached",
    }


# --- budget ---------------------------------------------------------------------------------------------


def test_budget_counts_each_job_at_the_cheapest_on_demand_price_of_an_allowed_family() -> None:
    # Given a budget of $2/h and 1-GPU jobs; the cheapest allowed on-demand type is g6.xlarge at $0.8048/h
    queued = [make_job(f"job-{n}", submitted_at=T0 + timedelta(minutes=n)) for n in (1, 2, 3)]
    # When admission runs with g5 and g6 allowed
    plan = admit(queued, [], limits(budget_usd_per_hour=2.0, allowed_families=("g5", "g6")))
    # Then two fit ($1.61/h) and the third would overrun the budget
    assert ids(plan.admitted) == ["job-1", "job-2"]
    assert held_reasons(plan.held)["job-3"] == "budget: $1.61/h in use + $0.80/h for this job > $2/h"


def test_budget_estimate_uses_only_allowed_families() -> None:
    # Given a budget of $1.90/h and one job already running; each job is priced at its cheapest allowed type
    running = [make_job("running", state=JobState.PLACING)]
    job = make_job("job-1")
    # When only g5 is allowed (2 x g5.xlarge at $1.006/h = $2.01/h), the new job waits for budget;
    # when g6 is allowed too (2 x g6.xlarge at $0.8048/h = $1.61/h), it starts
    only_g5 = admit([job], running, limits(budget_usd_per_hour=1.9, allowed_families=("g5",)))
    g5_and_g6 = admit([job], running, limits(budget_usd_per_hour=1.9, allowed_families=("g5", "g6")))
    assert ids(only_g5.admitted) == []
    assert held_reasons(only_g5.held)["job-1"].startswith("budget:")
    assert ids(g5_and_g6.admitted) == ["job-1"]


def test_a_job_dearer_than_the_whole_budget_is_unschedulable_not_held_forever() -> None:
    # Given a budget of $1/h and a job whose cheapest allowed type is a g5.xlarge at $1.006/h
    job = make_job("job-1")
    # When admission runs
    plan = admit([job], [], limits(budget_usd_per_hour=1.0, allowed_families=("g5",)))
    # Then the job is impossible, with the reason
    assert ids(plan.admitted) == []
    assert [h.job.job_id for h in plan.impossible] == ["job-1"]
    assert "more than the whole budget of $1/h" in plan.impossible[0].reason


def test_budget_estimate_is_capped_by_the_jobs_max_price_per_hour() -> None:
    # Given jobs that will never pay more than $0.30/h, and a budget of $2/h
    queued = [
        make_job(f"job-{n}", submitted_at=T0 + timedelta(minutes=n), limits={"max_price_per_hour": 0.3})
        for n in range(1, 9)
    ]
    # When admission runs
    plan = admit(queued, [], limits(budget_usd_per_hour=2.0, allowed_families=("g6",)))
    # Then six fit at $0.30/h each ($1.80/h), where uncapped only two would have
    assert len(plan.admitted) == 6
    assert held_reasons(plan.held)["job-7"] == "budget: $1.80/h in use + $0.30/h for this job > $2/h"


def test_budget_counts_what_running_jobs_are_estimated_to_spend() -> None:
    # Given a running 1-GPU job ($0.8048/h) and a budget of $1/h
    plan = admit([make_job("job-1")], [running("busy")], limits(budget_usd_per_hour=1.0, allowed_families=("g6",)))
    # Then a second 1-GPU job waits
    assert ids(plan.admitted) == []
    assert held_reasons(plan.held)["job-1"].startswith("budget: $0.80/h in use")


# --- spot vCPU quotas --------------------------------------------------------------------------------------


def test_a_family_counts_against_the_quota_group_of_its_longest_prefix() -> None:
    # Given quota groups "p" (96 vCPUs) and "p5" (16 vCPUs), and a running A100 job using all of "p"
    # (p4d.24xlarge: 96 vCPUs)
    quotas = {"p": 96, "p5": 16}
    active = [running("a100-running", resources={"gpus": 8, "gpu_models": ["A100"]})]
    queued = [
        make_job("a100", submitted_at=T0, resources={"gpus": 8, "gpu_models": ["A100"]}),
        make_job("h100-1", submitted_at=T0 + timedelta(minutes=1), resources={"gpus": 1, "gpu_models": ["H100"]}),
        make_job("h100-2", submitted_at=T0 + timedelta(minutes=2), resources={"gpus": 1, "gpu_models": ["H100"]}),
    ]
    # When admission runs
    plan = admit(queued, active, limits(spot_vcpu_quotas=quotas, allowed_families=("p4d", "p5")))
    # Then the second A100 job waits for "p", one H100 job (p5.4xlarge, 16 vCPUs) starts in "p5", the other waits
    assert ids(plan.admitted) == ["h100-1"]
    assert held_reasons(plan.held) == {
        "a100": "spot vCPU quota 'p': 96 in use + 96 > 96",
        "h100-2": "spot vCPU quota 'p5': 16 in use + 16 > 16",
    }


def test_a_family_with_no_quota_group_is_not_limited_by_quotas() -> None:
    # Given a quota for "p" only, and many 1-GPU jobs that run on g6
    queued = [make_job(f"job-{n}", submitted_at=T0 + timedelta(minutes=n)) for n in range(5)]
    # When admission runs
    plan = admit(queued, [], limits(spot_vcpu_quotas={"p": 0}, allowed_families=("g6",)))
    # Then all of them start
    assert len(plan.admitted) == 5


def test_a_small_job_backfills_behind_a_big_one_that_does_not_fit() -> None:
    # Given a "g" quota of 50 vCPUs with a 4-vCPU job running, a 4-GPU job (g6.12xlarge: 48 vCPUs) first,
    # then a 1-GPU job (4 vCPUs)
    running = [make_job("running", state=JobState.PLACING)]
    big = make_job("big", submitted_at=T0, resources={"gpus": 4})
    small = make_job("small", submitted_at=T0 + timedelta(minutes=1))
    # When admission runs
    plan = admit([big, small], running, limits(spot_vcpu_quotas={"g": 50}, allowed_families=("g6",)))
    # Then the small job starts and the big one waits for quota
    assert ids(plan.admitted) == ["small"]
    assert held_reasons(plan.held) == {"big": "spot vCPU quota 'g': 4 in use + 48 > 50"}


def test_a_job_bigger_than_the_whole_quota_is_unschedulable() -> None:
    # Given a "g" quota of 16 vCPUs and a 4-GPU job whose smallest type has 48
    big = make_job("big", resources={"gpus": 4})
    # When admission runs
    plan = admit([big], [], limits(spot_vcpu_quotas={"g": 16}, allowed_families=("g6",)))
    # Then it is impossible rather than held forever
    assert [h.job.job_id for h in plan.impossible] == ["big"]
    assert "more than the whole spot vCPU quota 'g' of 16" in plan.impossible[0].reason


def test_a_burst_of_fifty_one_gpu_jobs_admits_as_many_as_the_quota_fits_high_priority_first() -> None:
    # Given 45 normal jobs, then 5 high-priority ones, each on a 4-vCPU g6.xlarge, and a "g" quota of 32
    normal = [make_job(f"normal-{n}", submitted_at=T0 + timedelta(seconds=n)) for n in range(45)]
    high = [make_job(f"high-{n}", priority="high", submitted_at=T0 + timedelta(minutes=5, seconds=n)) for n in range(5)]
    # When admission runs
    plan = admit(normal + high, [], limits(spot_vcpu_quotas={"g": 32}, allowed_families=("g6",)))
    # Then exactly 8 start: the 5 high-priority jobs, then the 3 oldest normal ones; 42 wait
    assert ids(plan.admitted) == [f"high-{n}" for n in range(5)] + ["normal-0", "normal-1", "normal-2"]
    assert len(plan.held) == 42
    assert plan.impossible == ()


# --- impossible ----------------------------------------------------------------------------------------------


def test_a_job_no_allowed_family_fits_is_impossible_not_held() -> None:
    # Given a job that needs H100s, on a deployment that allows only g5 and g6
    job = make_job("needs-h100", resources={"gpus": 1, "gpu_models": ["H100"]})
    # When admission runs
    plan = admit([job], [], limits(allowed_families=("g5", "g6")))
    # Then it is reported impossible, naming the allowed families, and neither admitted nor held
    assert [h.job.job_id for h in plan.impossible] == ["needs-h100"]
    assert plan.impossible[0].reason == "no instance type of the allowed GPU families (g5, g6) fits resources"
    assert plan.admitted == ()
    assert plan.held == ()


# --- live instances at the prices in effect now ----------------------------------------------------------


def test_an_active_job_counts_at_what_its_instances_cost_now_when_that_is_more_than_its_estimate() -> None:
    # Given a budget of $2.5/h and two running 1-GPU jobs estimated at g6.xlarge's on-demand $0.8048/h each:
    # "dear" on a pool whose spot price rose to $0.95/h, "cheap" on one at $0.35/h
    active = [running("dear"), running("cheap")]
    live_spend = {"dear": 0.95, "cheap": 0.35}
    # When admission runs with and without what their instances cost now
    with_prices = admit([make_job("job-1")], active, limits(budget_usd_per_hour=2.5), live_spend)
    estimates_only = admit([make_job("job-1")], active, limits(budget_usd_per_hour=2.5))
    # Then "dear" counts at $0.95/h and "cheap" still at its estimate: the next job would take $2.56/h, and waits
    assert ids(with_prices.admitted) == []
    assert held_reasons(with_prices.held) == {"job-1": "budget: $1.75/h in use + $0.80/h for this job > $2.5/h"}
    # where the estimates alone ($2.41/h with it) admitted it
    assert ids(estimates_only.admitted) == ["job-1"]


def test_live_usd_per_hour_is_each_live_instance_at_its_price_now() -> None:
    # Given a job's attempts: one closed, its current spot one, a spot standby beside it in a pool with no
    # quote, and an on-demand one not launched yet (no instance)
    pool = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
    other = Pool(instance_type="g6.2xlarge", availability_zone="us-east-1b")

    def attempt(number: int, **fields: Any) -> Attempt:
        values: dict[str, Any] = {"job_id": "train-1", "attempt": number, "pool": pool, "hourly_price": 0.35}
        values |= {"started_at": T0, "instance_id": f"i-{number}"} | fields
        return Attempt.model_validate(values)

    attempts = [
        attempt(1, ended_at=T0, outcome=AttemptOutcome.INTERRUPTED),
        attempt(2),
        attempt(3, pool=other, hourly_price=0.45, handover_from=2),
        attempt(4, pool=other.model_copy(update={"market": Market.ON_DEMAND}), hourly_price=0.98, instance_id=None),
    ]
    # When what they cost per hour now is asked, the first pool's price at $0.70/h now
    now = live_usd_per_hour(attempts, {("g6.xlarge", "us-east-1a"): 0.70})
    # Then the current one counts at the price now, the standby at its launch price, the others not at all
    assert now == pytest.approx(0.70 + 0.45)
    # And an on-demand instance at its price
    on_demand = attempt(5, pool=other.model_copy(update={"market": Market.ON_DEMAND}), hourly_price=0.98)
    assert live_usd_per_hour([on_demand], {("g6.2xlarge", "us-east-1b"): 0.10}) == pytest.approx(0.98)
