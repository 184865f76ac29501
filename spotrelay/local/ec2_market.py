"""The spot market behind moto's EC2 API: prices, capacity and launch refusals from a `SpotMarket`
at the clock's now, so that the handlers' EC2 code path is the same as on AWS.

- DescribeSpotPriceHistory answers from the market: the price in effect at StartTime (default: now)
  and every change up to EndTime (default, and at most: now; the future is not published), newest
  first, as EC2 does.
- RunInstances, for a spot launch (`InstanceMarketOptions.MarketType=spot`):
  a pool the market does not offer (no price) -> `Unsupported` (HTTP 400);
  no capacity at now -> `InsufficientInstanceCapacity` (HTTP 500, as EC2 answers it);
  spot price above `SpotOptions.MaxPrice` -> `SpotMaxPriceTooLow` (HTTP 400);
  otherwise what `refusal_faults` answers, if set (spotrelay.local.chaos: refusals at random).
  On-demand launches always succeed (the market models spot capacity only).
- CreateFleet of Type `instant` launches the target capacity from the request's launch template
  overrides as EC2 documents it (see `CREATE_FLEET_DOCS`), each override being a pool (its instance
  type and its AvailabilityZone, or its subnet's zone):
  TotalTargetCapacity is split into OnDemandTargetCapacity, SpotTargetCapacity and the rest of
  DefaultTargetCapacityType (on-demand when not given, as moto has it), in units of WeightedCapacity
  (default 1; an instance gives its weight, the last one may overshoot the target).
  Spot: an override the market refuses at now (the reasons RunInstances gives, with the override's
  MaxPrice per unit hour times its weight as the instance's max price) is not used and comes back in
  `Errors`; the others are drawn on in the SpotOptions.AllocationStrategy's order (ties: request order):
  `lowest-price` (the default) the cheapest per unit, spread evenly over the InstancePoolsToUseCount
  cheapest (default 1); `diversified` spread evenly over all of them, cheapest first;
  `capacity-optimized` the most capacity first (unlimited first), `capacity-optimized-prioritized` the
  same with Priority (lower first) among equal capacity; `price-capacity-optimized` the cheapest of the
  pools whose capacity holds the whole spot launch, then the others, most capacity first.
  A pool gives one request at most its capacity at now (whole instances); when it runs out the next
  pool in the order takes over; when every usable pool ran out before the target was met, each comes
  back in `Errors` as InsufficientInstanceCapacity. SpotOptions.MaxTotalPrice (the spot prices'
  sum) stops launching once the next instance would exceed it.
  On-demand: always capacity; OnDemandOptions.AllocationStrategy `lowest-price` (the default: the
  catalog's on-demand price per unit; types without one last) or `prioritized` (Priority, lower
  first; unset last) picks one override for the whole on-demand capacity; OnDemandOptions.MaxTotalPrice
  as for spot (types without a catalog price count 0).
  The response is EC2's: `FleetId`, `Instances` (per override and lifecycle: LaunchTemplateAndOverrides,
  Lifecycle, InstanceIds, InstanceType) and `Errors` (LaunchTemplateAndOverrides, Lifecycle, ErrorCode,
  ErrorMessage); the fleet is recorded in moto, so DescribeFleets, DescribeFleetInstances and
  DeleteFleets see it. Instances get the launch template's and the request's instance tags, in the
  override's zone/subnet. Types `request` and `maintain` (moto would launch them ignoring the market),
  InstanceRequirements, MinTargetCapacity, SingleInstanceType and SingleAvailabilityZone ->
  `UnsupportedOperation` (HTTP 400).
- `ClientToken`: the same token (same account and region) answers with the same reservation (the same
  fleet and response, for CreateFleet), as EC2 does; the same token with other parameters ->
  `IdempotentParameterMismatch`.
- Every launch and refusal is recorded (`launches`, `refusals`) with its pool, market and virtual
  time, and the instance's tags (for a refusal, the instance tags the request asked for), so that the
  replay can bind events to a job's attempt; the instance's LaunchTime is the virtual now.
- The catalog's GPU types moto does not know (p3.2xlarge, p3.8xlarge, p3.16xlarge) are added to
  moto's instance-type table (see `add_missing_instance_types`).

Capacity is a pool's capacity at now, in instances (a trace's value; unlimited without one); launches
do not consume it from one request to the next (an availability trace says whether a pool can give
us instances).
"""

