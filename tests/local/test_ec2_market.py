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
