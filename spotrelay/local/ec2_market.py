"""The spot market behind moto's EC2 API: prices, capacity and launch refusals from a `SpotMarket`
at the clock's now, so that the handlers' EC2 code path is the same as on AWS.

- DescribeSpotPriceHistory answers from the market: the price in effect at StartTime (default: now)
  and every change up to EndTime (default, and at most: now; the future is not published), newest
  first, as EC2 does.
- RunInstances, for a spot launch (`InstanceMarketOptions.MarketType=spot`):
  a pool the market does not offer (no price) -> `Unsupported` (HTTP 400);
  no capacity at now, or capacity EC2 is taking back (gone within the two-minute interruption notice
  its instances there are given) -> `InsufficientInstanceCapacity` (HTTP 500, as EC2 answers it);
  spot price above `SpotOptions.MaxPrice` -> `SpotMaxPriceTooLow` (HTTP 400);
  otherwise what `refusal_faults` answers, if set (spotrelay.local.chaos: refusals at random).
  On-demand launches always succeed (the market models spot capacity only).
- `ClientToken`: the same token (same account and region) answers with the same reservation, as EC2
  does; the same token with other parameters -> `IdempotentParameterMismatch`.
- Every launch and refusal is recorded (`launches`, `refusals`) with its pool, market and virtual
  time, and the instance's tags (for a refusal, the instance tags the request asked for), so that the
  replay can bind events to a job's attempt; the instance's LaunchTime is the virtual now.
- The catalog's GPU types moto does not know (p3.2xlarge, p3.8xlarge, p3.16xlarge) are added to
  moto's instance-type table (see `add_missing_instance_types`).

Capacity is a pool's capacity at now, in instances (a trace's value; unlimited without one); launches
do not consume it from one request to the next (an availability trace says whether a pool can give
us instances). CreateFleet is not modelled: spotrelay launches with RunInstances only (a CreateFleet
gets stock moto's, which ignores the market).
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

from spotrelay.catalog import INSTANCE_TYPES as CATALOG
from spotrelay.local.clock import SimulationClock
from spotrelay.market import SpotMarket
from spotrelay.models import Market, Pool

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
DEFAULT_PRODUCT = "Linux/UNIX"


@dataclass(frozen=True)
class Launch:
    """An instance the market let us start."""

    instance_id: str
    pool: Pool
    at: datetime
    spot_price: float | None  # the pool's spot price at launch (None on-demand)
    max_price: float | None
    client_token: str | None
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """A RunInstances the market refused."""

    pool: Pool
    at: datetime
    code: str
    message: str
    client_token: str | None
    tags: Mapping[str, str] = field(default_factory=dict)  # the instance tags the request asked for


@dataclass(frozen=True)
class Ec2Error:
    code: str
    message: str
    status: int

    def response(self) -> tuple[str, dict[str, Any]]:
        """EC2's error document (what moto's serializer would write, with EC2's HTTP status)."""
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Response><Errors><Error><Code>{escape(self.code)}</Code><Message>{escape(self.message)}</Message>"
            f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
        )
        return body, {"status": self.status, "Content-Type": "text/xml"}


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    text = str(value).strip()
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# The same ClientToken with other parameters
IDEMPOTENT_PARAMETER_MISMATCH = Ec2Error(
    "IdempotentParameterMismatch",
    "The client token you have provided is associated with a request that had different parameters.",
    400,
)


def insufficient_capacity(pool: Pool) -> Ec2Error:
    return Ec2Error(
        "InsufficientInstanceCapacity",
        f"We currently do not have sufficient {pool.instance_type} capacity in the Availability Zone you "
        f"requested ({pool.availability_zone}). Our system will be working on provisioning additional "
        "capacity.",
        500,
    )