from __future__ import annotations

import copy
import json
import math
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

# What CreateFleet does, from EC2's documentation (the API reference of 2016-11-15):
#   https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateFleet.html (request, response),
#   .../API_CreateFleetInstance.html and .../API_CreateFleetError.html (the response's Instances, Errors),
#   .../API_TargetCapacitySpecificationRequest.html (MaxTotalPrice: stop launching once reached),
#   .../API_SpotOptionsRequest.html and .../API_OnDemandOptionsRequest.html (the allocation strategies,
#   InstancePoolsToUseCount), .../API_FleetLaunchTemplateOverridesRequest.html (MaxPrice per unit hour,
#   Priority: the lower the number the higher the priority, unset lowest), and the user guide's
#   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-fleet-allocation-strategy.html
CREATE_FLEET_DOCS = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateFleet.html"
SPOT_ALLOCATION_STRATEGIES = (
    "lowest-price",
    "diversified",
    "capacity-optimized",
    "capacity-optimized-prioritized",
    "price-capacity-optimized",
)
ON_DEMAND_ALLOCATION_STRATEGIES = ("lowest-price", "prioritized")
UNMODELLED_SPOT_OPTIONS = ("MinTargetCapacity", "SingleInstanceType", "SingleAvailabilityZone")
# The request parameters a CreateFleet ClientToken stands for (a retry must repeat them)
FLEET_REQUEST_PARAMETERS = (
    "Type",
    "LaunchTemplateConfigs",
    "TargetCapacitySpecification",
    "SpotOptions",
    "OnDemandOptions",
    "TagSpecifications",
    "ValidFrom",
    "ValidUntil",
)


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


# The same ClientToken with other parameters (RunInstances and CreateFleet alike)
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


# ----------------------------------------------------------------------------------------- CreateFleet


@dataclass(frozen=True)
class FleetOverride:
    """One launch template override of a CreateFleet request (a config without overrides is one too),
    resolved against its launch template version."""

    index: int  # its place in the request (configs, then overrides): EC2's order among equals
    launch_template: Mapping[str, str]  # LaunchTemplateId and the resolved Version, as EC2 answers them
    overrides: Mapping[str, Any]  # as requested (echoed in the response)
    template_tags: Mapping[str, str]  # the launch template's instance tags
    image_id: str
    instance_type: str
    zone: str
    subnet_id: str | None
    max_price: float | None  # per unit hour; None: no limit
    priority: float  # the lower the number, the higher the priority; unset: inf (lowest)
    weight: float  # units of target capacity per instance

    def pool(self, market: Market) -> Pool:
        return Pool(instance_type=self.instance_type, availability_zone=self.zone, market=market)

    @property
    def instance_max_price(self) -> float | None:
        return None if self.max_price is None else self.max_price * self.weight

    def described(self) -> dict[str, Any]:
        """Its `LaunchTemplateAndOverrides`, as the CreateFleet response gives it."""
        described: dict[str, Any] = {"LaunchTemplateSpecification": dict(self.launch_template)}
        if self.overrides:
            described["Overrides"] = dict(self.overrides)
        return described


@dataclass(frozen=True)
class FleetOffer:
    """What one override's pool offers a fleet at now, in one market."""

    override: FleetOverride
    pool: Pool
    price: float | None  # per instance hour: the spot price, or the on-demand list price (None: unknown)
    capacity: float  # instances the pool can give (math.inf: unlimited)

    @property
    def unit_price(self) -> float:
        return math.inf if self.price is None else self.price / self.override.weight


