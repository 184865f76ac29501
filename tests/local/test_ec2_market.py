"""The spot market behind moto's EC2 API, seen through boto3 and through spotrelay's own EC2 adapter."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.aws.compute import Ec2Compute
from spotrelay.control.ports import LaunchRefused, LaunchRequest
from spotrelay.local import LocalRuntime, VirtualClock
from spotrelay.market import MarketBuilder
from spotrelay.models import Market, Pool

from .conftest import START


@pytest.fixture
def ec2_runtime(clock: VirtualClock) -> Iterator[LocalRuntime]:
    """No stack: moto's EC2 with the market behind it. g6.xlarge/us-east-1a costs 0.35 $/h, 0.45 from 2 h;
    g5.xlarge/us-east-1a has no capacity from 1 h to 3 h."""
    market = (
        MarketBuilder(START)
        .add_price("g6.xlarge", "us-east-1a", 0.35)
        .add_price("g6.xlarge", "us-east-1a", 0.45, at=2.0)
        .add_price("g5.xlarge", "us-east-1a", 0.50)
        .add_outage("g5.xlarge", "us-east-1a", 1.0, 3.0)
        .build()
    )
    with LocalRuntime(clock=clock, market=market) as local:
        yield local


def run_spot(runtime: LocalRuntime, instance_type: str, zone: str, **extra: Any) -> Any:
    return runtime.ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType=instance_type,  # type: ignore[arg-type]
        Placement={"AvailabilityZone": zone},
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": extra.pop("spot_options", {})},
        **extra,
    )


def error_of(excinfo: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = excinfo.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_spot_price_history_is_the_market_at_the_virtual_now(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    def prices() -> list[tuple[str, str, str]]:
        history = ec2_runtime.ec2.describe_spot_price_history(
            InstanceTypes=["g6.xlarge"], ProductDescriptions=["Linux/UNIX"], StartTime=clock.now()
        )["SpotPriceHistory"]
        return [(e["AvailabilityZone"], e["SpotPrice"], e["Timestamp"].isoformat()) for e in history]

    # At the start: the constant price, stamped now; the change at 2 h is not published yet
    assert prices() == [("us-east-1a", "0.350000", START.isoformat())]
    # After 2 h: the new price, stamped when it took effect
    clock.advance_to(START + timedelta(hours=2, minutes=30))
    assert prices() == [("us-east-1a", "0.450000", (START + timedelta(hours=2)).isoformat())]


def test_a_pool_without_capacity_refuses_like_ec2(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    clock.advance_to(START + timedelta(hours=1))
    with pytest.raises(ClientError) as refused:
        run_spot(ec2_runtime, "g5.xlarge", "us-east-1a")
    assert error_of(refused) == ("InsufficientInstanceCapacity", 500)
    # the outage ends at 3 h
    clock.advance_to(START + timedelta(hours=3))
    run_spot(ec2_runtime, "g5.xlarge", "us-east-1a")
    assert ec2_runtime.market is not None
    assert [(r.pool.offering, r.code, r.at) for r in ec2_runtime.market.refusals] == [
        ("g5.xlarge:us-east-1a", "InsufficientInstanceCapacity", START + timedelta(hours=1))
    ]


def test_a_refusal_keeps_the_tags_the_request_asked_for(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    # The replay names the job a refused launch was for: the instance tags of the request
    clock.advance_to(START + timedelta(hours=1))
    with pytest.raises(ClientError):
        run_spot(
            ec2_runtime,
            "g5.xlarge",
            "us-east-1a",
            TagSpecifications=[
                {"ResourceType": "volume", "Tags": [{"Key": "spotrelay:job-id", "Value": "not-this"}]},
                {"ResourceType": "instance", "Tags": [{"Key": "spotrelay:job-id", "Value": "resnet50-1"}]},
            ],
        )
    assert ec2_runtime.market is not None
    assert [dict(r.tags) for r in ec2_runtime.market.refusals] == [{"spotrelay:job-id": "resnet50-1"}]


def test_a_max_price_below_the_spot_price_is_refused(ec2_runtime: LocalRuntime) -> None:
    with pytest.raises(ClientError) as refused:
        run_spot(ec2_runtime, "g6.xlarge", "us-east-1a", spot_options={"MaxPrice": "0.30"})
    assert error_of(refused) == ("SpotMaxPriceTooLow", 400)
    run_spot(ec2_runtime, "g6.xlarge", "us-east-1a", spot_options={"MaxPrice": "0.35"})  # equal is fine


def test_a_pool_the_market_does_not_offer_is_unsupported(ec2_runtime: LocalRuntime) -> None:
    with pytest.raises(ClientError) as refused:
        run_spot(ec2_runtime, "g6.xlarge", "us-east-1b")
    assert error_of(refused) == ("Unsupported", 400)


def test_the_same_client_token_gets_the_same_instance(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    clock.advance_to(START + timedelta(minutes=10))
    first = run_spot(ec2_runtime, "g6.xlarge", "us-east-1a", ClientToken="job-1-attempt-1")
    again = run_spot(ec2_runtime, "g6.xlarge", "us-east-1a", ClientToken="job-1-attempt-1")
    assert again["Instances"][0]["InstanceId"] == first["Instances"][0]["InstanceId"]
    assert first["Instances"][0]["LaunchTime"] == START + timedelta(minutes=10)
    assert ec2_runtime.market is not None
    (launch,) = ec2_runtime.market.launches
    assert launch.pool == Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.SPOT)
    assert (launch.at, launch.spot_price, launch.client_token) == (
        START + timedelta(minutes=10),
        0.35,
        "job-1-attempt-1",
    )
    with pytest.raises(ClientError) as mismatch:
        run_spot(ec2_runtime, "g5.xlarge", "us-east-1a", ClientToken="job-1-attempt-1")
    assert error_of(mismatch) == ("IdempotentParameterMismatch", 400)


def test_p3_types_are_known(ec2_runtime: LocalRuntime) -> None:
    described = ec2_runtime.ec2.describe_instance_types(InstanceTypes=["p3.2xlarge", "p3.8xlarge"])["InstanceTypes"]
    facts = {t["InstanceType"]: (t["VCpuInfo"]["DefaultVCpus"], t["GpuInfo"]["Gpus"][0]["Count"]) for t in described}
    assert facts == {"p3.2xlarge": (8, 1), "p3.8xlarge": (32, 4)}


def test_spotrelays_ec2_adapter_sees_the_market(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    # Given the adapter the launch and place functions use, on a launch template in moto
    ec2 = ec2_runtime.ec2
    template_id = ec2.create_launch_template(
        LaunchTemplateName="workers", LaunchTemplateData={"ImageId": "ami-12c6146b"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    subnet = ec2.create_subnet(
        VpcId=ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"],
        CidrBlock="10.0.0.0/24",
        AvailabilityZone="us-east-1a",
    )["Subnet"]["SubnetId"]
    compute = Ec2Compute(ec2, launch_template_id=template_id, region="us-east-1")
    clock.advance_to(START + timedelta(hours=1))
    # When it reads prices, Then it gets the market's
    quotes = {q.pool.offering: q.usd_per_hour for q in compute.spot_prices(["g6.xlarge", "g5.xlarge"], [], clock.now())}
    assert quotes == {"g5.xlarge:us-east-1a": 0.5, "g6.xlarge:us-east-1a": 0.35}
    # When it launches into the pool in an outage, Then it sees EC2's refusal, as on AWS
    pool = Pool(instance_type="g5.xlarge", availability_zone="us-east-1a", market=Market.SPOT)
    request = LaunchRequest(
        job_id="j1", job_name="j", attempt=1, pool=pool, subnet_id=subnet, max_price=3.0, client_token="t1"
    )
    with pytest.raises(LaunchRefused) as refused:
        compute.launch(request)
    assert refused.value.code == "InsufficientInstanceCapacity"
    instance_id = compute.launch(
        request.model_copy(update={"pool": pool.model_copy(update={"instance_type": "g6.xlarge"})})
    )
    assert ec2_runtime.market is not None
    assert ec2_runtime.market.launch_of(instance_id) is not None


# --- CreateFleet (Type instant) ------------------------------------------------------------------------

JOB_TAGS = [{"ResourceType": "instance", "Tags": [{"Key": "spotrelay:job-id", "Value": "resnet50-1"}]}]


@pytest.fixture
def fleet_runtime(clock: VirtualClock) -> Iterator[LocalRuntime]:
    """No stack: moto's EC2 on a market with amounts of capacity. g6.xlarge/us-east-1a 0.35 $/h, 2 instances;
    g6.xlarge/us-east-1b 0.40, unlimited; g5.xlarge/us-east-1a 0.50, 8 instances."""
    market = (
        MarketBuilder(START)
        .add_price("g6.xlarge", "us-east-1a", 0.35)
        .add_capacity("g6.xlarge", "us-east-1a", [], initial=2)
        .add_price("g6.xlarge", "us-east-1b", 0.40)
        .add_price("g5.xlarge", "us-east-1a", 0.50)
        .add_capacity("g5.xlarge", "us-east-1a", [], initial=8)
        .build()
    )
    with LocalRuntime(clock=clock, market=market) as local:
        yield local


def launch_template(runtime: LocalRuntime) -> str:
    """A launch template in moto with an image and an instance tag of its own."""
    return runtime.ec2.create_launch_template(
        LaunchTemplateName="workers",
        LaunchTemplateData={
            "ImageId": "ami-12c6146b",
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "team", "Value": "ml"}]}],
        },
    )["LaunchTemplate"]["LaunchTemplateId"]


def override(instance_type: str, zone: str, **extra: Any) -> dict[str, Any]:
    return {"InstanceType": instance_type, "AvailabilityZone": zone, **extra}


def create_fleet(
    runtime: LocalRuntime,
    template_id: str,
    overrides: list[dict[str, Any]],
    total: int = 1,
    default_type: str = "spot",
    fleet_type: str = "instant",
    **extra: Any,
) -> Any:
    """A fleet (instant unless told) on the launch template, tagged for job resnet50-1."""
    request: dict[str, Any] = {
        "Type": fleet_type,
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Latest"},
                "Overrides": overrides,
            }
        ],
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": total,
            "DefaultTargetCapacityType": default_type,
            **extra.pop("target", {}),
        },
        "TagSpecifications": JOB_TAGS,
        **extra,
    }
    return runtime.ec2.create_fleet(**request)


def placed(runtime: LocalRuntime, fleet: Any) -> list[tuple[str, str, str]]:
    """(instance type, zone, lifecycle) of each instance the fleet answered with, as DescribeInstances has them."""
    ids = [i for entry in fleet["Instances"] for i in entry["InstanceIds"]]
    if not ids:
        return []
    described = runtime.ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return sorted(
        (i["InstanceType"], i["Placement"]["AvailabilityZone"], i.get("InstanceLifecycle", "on-demand"))
        for reservation in described
        for i in reservation["Instances"]
    )


def fleet_errors(fleet: Any) -> list[tuple[str, str, str, str]]:
    """(instance type, zone, lifecycle, error code) of each override the fleet could not use."""
    return [
        (
            e["LaunchTemplateAndOverrides"]["Overrides"]["InstanceType"],
            e["LaunchTemplateAndOverrides"]["Overrides"]["AvailabilityZone"],
            e["Lifecycle"],
            e["ErrorCode"],
        )
        for e in fleet["Errors"]
    ]


def test_lowest_price_fleet_launches_in_the_cheapest_pool(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    # Given a launch template and two spot pools: g6.xlarge/1a at 0.35 and g5.xlarge/1a at 0.50
    template_id = launch_template(ec2_runtime)
    clock.advance_to(START + timedelta(minutes=10))
    # When an instant fleet asks for one spot instance, lowest price first
    fleet = create_fleet(
        ec2_runtime,
        template_id,
        [override("g5.xlarge", "us-east-1a"), override("g6.xlarge", "us-east-1a", MaxPrice="0.60")],
        SpotOptions={"AllocationStrategy": "lowest-price"},
    )
    # Then EC2's answer names the cheapest override, and no error
    (entry,) = fleet["Instances"]
    (instance_id,) = entry["InstanceIds"]
    assert entry == {
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "1"},
            "Overrides": {"InstanceType": "g6.xlarge", "AvailabilityZone": "us-east-1a", "MaxPrice": "0.60"},
        },
        "Lifecycle": "spot",
        "InstanceIds": [instance_id],
        "InstanceType": "g6.xlarge",
    }
    assert fleet["Errors"] == []
    # And the instance runs there, as a spot instance started at the virtual now, with both sets of tags
    (reservation,) = ec2_runtime.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    (instance,) = reservation["Instances"]
    assert (instance["InstanceType"], instance["Placement"]["AvailabilityZone"]) == ("g6.xlarge", "us-east-1a")
    assert instance["InstanceLifecycle"] == "spot"
    assert instance["LaunchTime"] == START + timedelta(minutes=10)
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert (tags["spotrelay:job-id"], tags["team"]) == ("resnet50-1", "ml")
    # And the market recorded the launch as the replay adopts it: pool, price, max price, tags
    assert ec2_runtime.market is not None
    (launch,) = ec2_runtime.market.launches_of("spotrelay:job-id", "resnet50-1")
    assert launch.instance_id == instance_id
    assert launch.pool == Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.SPOT)
    assert (launch.at, launch.spot_price, launch.max_price) == (START + timedelta(minutes=10), 0.35, 0.6)
    assert launch.tags["team"] == "ml"
    assert ec2_runtime.market.refusals == []
    # And moto knows the fleet
    (described,) = ec2_runtime.ec2.describe_fleets(FleetIds=[fleet["FleetId"]])["Fleets"]
    assert described["Type"] == "instant"
    assert [i["InstanceIds"] for i in described["Instances"]] == [[instance_id]]


def test_a_pool_in_an_outage_comes_back_in_errors_and_the_next_pool_is_used(
    ec2_runtime: LocalRuntime, clock: VirtualClock
) -> None:
    # Given g5.xlarge/1a preferred (priority 0) over g6.xlarge/1a, and g5.xlarge/1a without capacity from 1 h to 3 h
    template_id = launch_template(ec2_runtime)
    overrides = [override("g5.xlarge", "us-east-1a", Priority=0.0), override("g6.xlarge", "us-east-1a", Priority=1.0)]
    options = {"AllocationStrategy": "capacity-optimized-prioritized"}
    # When a fleet is asked for during the outage
    clock.advance_to(START + timedelta(hours=1))
    during = create_fleet(ec2_runtime, template_id, overrides, SpotOptions=options)
    # Then the preferred pool is an error, as EC2 reports it, and the next one gives the instance
    assert fleet_errors(during) == [("g5.xlarge", "us-east-1a", "spot", "InsufficientInstanceCapacity")]
    assert "sufficient g5.xlarge capacity" in during["Errors"][0]["ErrorMessage"]
    assert placed(ec2_runtime, during) == [("g6.xlarge", "us-east-1a", "spot")]
    # And the refusal is recorded with the job's tags
    assert ec2_runtime.market is not None
    (refusal,) = ec2_runtime.market.refusals
    assert (refusal.pool.offering, refusal.code, refusal.at) == (
        "g5.xlarge:us-east-1a",
        "InsufficientInstanceCapacity",
        START + timedelta(hours=1),
    )
    assert refusal.tags == {"team": "ml", "spotrelay:job-id": "resnet50-1"}
    # When asked again once the outage is over, Then the preferred pool gives it
    clock.advance_to(START + timedelta(hours=3))
    after = create_fleet(ec2_runtime, template_id, overrides, SpotOptions=options)
    assert (after["Errors"], placed(ec2_runtime, after)) == ([], [("g5.xlarge", "us-east-1a", "spot")])


def test_an_override_whose_max_price_is_below_the_spot_price_is_skipped(ec2_runtime: LocalRuntime) -> None:
    # Given the cheapest pool's override capped at 0.30 $/h, below its spot price of 0.35
    template_id = launch_template(ec2_runtime)
    fleet = create_fleet(
        ec2_runtime,
        template_id,
        [override("g6.xlarge", "us-east-1a", MaxPrice="0.30"), override("g5.xlarge", "us-east-1a")],
    )
    # Then it is an error (SpotMaxPriceTooLow) and the dearer pool is used
    assert fleet_errors(fleet) == [("g6.xlarge", "us-east-1a", "spot", "SpotMaxPriceTooLow")]
    assert placed(ec2_runtime, fleet) == [("g5.xlarge", "us-east-1a", "spot")]
    assert ec2_runtime.market is not None
    assert [r.code for r in ec2_runtime.market.refusals] == ["SpotMaxPriceTooLow"]
    assert [(launch.pool.offering, launch.spot_price) for launch in ec2_runtime.market.launches] == [
        ("g5.xlarge:us-east-1a", 0.5)
    ]


FLEET_POOLS = [
    override("g6.xlarge", "us-east-1a"),  # 0.35, 2 instances
    override("g5.xlarge", "us-east-1a"),  # 0.50, 8 instances
    override("g6.xlarge", "us-east-1b"),  # 0.40, unlimited
]


def test_lowest_price_takes_the_next_cheapest_pool_when_the_cheapest_runs_out(fleet_runtime: LocalRuntime) -> None:
    template_id = launch_template(fleet_runtime)
    fleet = create_fleet(
        fleet_runtime, template_id, FLEET_POOLS, total=3, SpotOptions={"AllocationStrategy": "lowest-price"}
    )
    # The cheapest pool gives its 2 instances, the next cheapest the third
    assert placed(fleet_runtime, fleet) == [
        ("g6.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1b", "spot"),
    ]
    assert fleet["Errors"] == []


def test_price_capacity_optimized_takes_the_cheapest_pool_with_capacity_for_the_whole_launch(
    fleet_runtime: LocalRuntime,
) -> None:
    # Given 3 instances wanted: g6.xlarge/1a is cheapest but has 2; g6.xlarge/1b (unlimited) and
    # g5.xlarge/1a (8) can hold them all, g6.xlarge/1b for less
    template_id = launch_template(fleet_runtime)
    fleet = create_fleet(
        fleet_runtime, template_id, FLEET_POOLS, total=3, SpotOptions={"AllocationStrategy": "price-capacity-optimized"}
    )
    assert placed(fleet_runtime, fleet) == [("g6.xlarge", "us-east-1b", "spot")] * 3
    (entry,) = fleet["Instances"]
    assert len(entry["InstanceIds"]) == 3


def test_capacity_optimized_takes_the_pool_with_the_most_capacity(fleet_runtime: LocalRuntime) -> None:
    # Given g6.xlarge/1a (0.35, 2 instances) and g5.xlarge/1a (0.50, 8 instances)
    template_id = launch_template(fleet_runtime)
    fleet = create_fleet(
        fleet_runtime, template_id, FLEET_POOLS[:2], total=2, SpotOptions={"AllocationStrategy": "capacity-optimized"}
    )
    # Then the pool with more capacity, whatever its price
    assert placed(fleet_runtime, fleet) == [("g5.xlarge", "us-east-1a", "spot")] * 2


def test_diversified_spreads_over_every_pool_and_max_total_price_stops_launching(fleet_runtime: LocalRuntime) -> None:
    template_id = launch_template(fleet_runtime)
    spread = create_fleet(
        fleet_runtime, template_id, FLEET_POOLS, total=4, SpotOptions={"AllocationStrategy": "diversified"}
    )
    assert placed(fleet_runtime, spread) == [
        ("g5.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1a", "spot"),
        ("g6.xlarge", "us-east-1b", "spot"),
    ]
    # At most 1.00 $/h in all from g6.xlarge/1b at 0.40: two instances, not the third (no error: a budget)
    capped = create_fleet(fleet_runtime, template_id, FLEET_POOLS[2:], total=3, SpotOptions={"MaxTotalPrice": "1.00"})
    assert (placed(fleet_runtime, capped), capped["Errors"]) == ([("g6.xlarge", "us-east-1b", "spot")] * 2, [])


def test_every_pool_running_out_is_reported(fleet_runtime: LocalRuntime) -> None:
    # Given 3 instances wanted from g6.xlarge/1a alone, which has 2
    template_id = launch_template(fleet_runtime)
    fleet = create_fleet(fleet_runtime, template_id, FLEET_POOLS[:1], total=3)
    assert placed(fleet_runtime, fleet) == [("g6.xlarge", "us-east-1a", "spot")] * 2
    assert fleet_errors(fleet) == [("g6.xlarge", "us-east-1a", "spot", "InsufficientInstanceCapacity")]


def test_on_demand_target_capacity_is_launched_on_demand(ec2_runtime: LocalRuntime, clock: VirtualClock) -> None:
    # Given g5.xlarge/1a without spot capacity (1 h to 3 h), preferred for on-demand (priority 0)
    template_id = launch_template(ec2_runtime)
    clock.advance_to(START + timedelta(hours=1))
    # When a fleet asks for 1 on-demand and 1 spot instance
    fleet = create_fleet(
        ec2_runtime,
        template_id,
        [override("g5.xlarge", "us-east-1a", Priority=0.0), override("g6.xlarge", "us-east-1a", Priority=1.0)],
        total=2,
        target={"OnDemandTargetCapacity": 1},
        OnDemandOptions={"AllocationStrategy": "prioritized"},
    )
    # Then the on-demand instance is in the preferred pool (the market limits spot capacity only), the
    # spot one where there is spot capacity, and the spot outage is the one error
    assert sorted((e["Lifecycle"], e["InstanceType"]) for e in fleet["Instances"]) == [
        ("on-demand", "g5.xlarge"),
        ("spot", "g6.xlarge"),
    ]
    assert placed(ec2_runtime, fleet) == [("g5.xlarge", "us-east-1a", "on-demand"), ("g6.xlarge", "us-east-1a", "spot")]
    assert fleet_errors(fleet) == [("g5.xlarge", "us-east-1a", "spot", "InsufficientInstanceCapacity")]
    assert ec2_runtime.market is not None
    assert sorted(
        (launch.pool.market, launch.pool.instance_type, launch.spot_price) for launch in ec2_runtime.market.launches
    ) == [
        (Market.ON_DEMAND, "g5.xlarge", None),
        (Market.SPOT, "g6.xlarge", 0.35),
    ]
    # And on-demand lowest-price goes by the catalog's on-demand price (g6.xlarge is cheaper than g5.xlarge)
    cheapest = create_fleet(
        ec2_runtime,
        template_id,
        [override("g5.xlarge", "us-east-1a"), override("g6.xlarge", "us-east-1a")],
        default_type="on-demand",
    )
    assert placed(ec2_runtime, cheapest) == [("g6.xlarge", "us-east-1a", "on-demand")]


def test_the_same_client_token_gets_the_same_fleet(ec2_runtime: LocalRuntime) -> None:
    template_id = launch_template(ec2_runtime)
    overrides = [override("g6.xlarge", "us-east-1a")]
    first = create_fleet(ec2_runtime, template_id, overrides, ClientToken="resnet50-1-attempt-1")
    again = create_fleet(ec2_runtime, template_id, overrides, ClientToken="resnet50-1-attempt-1")
    assert (again["FleetId"], again["Instances"]) == (first["FleetId"], first["Instances"])
    assert ec2_runtime.market is not None
    (launch,) = ec2_runtime.market.launches
    assert launch.client_token == "resnet50-1-attempt-1"
    assert len(ec2_runtime.ec2.describe_instances()["Reservations"]) == 1
    with pytest.raises(ClientError) as mismatch:
        create_fleet(ec2_runtime, template_id, overrides, total=2, ClientToken="resnet50-1-attempt-1")
    assert error_of(mismatch) == ("IdempotentParameterMismatch", 400)


def test_fleets_other_than_instant_are_refused(ec2_runtime: LocalRuntime) -> None:
    template_id = launch_template(ec2_runtime)
    with pytest.raises(ClientError) as refused:
        create_fleet(ec2_runtime, template_id, [override("g6.xlarge", "us-east-1a")], fleet_type="maintain")
    assert error_of(refused) == ("UnsupportedOperation", 400)
    assert "instant" in refused.value.response["Error"]["Message"]
    assert ec2_runtime.ec2.describe_instances()["Reservations"] == []
