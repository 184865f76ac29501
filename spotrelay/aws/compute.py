"""`Compute` on EC2: spot prices, one-instance launches from the workers' launch template, termination."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from botocore.exceptions import ClientError

from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID, TAG_JOB_NAME, TAG_MANAGED
from spotrelay.control.lifecycle import LaunchThrottled
from spotrelay.control.ports import InstanceState, LaunchRefused, LaunchRequest
from spotrelay.models import Market, Pool, PriceQuote

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import (
        DescribeInstancesResultTypeDef,
        FilterTypeDef,
        InstanceMarketOptionsRequestTypeDef,
        InstanceTypeDef,
        RunInstancesRequestTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )

logger = logging.getLogger(__name__)

# RunInstances errors that mean "this pool cannot serve us now": placement moves on to the next pool.
# From the EC2 API error-code reference; quota errors are here too, because another family (another
# quota) may still be open. EC2 has no `InsufficientInstanceCapacityException` (that is other services).
LAUNCH_REFUSAL_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "UnfulfillableCapacity",
        "InsufficientFreeAddressesInSubnet",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
    }
)
# RunInstances errors that mean "too many calls now", not "no capacity": EC2 meters each API per account
# and Region with token buckets and answers RequestLimitExceeded past them, the resource-rate buckets of
# RunInstances included (EC2 Developer Guide, Request throttling for the Amazon EC2 API). No pool is blocked.
THROTTLING_CODES = frozenset({"RequestLimitExceeded"})
NOT_FOUND = "InvalidInstanceID.NotFound"
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
PRICE_TYPES_PER_CALL = 50
# An attempt's price series (DescribeSpotPriceHistory answers newest first): bounded, the oldest beyond it
# left to the attempt's launch price (spotrelay.models.billing). EC2 keeps 90 days; its spot prices change
# a few times a day at most.
MAX_PRICE_HISTORY_ENTRIES = 10_000
_INSTANCE_ID = re.compile(r"\bi-[0-9a-f]+\b")


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Ec2Compute:
    """EC2 in one region; instances start from `launch_template_id` (AMI, profile, user data, IMDSv2).
    Functions that only read prices or terminate instances pass no launch template."""

    def __init__(self, client: EC2Client, *, launch_template_id: str | None = None, region: str) -> None:
        self.client = client
        self.launch_template_id = launch_template_id
        self.region = region

    def _launch_template(self) -> str:
        if self.launch_template_id is None:
            raise ValueError("this Ec2Compute was built without a launch template: it cannot launch")
        return self.launch_template_id

    # --- prices -------------------------------------------------------------------------------------

    def spot_prices(self, instance_types: Sequence[str], zones: Sequence[str], now: datetime) -> list[PriceQuote]:
        types = list(dict.fromkeys(instance_types))
        filters: list[FilterTypeDef] = [{"Name": "availability-zone", "Values": list(zones)}] if zones else []
        wanted_zones = set(zones)
        # With StartTime = now, EC2 returns the price in effect at `now` for each pool (plus any later change).
        latest: dict[tuple[str, str], tuple[datetime, float]] = {}
        for chunk in _chunks(types, PRICE_TYPES_PER_CALL):
            pages = self.client.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=[cast("InstanceTypeType", t) for t in chunk],
                ProductDescriptions=["Linux/UNIX"],
                StartTime=now,
                Filters=filters,
            )
            for page in pages:
                for entry in page.get("SpotPriceHistory", []):
                    zone, itype = entry.get("AvailabilityZone", ""), entry.get("InstanceType", "")
                    if not zone or not itype or "SpotPrice" not in entry or (wanted_zones and zone not in wanted_zones):
                        continue
                    stamp = entry.get("Timestamp", now).astimezone(UTC)
                    key = (itype, zone)
                    if key not in latest or _fresher(stamp, latest[key][0], now):
                        latest[key] = (stamp, float(entry["SpotPrice"]))
        return [
            PriceQuote(
                pool=Pool(instance_type=itype, availability_zone=zone, market=Market.SPOT),
                usd_per_hour=price,
                timestamp=stamp,
            )
            for (itype, zone), (stamp, price) in sorted(latest.items())
        ]

    def spot_price_history(self, pool: Pool, start: datetime, end: datetime) -> list[PriceQuote]:
        # "When you specify a start and end time, the operation returns the prices of the instance types within
        # that time range. It also returns the last price change before the start time, which is the effective
        # price as of the start time." (Amazon EC2 API Reference, DescribeSpotPriceHistory,
        # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html)
        end = max(start, end)
        pages = self.client.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=[cast("InstanceTypeType", pool.instance_type)],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=start,
            EndTime=end,
            Filters=[{"Name": "availability-zone", "Values": [pool.availability_zone]}],
            PaginationConfig={"MaxItems": MAX_PRICE_HISTORY_ENTRIES},
        )
        spot = Pool(instance_type=pool.instance_type, availability_zone=pool.availability_zone, market=Market.SPOT)
        found: list[tuple[datetime, float]] = []
        for page in pages:
            for entry in page.get("SpotPriceHistory", []):
                if (entry.get("InstanceType"), entry.get("AvailabilityZone")) != (
                    pool.instance_type,
                    pool.availability_zone,
                ) or "SpotPrice" not in entry:
                    continue
                stamp = entry.get("Timestamp", start).astimezone(UTC)
                if stamp <= end:
                    found.append((stamp, float(entry["SpotPrice"])))
        return [PriceQuote(pool=spot, usd_per_hour=price, timestamp=stamp) for stamp, price in sorted(found)]

    # --- launch -------------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> str:
        pool = request.pool
        if not pool.availability_zone.startswith(self.region):
            raise ValueError(f"{pool} is not in {self.region}")
        tags: list[TagTypeDef] = [
            {"Key": TAG_MANAGED, "Value": "true"},
            {"Key": TAG_JOB_ID, "Value": request.job_id},
            {"Key": TAG_ATTEMPT, "Value": str(request.attempt)},
            {"Key": TAG_JOB_NAME, "Value": request.job_name},
        ]
        # the job's own tags (its `Name`, if it gives one, instead of spotrelay's), never over spotrelay's keys
        ours = {tag["Key"] for tag in tags}
        tags += [{"Key": key, "Value": value} for key, value in request.tags.items() if key not in ours]
        if "Name" not in request.tags:
            tags.append({"Key": "Name", "Value": f"spotrelay-{request.job_name}-{request.attempt}"})
        tag_specs: list[TagSpecificationTypeDef] = [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ]
        params: RunInstancesRequestTypeDef = {
            "MinCount": 1,
            "MaxCount": 1,
            "LaunchTemplate": {"LaunchTemplateId": self._launch_template(), "Version": "$Latest"},
            "InstanceType": cast("InstanceTypeType", pool.instance_type),
            "SubnetId": request.subnet_id,
            "ClientToken": request.client_token,
            "TagSpecifications": tag_specs,
        }
        if pool.market is Market.SPOT:
            market: InstanceMarketOptionsRequestTypeDef = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
            if request.max_price is not None:
                market["SpotOptions"]["MaxPrice"] = str(request.max_price)
            params["InstanceMarketOptions"] = market
        try:
            reservation = self.client.run_instances(**params)
        except ClientError as e:
            code = _error_code(e)
            if code in LAUNCH_REFUSAL_CODES:
                raise LaunchRefused(code, e.response.get("Error", {}).get("Message", "")) from e
            if code in THROTTLING_CODES:
                raise LaunchThrottled(code, e.response.get("Error", {}).get("Message", "")) from e
            raise
        instance_id = reservation["Instances"][0]["InstanceId"]
        logger.info(
            "launched instance",
            extra={
                "job_id": request.job_id,
                "attempt": request.attempt,
                "pool": pool.offering,
                "instance_id": instance_id,
            },
        )
        return instance_id

    # --- instances ----------------------------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> None:
        remaining = list(dict.fromkeys(instance_ids))
        while remaining:
            try:
                self.client.terminate_instances(InstanceIds=remaining)
                return
            except ClientError as e:
                if _error_code(e) != NOT_FOUND:
                    raise
                unknown = set(_INSTANCE_ID.findall(e.response.get("Error", {}).get("Message", "")))
                if not unknown & set(remaining):
                    break  # the message named no id we sent: fall back to one call per instance
                remaining = [i for i in remaining if i not in unknown]
        for instance_id in remaining:
            try:
                self.client.terminate_instances(InstanceIds=[instance_id])
            except ClientError as e:
                if _error_code(e) != NOT_FOUND:
                    raise

    def managed_instances(self) -> list[InstanceState]:
        pages = self.client.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
        )
        return [_instance_state(i) for i in _instances(pages)]

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return {}
        try:
            return self._states(ids)
        except ClientError as e:
            if _error_code(e) != NOT_FOUND:
                raise
        # One id EC2 no longer knows fails the whole call: ask one by one, leaving the unknown ones out.
        states: dict[str, str] = {}
        for instance_id in ids:
            try:
                states.update(self._states([instance_id]))
            except ClientError as e:
                if _error_code(e) != NOT_FOUND:
                    raise
        return states

    def _states(self, ids: list[str]) -> dict[str, str]:
        pages = self.client.get_paginator("describe_instances").paginate(InstanceIds=ids)
        return {i["InstanceId"]: i.get("State", {}).get("Name", "unknown") for i in _instances(pages)}


def _fresher(candidate: datetime, current: datetime, now: datetime) -> bool:
    """The price in effect at `now` is the latest one stamped at or before it (a later one is not yet)."""
    if (candidate <= now) != (current <= now):
        return candidate <= now
    return candidate > current if candidate <= now else candidate < current


def _instances(pages: Iterable[DescribeInstancesResultTypeDef]) -> Iterator[InstanceTypeDef]:
    for page in pages:
        for reservation in page.get("Reservations", []):
            yield from reservation.get("Instances", [])


def _instance_state(instance: InstanceTypeDef) -> InstanceState:
    return InstanceState(
        instance_id=instance["InstanceId"],
        state=instance.get("State", {}).get("Name", "unknown"),
        tags={t["Key"]: t["Value"] for t in instance.get("Tags", []) if "Key" in t and "Value" in t},
        launched_at=instance.get("LaunchTime"),
    )
