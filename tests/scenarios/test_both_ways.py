"""One decision core, both ways: a small market replayed by the synthesized stack in moto (the Lambdas,
Step Functions, EventBridge and the real agent on the virtual clock) and by the benchmark's engine (the
`spotrelay` policy, spotrelay.bench.policies) runs a job through the same pools and markets, in the same
order, with the same attempt outcomes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from spotrelay.bench.policies import Spotrelay
from spotrelay.bench.sim import BenchJob, JobContext, MarketView, simulate
from spotrelay.config import ENV_ALLOWED_FAMILIES, ENV_SUBNETS
from spotrelay.control.decisions import catalog_on_demand_prices, launchable_types
from spotrelay.local.replay import replay
from spotrelay.local.scenario import Scenario, load_scenario
from spotrelay.market.spec import from_scenario_market
from spotrelay.models import parse_job_spec

from .conftest import REPO_ROOT, SCENARIOS


def stack_placement(template: Path, region: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The zones and GPU families the synthesized stack gives its Place function: its families as written,
    its zones the first of the region's zones (`Fn::Select` of `Fn::GetAZs`, as moto answers it)."""
    resources = json.loads(template.read_text())["Resources"]
    (variables,) = [
        r["Properties"]["Environment"]["Variables"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::Function" and r["Properties"].get("Handler") == "functions/place.handler"
    ]
    selected = [part["Fn::Select"][0] for part in variables[ENV_SUBNETS]["Fn::Join"][1] if "Fn::Select" in part]
    with mock_aws():
        listed = boto3.client("ec2", region_name=region).describe_availability_zones()["AvailabilityZones"]
    zones = sorted(zone["ZoneName"] for zone in listed)
    return tuple(zones[i] for i in selected), tuple(variables[ENV_ALLOWED_FAMILIES].split(","))


SCENARIO: dict[str, Any] = {
    "name": "both-ways",
    "region": "us-east-1",
    "start": "2026-11-30T00:00:00Z",
    "seed": 3,
    "market": {
        "prices": [
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "spot_price_usd_per_hour": 0.35},
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1b", "spot_price_usd_per_hour": 0.40},
            {"instance_type": "g5.xlarge", "availability_zone": "us-east-1a", "spot_price_usd_per_hour": 0.50},
        ],
        # the cheapest pool goes at 1h for five hours; the next at 2.5h for an hour and a half
        "outages": [
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "1h", "to": "6h"},
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1b", "from": "2.5h", "to": "4h"},
        ],
    },
    "jobs": [{"at": "0m", "spec": {"file": str(REPO_ROOT / "events" / "jobs" / "resnet50.yaml")}, "work_hours": 4}],
}


def bench_attempts(scenario: Scenario, template: Path) -> list[tuple[str, str, str, str | None]]:
    """The scenario's one job run by the bench's engine on the scenario's market, with the control plane's
    decisions (the `spotrelay` policy): its attempts' pools, markets and outcomes."""
    (entry,) = scenario.jobs
    assert entry.spec is not None
    data = yaml.safe_load((scenario.base_dir / entry.spec["file"]).read_text()) if "file" in entry.spec else entry.spec
    spec = parse_job_spec(data)
    zones, families = stack_placement(template, scenario.region)
    types = launchable_types(spec, families)
    job = BenchJob(
        name=spec.name,
        spec=spec.model_copy(update={"work_hours": entry.work_hours or spec.work_hours}),
        submit_hours=entry.at,
        restart_overhead_hours=spec.placement.restart_overhead_hours,
        zones=zones,
        instance_types=tuple(types),
        on_demand_prices=catalog_on_demand_prices(types),
        checkpoint_on_notice=spec.checkpoint.grace_seconds > 0,
    )
    market = from_scenario_market(scenario.market, scenario.base_dir, scenario.start)
    policies: list[Spotrelay] = []

    def policy(ctx: JobContext) -> Spotrelay:
        policies.append(Spotrelay(ctx))
        return policies[-1]

    result = simulate(JobContext(job, MarketView(market)), policy)
    assert result.rescued is None
    finished = "SUCCEEDED"  # the engine ends the last attempt when the work is done
    return [
        (a.pool.instance_type, a.pool.availability_zone, str(a.pool.market), str(a.outcome or finished))
        for a in policies[0].attempts
    ]


# The same market with the next pool going 20 s after the cheapest (its capacity is being taken back when
# the job is relaunched: the local EC2 refuses the launch, and the bench does not offer the pool)
STAGGERED: dict[str, Any] = {
    **SCENARIO,
    "name": "both-ways-staggered",
    "market": {
        "prices": SCENARIO["market"]["prices"],
        "outages": [
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "1h", "to": "6h"},
            {"instance_type": "g6.xlarge", "availability_zone": "us-east-1b", "from": "1h0m20s", "to": "4h"},
        ],
    },
}
INLINE = {"both-ways": SCENARIO, "both-ways-staggered": STAGGERED}


@pytest.mark.parametrize("name", ["both-ways", "both-ways-staggered", "interruption-relaunch", "back-to-spot"])
def test_the_moto_replay_and_the_bench_run_a_job_through_the_same_pools(
    name: str, synthesized_template: Path, tmp_path: Path
) -> None:
    # Given a market where the job's pool is lost (and, in back-to-spot, comes back while it runs on-demand)
    if name in INLINE:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(INLINE[name]))
    else:
        path = SCENARIOS / f"{name}.yaml"
    scenario = load_scenario(path)

    # When the stack in moto replays it
    result = replay(scenario, template=synthesized_template)
    (entry,) = result.to_json()["jobs"]
    replayed = [(a["instance_type"], a["availability_zone"], a["market"], a["outcome"]) for a in entry["attempts"]]

    # Then the bench's engine, with the control plane's decisions on the same market, runs the job through
    # the same pools and markets, in the same order, with the same outcomes
    assert entry["state"] == "SUCCEEDED"
    assert result.violations == []
    assert replayed == bench_attempts(scenario, synthesized_template)
    assert len(replayed) >= 2  # the market moved it
