"""One decision core: the benchmark's `spotrelay` policy and the Lambda steps themselves (Place, Launch,
Recover, with the interruption warning's handling) make the same decisions on the same market.

The second policy here, `LambdaSteps`, runs `place_step`, `launch_step`, `recover_step` and
`handle_ec2_event` against the ports' fakes (tests/fakes.py), whose EC2 is the bench's market at the
replay's time: its quotes are the spot prices, and a pool without capacity refuses the launch. Both go
through the same replay engine, so any drift between the bench's execution of the decisions and the
steps' shows as a different timeline.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from control_builders import HEARTBEAT_SECONDS, World, error, recorded_event
from fakes import FakeClock, FakeCompute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotrelay.bench.policies import ALL_POLICIES
from spotrelay.bench.sim import BenchJob, Decision, JobContext, JobResult, JobStatus, MarketView, simulate
from spotrelay.bench.workloads import PAPER_INSTANCE_TYPE, job_spec
from spotrelay.config import INTERRUPTION_BLOCK_MINUTES
from spotrelay.control.ec2_events import handle_ec2_event
from spotrelay.control.lifecycle import InsufficientInstanceCapacity, PlacementContext, launch_step, place_step
from spotrelay.market import MarketBuilder, SpotMarket, parse_availability_trace
from spotrelay.models import Job, JobState, Market, Pool, RecoveryStrategyName

EVENTS = Path(__file__).resolve().parents[2] / "events"
START_PRICES = {"us-east-1a": 0.90, "us-east-1b": 0.95, "us-east-1c": 1.00}
CONTEXT = PlacementContext(subnets={zone: f"subnet-{zone[-1]}" for zone in START_PRICES}, allowed_families=("p3",))


def market(traces: dict[str, list[int]]) -> SpotMarket:
    builder = MarketBuilder(FakeClock().now())
    for zone, data in traces.items():
        text = json.dumps({"metadata": {"gap_seconds": 3600}, "data": data})
        trace = parse_availability_trace(text, zone, "v100_1", f"{zone}_v100_1.json")
        builder.add_trace(trace, PAPER_INSTANCE_TYPE, spot_price_usd_per_hour=START_PRICES[zone])
    return builder.build()


def bench_job(zones: list[str], recovery: RecoveryStrategyName, work: float = 8.0) -> BenchJob:
    spec = job_spec(
        "job",
        gpus=1,
        gpu_models=["V100"],
        work_hours=work,
        deadline_hours=200.0,  # far: the market choice stays on spot, and nothing goes on-demand
        recovery=recovery,
        checkpoint_interval_minutes=15.0,
        restart_overhead_hours=0.1,
        saves_at_notice=True,
    )
    return BenchJob(
        name="job",
        spec=spec,
        submit_hours=0.0,
        restart_overhead_hours=0.1,
        zones=tuple(zones),
        instance_types=(PAPER_INSTANCE_TYPE,),
        on_demand_prices={PAPER_INSTANCE_TYPE: 3.06},
        checkpoint_on_notice=True,
    )


class LambdaSteps:
    """The Lambda steps on the port fakes, driven by the replay engine as a policy."""

    name = "lambda-steps"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.world = World(compute=FakeCompute(), clock=FakeClock(ctx.market.to_datetime(0.0)))
        self.tokens = 0
        self.failed: str | None = None
        job = Job(
            job_id=ctx.job.name,
            spec=ctx.job.spec,
            state=JobState.PLACING,  # as the dispatcher admits it
            submitted_at=ctx.market.to_datetime(ctx.job.submit_hours),
            updated_at=ctx.market.to_datetime(ctx.job.submit_hours),
        )
        assert self.world.store.create_job(job)
        self.world.workflow.start(job.job_id, {"job_id": job.job_id, "heartbeat_seconds": HEARTBEAT_SECONDS})

    def _at(self, t: float) -> None:
        """EC2 as the market is at `t`: its spot prices, and no capacity where it has none."""
        world, now = self.world, self.ctx.market.to_datetime(t)
        world.clock.current = now
        world.compute.prices = {
            (q.pool.instance_type, q.pool.availability_zone): q.usd_per_hour for q in self.ctx.market.quotes(t)
        }
        world.compute.refuse = {
            q.pool: "InsufficientInstanceCapacity"
            for q in self.ctx.market.quotes(t)
            if not self.ctx.can_launch(q.pool, t)
        }

    def decide(self, status: JobStatus) -> Decision:
        if self.failed is not None:
            return Decision(pool=None, give_up=self.failed)
        if status.running is not None:
            return Decision(pool=status.running)
        self._at(status.t)
        world = self.world
        for _ in range(100):
            placed = place_step("job", store=world.store, compute=world.compute, clock=world.clock, context=CONTEXT)
            if placed.action == "fail":
                self.failed = f"{placed.error}: {placed.cause}"
                return Decision(pool=None, give_up=self.failed)
            if placed.action == "wait":
                return Decision(pool=None, recheck_at=status.t + placed.wait_seconds / 3600, market_blind=True)
            self.tokens += 1
            token = f"token-{self.tokens}"
            try:
                launched = launch_step(
                    "job", token, store=world.store, compute=world.compute, clock=world.clock, context=CONTEXT
                )
            except InsufficientInstanceCapacity:
                continue  # the state machine goes back to Place
            world.workflow.open_task(token)
            attempt = world.mark_running("job", int(launched["attempt"]))
            return Decision(pool=attempt.pool)
        raise AssertionError("Place and Launch went round 100 times")

    def on_preempted(self, status: JobStatus, pool: Pool, ran_hours: float) -> None:
        """EC2's warning (ec2_events), the agent's final checkpoint, the Run task failed, then Recover."""
        self._at(status.t)
        world = self.world
        job = world.job("job")
        attempt = world.attempt("job", job.attempts)
        assert attempt.instance_id is not None
        warned_at = world.clock.now() - timedelta(minutes=2)
        warning = recorded_event(
            EVENTS, "spot-interruption-warning.json", instance_id=attempt.instance_id, at=warned_at
        )
        handle_ec2_event(
            warning,
            store=world.store,
            workflow=world.workflow,
            compute=world.compute,
            block_minutes=INTERRUPTION_BLOCK_MINUTES,  # the stack's default
        )
        world.checkpoint(
            "job", attempt=attempt.attempt, seq=attempt.attempt, work_done_hours=status.work_done, final=True
        )
        recovered = world.recover("job", error("SpotInterrupted"))
        if recovered.action == "fail":
            self.failed = f"{recovered.error}: {recovered.cause}"


def runs(result: JobResult) -> list[tuple[str, str, Market]]:
    """The pools the job ran in, in order (each attempt's first segment)."""
    pools: list[tuple[str, str, Market]] = []
    for segment in result.segments:
        if segment.kind == "overhead":
            pools.append((segment.pool.instance_type, segment.pool.availability_zone, segment.pool.market))
    return pools


def both(job: BenchJob, spot: SpotMarket) -> tuple[JobResult, JobResult]:
    ctx = JobContext(job, MarketView(spot))
    bench = simulate(ctx, ALL_POLICIES["spotrelay"], keep_timeline=True)
    steps = simulate(JobContext(job, MarketView(spot)), LambdaSteps, keep_timeline=True)
    return bench, steps


@pytest.mark.parametrize(
    "recovery", [RecoveryStrategyName.EAGER_NEXT_POOL, RecoveryStrategyName.SAME_POOL_FIRST], ids=lambda r: r.value
)
def test_the_bench_and_the_lambda_steps_run_a_job_through_the_same_pools_in_the_same_order(
    recovery: RecoveryStrategyName,
) -> None:
    # Given three zones, the cheapest losing its capacity twice and the next once
    spot = market(
        {
            "us-east-1a": [1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1] * 3,
            "us-east-1b": [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1] * 3,
            "us-east-1c": [1] * 36,
        }
    )
    job = bench_job(["us-east-1a", "us-east-1b", "us-east-1c"], recovery)

    # When the bench's spotrelay and the Lambda steps each run the job
    bench, steps = both(job, spot)

    # Then they ran it in the same pools and markets, in the same order, with the same interruptions,
    # finished at the same time and paid the same
    assert runs(bench) == runs(steps)
    assert len(runs(bench)) >= 3  # it was interrupted and moved (the market did its part)
    assert bench.interruptions == steps.interruptions
    assert bench.completion_hours == pytest.approx(steps.completion_hours)
    assert bench.cost == pytest.approx(steps.cost)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    zone_a=st.lists(st.integers(0, 1), min_size=6, max_size=24),
    zone_b=st.lists(st.integers(0, 1), min_size=6, max_size=24),
    recovery=st.sampled_from([RecoveryStrategyName.EAGER_NEXT_POOL, RecoveryStrategyName.SAME_POOL_FIRST]),
)
def test_on_any_small_two_zone_market_the_bench_and_the_lambda_steps_agree(
    zone_a: list[int], zone_b: list[int], recovery: RecoveryStrategyName
) -> None:
    # Given two zones whose capacity comes and goes hour by hour (and returns for good after the trace)
    spot = market({"us-east-1a": [*zone_a, *[1] * 40], "us-east-1b": [*zone_b, *[1] * 40]})
    job = bench_job(["us-east-1a", "us-east-1b"], recovery, work=4.0)

    # When both run the job
    bench, steps = both(job, spot)

    # Then the same pools, in the same order, the same interruptions and the same end
    assert runs(bench) == runs(steps)
    assert bench.interruptions == steps.interruptions
    assert bench.completion_hours == pytest.approx(steps.completion_hours)
    assert bench.rescued == steps.rescued
