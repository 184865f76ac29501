"""Ec2Compute on moto: what a launch leaves behind in EC2, prices per pool, and termination that
tolerates instances EC2 no longer knows. Refusals moto never produces are stubbed with botocore's Stubber."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from spotrelay.aws.compute import Ec2Compute
from spotrelay.config import ERROR_LAUNCH_THROTTLED, TAG_ATTEMPT, TAG_JOB_ID, TAG_JOB_NAME, TAG_MANAGED
from spotrelay.control.lifecycle import LaunchThrottled
from spotrelay.control.ports import LaunchRefused, LaunchRequest
from spotrelay.models import Market, Pool

from .aws_resources import IMAGE_ID, REGION, Network

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import InstanceTypeDef

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
FAKE_ID = "i-0123456789abcdef0"


def request(
    network: Network, *, market: Market = Market.SPOT, zone: str = "us-east-1a", token: str = "tok-1"
) -> LaunchRequest:
    return LaunchRequest(
        job_id="job-1",
        job_name="resnet50",
        attempt=2,
        pool=Pool(instance_type="g6.xlarge", availability_zone=zone, market=market),
        subnet_id=network.subnets[zone],
        max_price=0.9 if market is Market.SPOT else None,
        client_token=token,
    )


def describe(ec2: EC2Client, instance_id: str) -> InstanceTypeDef:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def tags_of(resource: InstanceTypeDef) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


# --- launch -----------------------------------------------------------------------------------------


def test_a_spot_launch_makes_one_tagged_spot_instance_in_the_pool(
    compute: Ec2Compute, ec2: EC2Client, network: Network
) -> None:
    # Given a spot launch request for attempt 2 of a job, in us-east-1b
    wanted = request(network, zone="us-east-1b")

    # When it is launched
    instance_id = compute.launch(wanted)

    # Then EC2 has one spot instance of that type, in that subnet and zone, from our launch template,
    # tagged for the job, with its volume tagged the same way
    instance = describe(ec2, instance_id)
    assert instance.get("InstanceLifecycle") == "spot"
    assert instance["InstanceType"] == "g6.xlarge"
    assert instance.get("SubnetId") == network.subnets["us-east-1b"]
    assert instance.get("Placement", {}).get("AvailabilityZone") == "us-east-1b"
    expected_tags = {
        TAG_MANAGED: "true",
        TAG_JOB_ID: "job-1",
        TAG_ATTEMPT: "2",
        TAG_JOB_NAME: "resnet50",
        "Name": "spotrelay-resnet50-2",
    }
    assert tags_of(instance).items() >= expected_tags.items()
    assert tags_of(instance)["aws:ec2launchtemplate:id"] == network.launch_template_id
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [instance_id]}])["Volumes"]
    assert volumes
    assert all({t["Key"]: t["Value"] for t in v.get("Tags", [])}.items() >= expected_tags.items() for v in volumes)


def test_an_on_demand_launch_asks_for_no_spot_market(compute: Ec2Compute, ec2: EC2Client, network: Network) -> None:
    # Given an on-demand request / When it is launched
    instance_id = compute.launch(request(network, market=Market.ON_DEMAND))

    # Then the instance is not a spot instance
    assert "InstanceLifecycle" not in describe(ec2, instance_id)


def test_the_client_token_reaches_ec2_and_moto_does_not_deduplicate_it(
    compute: Ec2Compute, ec2: EC2Client, network: Network
) -> None:
    """On AWS the second RunInstances with the same ClientToken returns the first instance. moto 5.2.5
    records the token but launches again: this canary fails when moto starts honouring it."""
    # Given one launch request sent twice (a retried Lambda)
    first = compute.launch(request(network, token="job-1-2-g6.xlarge-us-east-1a"))
    second = compute.launch(request(network, token="job-1-2-g6.xlarge-us-east-1a"))

    # Then both instances carry the token we sent, and moto made two of them
    assert describe(ec2, first).get("ClientToken") == "job-1-2-g6.xlarge-us-east-1a"
    assert describe(ec2, second).get("ClientToken") == "job-1-2-g6.xlarge-us-east-1a"
    assert first != second


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "VcpuLimitExceeded"])
def test_a_pool_that_cannot_serve_now_is_a_launch_refusal(network: Network, code: str) -> None:
    # Given EC2 answering RunInstances with a capacity, price or quota error (moto never does)
    client = boto3.client("ec2", region_name=REGION)
    compute = Ec2Compute(client, launch_template_id=network.launch_template_id, region=REGION)
    with Stubber(client) as stub:
        stub.add_client_error("run_instances", service_error_code=code, service_message="not now", http_status_code=500)

        # When a launch is tried / Then it is refused with EC2's code, for placement to move on
        with pytest.raises(LaunchRefused) as refused:
            compute.launch(request(network))
    assert refused.value.code == code


def test_a_throttled_launch_is_not_a_refusal_of_the_pool(network: Network) -> None:
    # Given EC2 throttling RunInstances (the account's request rate, once the SDK's own retries are spent)
    client = boto3.client("ec2", region_name=REGION)
    compute = Ec2Compute(client, launch_template_id=network.launch_template_id, region=REGION)
    with Stubber(client) as stub:
        stub.add_client_error(
            "run_instances",
            service_error_code="RequestLimitExceeded",
            service_message="Request limit exceeded.",
            http_status_code=503,
        )

        # When a launch is tried / Then it raises LaunchThrottled, the error name the Run task retries on,
        # and not LaunchRefused, which would block a pool that may well have capacity
        with pytest.raises(LaunchThrottled) as throttled:
            compute.launch(request(network))
    assert not isinstance(throttled.value, LaunchRefused)
    assert type(throttled.value).__name__ == ERROR_LAUNCH_THROTTLED
    assert (throttled.value.code, str(throttled.value)) == (
        "RequestLimitExceeded",
        "RequestLimitExceeded: Request limit exceeded.",
    )


def test_other_launch_errors_propagate(compute: Ec2Compute, network: Network) -> None:
    # Given a request for a subnet that does not exist
    broken = request(network).model_copy(update={"subnet_id": "subnet-00000000000000000"})

    # When it is launched / Then EC2's error reaches the caller unchanged (a misconfiguration, not capacity)
    with pytest.raises(ClientError) as error:
        compute.launch(broken)
    assert not isinstance(error.value, LaunchRefused)
    assert error.value.response["Error"]["Code"] == "InvalidSubnetID.NotFound"


# --- prices -----------------------------------------------------------------------------------------


def test_spot_prices_are_one_quote_per_type_and_zone_asked_for(compute: Ec2Compute) -> None:
    # Given two GPU types and two zones (moto quotes every pool at a fixed price)
    # When their spot prices are asked for
    quotes = compute.spot_prices(["g6.xlarge", "g5.xlarge", "g6.xlarge"], ["us-east-1a", "us-east-1b"], NOW)

    # Then there is exactly one spot quote per (type, zone), and none for other zones
    pools = [(q.pool.instance_type, q.pool.availability_zone, q.pool.market) for q in quotes]
    assert sorted(pools) == sorted(
        (t, z, Market.SPOT) for t in ("g6.xlarge", "g5.xlarge") for z in ("us-east-1a", "us-east-1b")
    )
    assert all(q.usd_per_hour > 0 and q.timestamp is not None for q in quotes)


def test_the_price_in_effect_now_wins_over_older_and_later_ones(network: Network) -> None:
    # Given a price history with three prices for one pool: older, in effect now, and (in a replay) later
    client = boto3.client("ec2", region_name=REGION)
    compute = Ec2Compute(client, launch_template_id=network.launch_template_id, region=REGION)
    history = [
        (NOW - timedelta(hours=3), "0.50"),
        (NOW + timedelta(minutes=5), "0.90"),
        (NOW - timedelta(minutes=20), "0.41"),
    ]
    with Stubber(client) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "AvailabilityZone": "us-east-1a",
                        "InstanceType": "g6.xlarge",
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": price,
                        "Timestamp": stamp,
                    }
                    for stamp, price in history
                ]
            },
            {
                "InstanceTypes": ["g6.xlarge"],
                "ProductDescriptions": ["Linux/UNIX"],
                "StartTime": NOW,
                "Filters": [{"Name": "availability-zone", "Values": ["us-east-1a"]}],
            },
        )

        # When the pool's price is asked for
        quotes = compute.spot_prices(["g6.xlarge"], ["us-east-1a"], NOW)

    # Then it is the latest one stamped at or before now
    assert [(q.usd_per_hour, q.timestamp) for q in quotes] == [(0.41, NOW - timedelta(minutes=20))]


def test_an_attempts_price_history_is_its_pools_prices_oldest_first(network: Network) -> None:
    # Given EC2's answer for a pool over an attempt's life, newest first: the price in effect at the launch
    # (stamped when it took effect, before the launch), a change during the run, and another zone's price
    client = boto3.client("ec2", region_name=REGION)
    compute = Ec2Compute(client, region=REGION)
    launch, end = NOW - timedelta(hours=3), NOW
    entries = [
        ("us-east-1a", NOW - timedelta(hours=1), "0.70"),
        ("us-east-1b", NOW - timedelta(hours=2), "9.00"),
        ("us-east-1a", launch - timedelta(days=2), "0.35"),
    ]
    with Stubber(client) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "AvailabilityZone": zone,
                        "InstanceType": "g6.xlarge",
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": price,
                        "Timestamp": stamp,
                    }
                    for zone, stamp, price in entries
                ]
            },
            {
                "InstanceTypes": ["g6.xlarge"],
                "ProductDescriptions": ["Linux/UNIX"],
                "StartTime": launch,
                "EndTime": end,
                "Filters": [{"Name": "availability-zone", "Values": ["us-east-1a"]}],
            },
        )

        # When the attempt's price history is asked for
        history = compute.spot_price_history(
            Pool(instance_type="g6.xlarge", availability_zone="us-east-1a"), launch, end
        )

    # Then it is that pool's prices, oldest first, each stamped when it took effect
    assert [(q.usd_per_hour, q.timestamp, q.pool.availability_zone) for q in history] == [
        (0.35, launch - timedelta(days=2), "us-east-1a"),
        (0.70, NOW - timedelta(hours=1), "us-east-1a"),
    ]


# --- instances --------------------------------------------------------------------------------------


def test_terminating_an_unknown_instance_is_not_an_error(compute: Ec2Compute, ec2: EC2Client, network: Network) -> None:
    # Given one of our instances, and an id EC2 does not know
    instance_id = compute.launch(request(network))

    # When both are terminated in one call
    compute.terminate([FAKE_ID, instance_id])

    # Then no error is raised, and ours is going away
    assert describe(ec2, instance_id).get("State", {}).get("Name") in {"shutting-down", "terminated"}
    compute.terminate([FAKE_ID])


def test_managed_instances_are_ours_and_alive(compute: Ec2Compute, ec2: EC2Client, network: Network) -> None:
    # Given two instances of ours, one of them terminated, and an instance someone else launched
    alive = compute.launch(request(network, token="a"))
    gone = compute.launch(request(network, token="b"))
    compute.terminate([gone])
    ec2.run_instances(ImageId=IMAGE_ID, MinCount=1, MaxCount=1, SubnetId=network.subnets["us-east-1a"])

    # When the managed instances are listed
    managed = compute.managed_instances()

    # Then only our live one is there, with its tags
    assert [i.instance_id for i in managed] == [alive]
    assert managed[0].tags[TAG_JOB_ID] == "job-1"
    assert managed[0].state in {"pending", "running"}


def test_instance_states_leave_out_ids_ec2_does_not_know(compute: Ec2Compute, network: Network) -> None:
    # Given one of our instances, and an id EC2 does not know
    instance_id = compute.launch(request(network))

    # When their states are asked for together
    states = compute.instance_states([instance_id, FAKE_ID])

    # Then ours has a state and the unknown one is absent
    assert set(states) == {instance_id}
    assert states[instance_id] in {"pending", "running"}
    assert compute.instance_states([]) == {}


def test_the_jobs_tags_are_on_its_instance_and_volumes_beside_spotrelays_own(
    compute: Ec2Compute, ec2: EC2Client, network: Network
) -> None:
    # Given a launch of a job whose spec has tags (its own Name among them)
    tags = {"team": "vision", "cost-center": "ml-42", "Name": "resnet50 sweep"}
    launched = compute.launch(request(network).model_copy(update={"tags": tags}))
    # Then the instance carries them, spotrelay's own tags unchanged beside them
    on_instance = {t["Key"]: t["Value"] for t in describe(ec2, launched).get("Tags", [])}
    assert {k: on_instance[k] for k in tags} == tags
    assert on_instance["spotrelay:job-id"] == "job-1"
    assert on_instance["spotrelay:managed"] == "true"
    # And so do its volumes
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [launched]}])["Volumes"]
    for volume in volumes:
        assert {t["Key"]: t["Value"] for t in volume.get("Tags", [])}["team"] == "vision"