class Ec2Market:
    """A SpotMarket seen through EC2 at the clock's now. Thread-safe."""

    def __init__(self, market: SpotMarket, clock: SimulationClock) -> None:
        self.market = market
        self.clock = clock
        self.launches: list[Launch] = []
        self.refusals: list[Refusal] = []
        self._lock = threading.RLock()
        self._launched = threading.Condition(self._lock)
        self._by_token: dict[tuple[str, str, str], tuple[Any, tuple[Any, ...]]] = {}
        self.terminate_listeners: list[Callable[[Sequence[str]], None]] = []  # told of every TerminateInstances
        # spotrelay.local.chaos: asked about a spot launch the market itself would let through (None: let it)
        self.refusal_faults: Callable[[Pool], Ec2Error | None] | None = None

    def terminated(self, instance_ids: Sequence[str]) -> None:
        """TerminateInstances went through for these instances (whoever called it)."""
        for listener in list(self.terminate_listeners):
            listener(list(instance_ids))

    # --- queries the replay uses -------------------------------------------------------------------

    def launch_of(self, instance_id: str) -> Launch | None:
        with self._lock:
            return next((launch for launch in self.launches if launch.instance_id == instance_id), None)

    def launches_of(self, tag_key: str, tag_value: str) -> list[Launch]:
        with self._lock:
            return [launch for launch in self.launches if launch.tags.get(tag_key) == tag_value]

    def wait_for_launches(self, count: int, timeout: float) -> list[Launch]:
        """The launches, once there are at least `count` (a bounded real-time wait, for a stack served on
        the wall clock); TimeoutError after `timeout` seconds."""
        with self._launched:
            if not self._launched.wait_for(lambda: len(self.launches) >= count, timeout=timeout):
                raise TimeoutError(f"{len(self.launches)} launches after {timeout:g} s, expected {count}")
            return list(self.launches)

    def hours(self, when: datetime | None = None) -> float:
        """`when` (default: now) on the market's time axis."""
        return self.market.to_hours(when or self.clock.now())

    # --- DescribeSpotPriceHistory ------------------------------------------------------------------

    def spot_price_history(
        self,
        *,
        region: str,
        instance_types: Iterable[str] = (),
        zones: Iterable[str] = (),
        products: Iterable[str] = (),
        start: datetime | None = None,
        end: datetime | None = None,
    ) -> list[dict[str, str]]:
        now = self.clock.now()
        end_at = min(end or now, now)
        start_at = min(start or end_at, end_at)
        from_t, to_t = self.market.to_hours(start_at), self.market.to_hours(end_at)
        types, wanted_zones = set(instance_types), set(zones)
        product = next(iter(products), DEFAULT_PRODUCT) or DEFAULT_PRODUCT
        entries: list[tuple[datetime, str, str, float]] = []
        for pool in self.market.pools():
            zone = pool.availability_zone
            if not zone.startswith(region) or (types and pool.instance_type not in types):
                continue
            if wanted_zones and zone not in wanted_zones:
                continue
            for t, price in self.market.price_changes(pool, from_t, to_t):
                entries.append((self.market.to_datetime(t), pool.instance_type, zone, price))
        entries.sort(key=lambda e: (-e[0].timestamp(), e[1], e[2]))
        return [
            {
                "InstanceType": itype,
                "ProductDescription": product,
                "SpotPrice": f"{price:.6f}",
                "AvailabilityZone": zone,
                "Timestamp": _iso(stamp),
            }
            for stamp, itype, zone, price in entries
        ]

    # --- RunInstances ------------------------------------------------------------------------------

    def refusal(self, pool: Pool, max_price: float | None) -> Ec2Error | None:
        """Why EC2 would refuse to start one instance in `pool` now (None: it would not)."""
        if pool.market is not Market.SPOT:
            return None
        t = self.hours()
        price = self.market.price(pool, t)
        if price is None:
            return Ec2Error(
                "Unsupported",
                f"Your requested instance type ({pool.instance_type}) is not supported in your requested "
                f"Availability Zone ({pool.availability_zone}).",
                400,
            )
        if self.market.capacity(pool, t) <= 0 or self.market.timeline(pool).reclaiming(t):
            return insufficient_capacity(pool)
        if max_price is not None and price > max_price:
            return Ec2Error(
                "SpotMaxPriceTooLow",
                f"Your Spot request price of {max_price:g} is lower than the minimum required Spot request "
                f"fulfillment price of {price:g}.",
                400,
            )
        return self.refusal_faults(pool) if self.refusal_faults is not None else None

    def run_instances(self, response: Any, original: Callable[[Any], Any]) -> Any:
        """The patched `InstanceResponse.run_instances`: refuse as the market says, honour ClientToken,
        record the launch; otherwise moto's own RunInstances."""
        from moto.core.responses import ActionResult

        param = response._get_param
        token = param("ClientToken")
        backend = response.ec2_backend
        instance_type = param("InstanceType")
        template = param("LaunchTemplate", {}) or {}
        if not instance_type and template:
            instance_type = backend._get_template_from_args(template).data.get("InstanceType")
        zone = param("Placement.AvailabilityZone")
        subnet_id = param("SubnetId")
        if not zone and subnet_id:
            zone = backend.get_subnet(subnet_id).availability_zone
        zone = zone or f"{response.region}a"
        spot = str(param("InstanceMarketOptions.MarketType") or "").lower() == "spot"
        raw_max = param("InstanceMarketOptions.SpotOptions.MaxPrice")
        max_price = float(raw_max) if raw_max not in (None, "") else None
        pool = Pool(
            instance_type=str(instance_type or "m1.small"),
            availability_zone=str(zone),
            market=Market.SPOT if spot else Market.ON_DEMAND,
        )
        fingerprint = (pool, max_price, param("MinCount"), param("MaxCount"), subnet_id)
        key = (str(response.current_account), str(response.region), str(token)) if token else None
        with self._lock:
            if key is not None and key in self._by_token:
                reservation, seen = self._by_token[key]
                if seen != fingerprint:
                    return IDEMPOTENT_PARAMETER_MISMATCH.response()
                return ActionResult(reservation)
            now = self.clock.now()
            error = self.refusal(pool, max_price)
            if error is not None:
                tags = _requested_instance_tags(param("TagSpecification", []) or param("TagSpecifications", []))
                self.refusals.append(Refusal(pool, now, error.code, error.message, token, tags))
                return error.response()
            result = original(response)
            reservation = result.result
            spot_price = self.market.price(pool, self.hours(now)) if spot else None
            for instance in reservation.instances:
                instance.launch_time = now
                tags = {t["key"]: t["value"] for t in instance.get_tags()}
                self.launches.append(
                    Launch(
                        instance_id=instance.id,
                        pool=pool,
                        at=now,
                        spot_price=spot_price,
                        max_price=max_price,
                        client_token=token,
                        tags=tags,
                    )
                )
            if key is not None:
                self._by_token[key] = (reservation, fingerprint)
            self._launched.notify_all()
            return result

    def describe_spot_price_history(self, response: Any) -> Any:
        """The patched `SpotInstances.describe_spot_price_history`."""
        from moto.core.responses import ActionResult

        filters = response._filters_from_querystring() or {}
        history = self.spot_price_history(
            region=str(response.region),
            instance_types=[*response._get_param("InstanceTypes", []), *filters.get("instance-type", [])],
            zones=[
                *([response._get_param("AvailabilityZone")] if response._get_param("AvailabilityZone") else []),
                *filters.get("availability-zone", []),
            ],
            products=[*response._get_param("ProductDescriptions", []), *filters.get("product-description", [])],
            start=_parse_time(response._get_param("StartTime")),
            end=_parse_time(response._get_param("EndTime")),
        )
        return ActionResult({"SpotPriceHistory": history})