@dataclass(frozen=True)
class FleetFill:
    """How a target capacity was filled from ranked offers."""

    counts: Mapping[int, int]  # override index -> instances
    unmet: float  # units not launched
    over_budget: bool  # stopped by MaxTotalPrice


def rank_offers(strategy: str, offers: Sequence[FleetOffer], units: float) -> list[FleetOffer]:
    """The order in which an allocation strategy draws on the offers for `units` of capacity (ties:
    request order). See the module docstring for what each strategy means here."""

    def holds_all(offer: FleetOffer) -> bool:
        return offer.capacity >= math.ceil(units / offer.override.weight)

    keys: dict[str, Callable[[FleetOffer], tuple[float, ...]]] = {
        "lowest-price": lambda o: (o.unit_price, o.override.index),
        "diversified": lambda o: (o.unit_price, o.override.index),
        "prioritized": lambda o: (o.override.priority, o.override.index),
        "capacity-optimized": lambda o: (-o.capacity, o.override.index),
        "capacity-optimized-prioritized": lambda o: (-o.capacity, o.override.priority, o.override.index),
        "price-capacity-optimized": lambda o: (
            (0, 0, o.unit_price, o.override.index) if holds_all(o) else (1, -o.capacity, o.unit_price, o.override.index)
        ),
    }
    return sorted(offers, key=keys[strategy])


def fill_capacity(ranked: Sequence[FleetOffer], units: float, width: int, max_total_price: float | None) -> FleetFill:
    """Launch `units` from the ranked offers: one instance at a time, in turn from the first `width`
    offers whose pool still has capacity (a pool gives at most its whole instances of capacity, shared
    by the overrides naming it); stop when the next instance would take the hourly cost above
    `max_total_price` (unknown prices count 0)."""
    left = {o.pool: math.floor(o.capacity) if math.isfinite(o.capacity) else math.inf for o in ranked}
    counts: dict[int, int] = {}
    remaining, spent = float(units), 0.0
    while remaining > 0:
        drawing = [o for o in ranked if left[o.pool] > 0][: max(1, width)]
        if not drawing:
            break
        for offer in drawing:
            if remaining <= 0 or left[offer.pool] <= 0:
                continue
            cost = offer.price or 0.0
            if max_total_price is not None and spent + cost > max_total_price + 1e-9:
                return FleetFill(counts, remaining, over_budget=True)
            counts[offer.override.index] = counts.get(offer.override.index, 0) + 1
            left[offer.pool] -= 1
            remaining -= offer.override.weight
            spent += cost
    return FleetFill(counts, max(remaining, 0.0), over_budget=False)


@dataclass
class _FleetSpotInstance:
    """A spot instance of an instant fleet, shaped as moto's `Fleet.spot_requests` entries are read
    (`id`, `instance`, `launch_spec`)."""

    id: str
    instance: Any
    launch_spec: Any


def _invalid(message: str) -> Ec2Error:
    return Ec2Error("InvalidParameterValue", message, 400)