# --------------------------------------------------------------------------------- instance types


def missing_instance_types(moto_types: Mapping[str, Any]) -> list[str]:
    return sorted(name for name in CATALOG if name not in moto_types)


def instance_type_entry(name: str, moto_types: Mapping[str, Any]) -> dict[str, Any]:
    """A DescribeInstanceTypes entry for catalog type `name`, shaped like a sibling moto knows."""
    facts = CATALOG[name]
    family = facts.family
    sibling_name = next(
        (n for n in sorted(moto_types) if n.split(".", 1)[0].startswith(family) and "GpuInfo" in moto_types[n]),
        None,
    )
    entry: dict[str, Any] = copy.deepcopy(moto_types[sibling_name]) if sibling_name else {}
    entry.pop("InstanceStorageInfo", None)
    entry["InstanceStorageSupported"] = False
    entry["InstanceType"] = name
    entry["CurrentGeneration"] = True
    entry["SupportedUsageClasses"] = ["on-demand", "spot"]
    entry["MemoryInfo"] = {"SizeInMiB": int(facts.memory_gib * 1024)}
    entry["VCpuInfo"] = {
        "DefaultVCpus": facts.vcpus,
        "DefaultCores": max(1, facts.vcpus // 2),
        "DefaultThreadsPerCore": 2 if facts.vcpus > 1 else 1,
    }
    gpu_mib = int(facts.gpu_memory_gib * 1024)
    entry["GpuInfo"] = {
        "Gpus": [
            {
                "Count": facts.gpu_count,
                "Manufacturer": "NVIDIA",
                "MemoryInfo": {"SizeInMiB": gpu_mib},
                "Name": facts.gpu_model.split("-", 1)[0],
            }
        ],
        "TotalGpuMemoryInMiB": gpu_mib * facts.gpu_count,
    }
    return entry


def sibling_offerings(
    name: str, offerings: Mapping[str, Mapping[str, list[dict[str, Any]]]]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Offerings for `name` wherever a type of its family is offered (location type -> region -> rows)."""
    family = CATALOG[name].family
    added: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for location_type, by_region in offerings.items():
        for region, rows in by_region.items():
            locations = sorted({row["Location"] for row in rows if str(row["InstanceType"]).startswith(f"{family}")})
            if locations:
                added.setdefault(location_type, {})[region] = [
                    {"InstanceType": name, "Location": location, "LocationType": location_type}
                    for location in locations
                ]
    return added


def _requested_instance_tags(specifications: Any) -> dict[str, str]:
    """The instance tags of a RunInstances request's TagSpecifications (the query API's `Tag` list, or
    the `Tags` of a JSON-shaped request)."""
    tags: dict[str, str] = {}
    for specification in specifications if isinstance(specifications, list) else []:
        if not isinstance(specification, dict) or specification.get("ResourceType") != "instance":
            continue
        for tag in specification.get("Tag") or specification.get("Tags") or []:
            if isinstance(tag, dict) and "Key" in tag:
                tags[str(tag["Key"])] = str(tag.get("Value", ""))
    return tags