def _optional_float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def _on_demand_price(instance_type: str) -> float | None:
    facts = CATALOG.get(instance_type)
    return facts.on_demand_usd_per_hour if facts is not None else None


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
        self._fleets_by_token: dict[tuple[str, str, str], tuple[dict[str, Any], str]] = {}
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
        if self.market.capacity(pool, t) <= 0:
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

    # --- CreateFleet -------------------------------------------------------------------------------

    def create_fleet(self, response: Any) -> Any:
        """The patched `Fleets.create_fleet`: an `instant` fleet launched from the market at now (see the
        module docstring), its refused overrides in `Errors`; other types are refused."""
        from moto.core.responses import ActionResult

        param = response._get_param
        fleet_type = str(param("Type") or "maintain")
        if fleet_type != "instant":
            return Ec2Error(
                "UnsupportedOperation",
                f"The local spot market models CreateFleet of Type instant only (got {fleet_type}); "
                "launch with an instant fleet or RunInstances.",
                400,
            ).response()
        response.error_on_dryrun()
        token = param("ClientToken")
        fingerprint = json.dumps([param(name) for name in FLEET_REQUEST_PARAMETERS], sort_keys=True, default=str)
        key = (str(response.current_account), str(response.region), str(token)) if token else None
        with self._lock:
            if key is not None and key in self._fleets_by_token:
                answered, seen = self._fleets_by_token[key]
                if seen != fingerprint:
                    return IDEMPOTENT_PARAMETER_MISMATCH.response()
                return ActionResult(copy.deepcopy(answered))
            answer = self._launch_fleet(response, token)
            if isinstance(answer, Ec2Error):
                return answer.response()
            if key is not None:
                self._fleets_by_token[key] = (copy.deepcopy(answer), fingerprint)
            return ActionResult(answer)

    def _launch_fleet(self, response: Any, token: str | None) -> dict[str, Any] | Ec2Error:
        from moto.ec2.utils import random_spot_request_id

        param = response._get_param
        backend = response.ec2_backend
        target: dict[str, Any] = dict(param("TargetCapacitySpecification", {}) or {})
        spot_options: dict[str, Any] = dict(param("SpotOptions", {}) or {})
        on_demand_options: dict[str, Any] = dict(param("OnDemandOptions", {}) or {})
        configs: list[dict[str, Any]] = list(param("LaunchTemplateConfigs", []) or [])
        tag_specifications: list[dict[str, Any]] = list(param("TagSpecifications", []) or [])
        if target.get("TotalTargetCapacity") in (None, ""):
            return Ec2Error("MissingParameter", "The request must contain the parameter TotalTargetCapacity.", 400)
        spot_strategy = str(spot_options.get("AllocationStrategy") or "lowest-price")
        on_demand_strategy = str(on_demand_options.get("AllocationStrategy") or "lowest-price")
        if spot_strategy not in SPOT_ALLOCATION_STRATEGIES:
            return _invalid(f"SpotOptions.AllocationStrategy {spot_strategy!r}: one of {SPOT_ALLOCATION_STRATEGIES}")
        if on_demand_strategy not in ON_DEMAND_ALLOCATION_STRATEGIES:
            return _invalid(
                f"OnDemandOptions.AllocationStrategy {on_demand_strategy!r}: one of {ON_DEMAND_ALLOCATION_STRATEGIES}"
            )
        unmodelled = [name for name in UNMODELLED_SPOT_OPTIONS if spot_options.get(name)]
        if unmodelled:
            return Ec2Error(
                "UnsupportedOperation",
                f"The local spot market does not model SpotOptions.{', SpotOptions.'.join(unmodelled)}.",
                400,
            )
        total = float(target["TotalTargetCapacity"])
        on_demand_units = float(target.get("OnDemandTargetCapacity") or 0)
        spot_units = float(target.get("SpotTargetCapacity") or 0)
        rest = total - on_demand_units - spot_units
        if total <= 0 or rest < 0:
            return _invalid(
                f"TargetCapacitySpecification: TotalTargetCapacity ({total:g}) must be positive and at least "
                f"OnDemandTargetCapacity + SpotTargetCapacity ({on_demand_units + spot_units:g})"
            )
        if str(target.get("DefaultTargetCapacityType") or "on-demand") == "spot":
            spot_units += rest
        else:
            on_demand_units += rest
        overrides = self._fleet_overrides(backend, configs, str(response.region))
        if isinstance(overrides, Ec2Error):
            return overrides

        now = self.clock.now()
        t = self.hours(now)
        request_tags = _requested_instance_tags(tag_specifications)
        refused: list[tuple[FleetOverride, Ec2Error]] = []
        plans: list[tuple[FleetOverride, Market, int]] = []
        if spot_units > 0:
            offers = []
            for override in overrides:
                pool = override.pool(Market.SPOT)
                error = self.refusal(pool, override.instance_max_price)
                if error is not None:
                    refused.append((override, error))
                    continue
                offers.append(FleetOffer(override, pool, self.market.price(pool, t), self.market.capacity(pool, t)))
            ranked = rank_offers(spot_strategy, offers, spot_units)
            width = {"diversified": len(ranked), "lowest-price": int(spot_options.get("InstancePoolsToUseCount") or 1)}
            spot_fill = fill_capacity(
                ranked,
                spot_units,
                width.get(spot_strategy, 1),
                _optional_float(spot_options.get("MaxTotalPrice")),
            )
            if spot_fill.unmet > 0 and not spot_fill.over_budget:  # every usable pool ran out
                refused.extend((offer.override, insufficient_capacity(offer.pool)) for offer in ranked)
            plans.extend(
                (o.override, Market.SPOT, spot_fill.counts[o.override.index])
                for o in ranked
                if spot_fill.counts.get(o.override.index)
            )
        if on_demand_units > 0:
            offers = [
                FleetOffer(o, o.pool(Market.ON_DEMAND), _on_demand_price(o.instance_type), math.inf) for o in overrides
            ]
            ranked = rank_offers(on_demand_strategy, offers, on_demand_units)
            on_demand_fill = fill_capacity(
                ranked, on_demand_units, 1, _optional_float(on_demand_options.get("MaxTotalPrice"))
            )
            plans.extend(
                (o.override, Market.ON_DEMAND, on_demand_fill.counts[o.override.index])
                for o in ranked
                if on_demand_fill.counts.get(o.override.index)
            )

        # The fleet, as moto records one (for DescribeFleets and DeleteFleets); the market launches.
        fleet = backend.create_fleet(
            on_demand_options=on_demand_options,
            spot_options=spot_options,
            target_capacity_specification={
                **target,
                "TotalTargetCapacity": 0,
                "OnDemandTargetCapacity": 0,
                "SpotTargetCapacity": 0,
            },
            launch_template_configs=configs,
            excess_capacity_termination_policy=param("ExcessCapacityTerminationPolicy"),
            replace_unhealthy_instances=param("ReplaceUnhealthyInstances"),
            terminate_instances_with_expiration=param("TerminateInstancesWithExpiration", if_none=True),
            fleet_type="instant",
            valid_from=_parse_time(param("ValidFrom")) or now,
            valid_until=_parse_time(param("ValidUntil")),
            tag_specifications=tag_specifications,
        )
        fleet.target_capacity_specification = target
        fleet.target_capacity = int(total)
        fleet.spot_target_capacity = int(target.get("SpotTargetCapacity") or 0)
        fleet.on_demand_target_capacity = int(target.get("OnDemandTargetCapacity") or 0)

        instances: list[dict[str, Any]] = []
        for override, market, count in plans:
            spot = market is Market.SPOT
            pool = override.pool(market)
            reservation = backend.run_instances(
                override.image_id,
                count,
                None,
                [],
                instance_type=override.instance_type,
                is_instance_type_default=False,
                placement=override.zone,
                region_name=str(response.region),
                subnet_id=override.subnet_id,
                tags={"instance": request_tags},
                instance_market_options="spot" if spot else None,
                launch_template=dict(override.launch_template),
                fleet_id=fleet.id,
                client_token=token,
            )
            spot_price = self.market.price(pool, t) if spot else None
            launch_spec = fleet.launch_specs[override.index]
            for instance in reservation.instances:
                instance.launch_time = now
                if spot:
                    fleet.spot_requests.append(_FleetSpotInstance(random_spot_request_id(), instance, launch_spec))
                    fleet.fulfilled_spot_capacity += override.weight
                else:
                    fleet.on_demand_instances.append(
                        {"id": reservation.id, "instance": instance, "launch_spec": launch_spec}
                    )
                    fleet.fulfilled_on_demand_capacity += override.weight
                fleet.fulfilled_capacity += override.weight
                self.launches.append(
                    Launch(
                        instance_id=instance.id,
                        pool=pool,
                        at=now,
                        spot_price=spot_price,
                        max_price=override.instance_max_price if spot else None,
                        client_token=token,
                        tags={tag["key"]: tag["value"] for tag in instance.get_tags()},
                    )
                )
            instances.append(
                {
                    "LaunchTemplateAndOverrides": override.described(),
                    "Lifecycle": "spot" if spot else "on-demand",
                    "InstanceIds": [instance.id for instance in reservation.instances],
                    "InstanceType": override.instance_type,
                }
            )
        errors = []
        for override, error in refused:
            tags = {**override.template_tags, **request_tags}
            self.refusals.append(Refusal(override.pool(Market.SPOT), now, error.code, error.message, token, tags))
            errors.append(
                {
                    "LaunchTemplateAndOverrides": override.described(),
                    "Lifecycle": "spot",
                    "ErrorCode": error.code,
                    "ErrorMessage": error.message,
                }
            )
        if plans:
            self._launched.notify_all()
        return {"FleetId": fleet.id, "Errors": errors, "Instances": instances}

    def _fleet_overrides(
        self, backend: Any, configs: Sequence[Mapping[str, Any]], region: str
    ) -> list[FleetOverride] | Ec2Error:
        """The request's overrides, in its order, resolved against their launch template versions."""
        overrides: list[FleetOverride] = []
        for config in configs:
            specification = dict(config.get("LaunchTemplateSpecification") or {})
            if not specification.get("LaunchTemplateId") and not specification.get("LaunchTemplateName"):
                return Ec2Error(
                    "MissingParameter",
                    "Each LaunchTemplateConfigs entry needs a LaunchTemplateSpecification with a LaunchTemplateId "
                    "or a LaunchTemplateName.",
                    400,
                )
            version = backend._get_template_from_args(specification)
            data: Mapping[str, Any] = version.data
            template = {"LaunchTemplateId": str(version.template.id), "Version": str(version.number)}
            template_zone = (data.get("Placement") or {}).get("AvailabilityZone")
            template_subnet = next(
                (n.get("SubnetId") for n in data.get("NetworkInterfaces") or [] if n.get("SubnetId")), None
            )
            for requested in config.get("Overrides") or [{}]:
                if requested.get("InstanceRequirements"):
                    return Ec2Error(
                        "UnsupportedOperation",
                        "The local spot market does not model InstanceRequirements overrides: name the InstanceType.",
                        400,
                    )
                instance_type = requested.get("InstanceType") or data.get("InstanceType")
                image_id = requested.get("ImageId") or data.get("ImageId")
                if not instance_type or not image_id:
                    missing = "InstanceType" if not instance_type else "ImageId"
                    return Ec2Error(
                        "MissingParameter",
                        f"The launch template {template['LaunchTemplateId']} (version {template['Version']}) and "
                        f"its override give no {missing}.",
                        400,
                    )
                subnet_id = requested.get("SubnetId")
                zone = requested.get("AvailabilityZone") or (requested.get("Placement") or {}).get("AvailabilityZone")
                if not zone and not subnet_id:
                    zone, subnet_id = template_zone, template_subnet
                if not zone and subnet_id:
                    zone = backend.get_subnet(subnet_id).availability_zone
                weight = float(requested.get("WeightedCapacity") or 1)
                if weight <= 0:
                    return _invalid(f"WeightedCapacity {weight:g}: it must be positive")
                priority = requested.get("Priority")
                overrides.append(
                    FleetOverride(
                        index=len(overrides),
                        launch_template=template,
                        overrides=dict(requested),
                        template_tags=_requested_instance_tags(data.get("TagSpecifications")),
                        image_id=str(image_id),
                        instance_type=str(instance_type),
                        zone=str(zone or f"{region}a"),
                        subnet_id=str(subnet_id) if subnet_id else None,
                        max_price=_optional_float(requested.get("MaxPrice")),
                        priority=math.inf if priority in (None, "") else float(priority),
                        weight=weight,
                    )
                )
        if not overrides:
            return Ec2Error("MissingParameter", "The request must contain the parameter LaunchTemplateConfigs.", 400)
        return overrides


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
