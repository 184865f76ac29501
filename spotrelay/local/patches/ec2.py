"""EC2: moto's default AMIs are not loaded, and, with a market (`spotrelay.local.ec2_market`), RunInstances,
TerminateInstances and DescribeSpotPriceHistory go through it and the catalog's GPU types moto lacks are added
to its instance-type tables (see the package's docstring, "EC2"). Siblings: `speed`, `installation`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import moto
from moto.ec2.models import instance_types as moto_instance_types
from moto.ec2.models.amis import AmiBackend
from moto.ec2.responses.instances import InstanceResponse
from moto.ec2.responses.spot_instances import SpotInstances

from spotrelay.local.ec2_market import (
    Ec2Market,
    instance_type_entry,
    missing_instance_types,
    sibling_offerings,
)
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

# (EXPECTED, which the package assembles, lists the canaries of every module in the order they were written:
# this module's are in three groups only to keep that order)

EXPECTED_DEFAULT_AMIS: tuple[Expected, ...] = (
    Expected(moto.settings, "ec2_load_default_amis", "() -> bool"),
    Expected(  # the setting is read when an EC2 backend is made
        AmiBackend,
        "_load_amis",
        "(self) -> 'None'",
        ('if "MOTO_AMIS_PATH" not in os.environ and not settings.ec2_load_default_amis():',),
    ),
)

EXPECTED_MARKET: tuple[Expected, ...] = (
    Expected(InstanceResponse, "run_instances", "(self) -> moto.core.responses.ActionResult"),
    Expected(  # the market tells the replay's instances when the control plane terminates them
        InstanceResponse,
        "terminate_instances",
        "(self) -> moto.core.responses.ActionResult",
        ('instance_ids = self._get_param("InstanceIds", [])',),
    ),
    Expected(SpotInstances, "describe_spot_price_history", "(self) -> moto.core.responses.ActionResult"),
)

EXPECTED_INSTANCE_TYPES: tuple[Expected, ...] = (
    Expected(moto_instance_types, "INSTANCE_TYPES", None),
    Expected(moto_instance_types, "INSTANCE_TYPE_OFFERINGS", None),
    Expected(moto_instance_types.InstanceTypeBackend, "instance_types", None),
    Expected(moto_instance_types.InstanceType, "__init__", "(self, name: str)", ("self.update(INSTANCE_TYPES[name])",)),
)


def _patch_default_amis(patcher: _Patcher) -> None:
    """moto loads its catalogue of public AMIs (10,000 objects, half a second) into every EC2 backend it
    makes; the stack's workers boot the AMI the deploy registers (spotrelay.local.deploy). Off, by the
    function behind moto's own MOTO_EC2_LOAD_DEFAULT_AMIS setting, while the patches are installed (not a
    speed patch: DescribeImages then answers without moto's public AMIs)."""
    patcher.replace(moto.settings, "ec2_load_default_amis", lambda: False)


# --- EC2 -----------------------------------------------------------------------------------------------


def _patch_ec2(patcher: _Patcher, market: Ec2Market) -> None:
    original_run: Callable[[Any], Any] = patcher.original(InstanceResponse, "run_instances")

    def run_instances(self: InstanceResponse) -> Any:
        return market.run_instances(self, original_run)

    patcher.replace(InstanceResponse, "run_instances", run_instances)
    original_terminate: Callable[[Any], Any] = patcher.original(InstanceResponse, "terminate_instances")

    def terminate_instances(self: InstanceResponse) -> Any:
        instance_ids = [str(i) for i in self._get_param("InstanceIds", [])]
        result = original_terminate(self)
        market.terminated(instance_ids)
        return result

    patcher.replace(InstanceResponse, "terminate_instances", terminate_instances)

    def describe_spot_price_history(self: SpotInstances) -> Any:
        return market.describe_spot_price_history(self)

    patcher.replace(SpotInstances, "describe_spot_price_history", describe_spot_price_history)

    types, offerings = _catalog_tables()
    added = [name for name in types if name not in moto_instance_types.INSTANCE_TYPES]
    patcher.replace_contents(moto_instance_types.INSTANCE_TYPES, types)
    patcher.replace_contents(moto_instance_types.INSTANCE_TYPE_OFFERINGS, offerings)
    backend = moto_instance_types.InstanceTypeBackend
    described = [*backend.instance_types, *(moto_instance_types.InstanceType(name) for name in added)]
    patcher.replace(backend, "instance_types", described)


_CATALOG_TABLES: tuple[dict[str, Any], dict[str, Any]] | None = None


def _catalog_tables() -> tuple[dict[str, Any], dict[str, Any]]:
    """moto's instance types and offerings with the catalog's missing GPU types added, built once per
    process from moto's own tables (`install` puts those back at uninstall). Only the containers the
    added rows go into are new; moto's rows are shared and never changed (a deep copy of all of its
    offerings took about a second of every replay)."""
    global _CATALOG_TABLES
    if _CATALOG_TABLES is None:
        original = moto_instance_types.INSTANCE_TYPE_OFFERINGS
        types: dict[str, Any] = dict(moto_instance_types.INSTANCE_TYPES)
        offerings: dict[str, Any] = {kind: dict(by_region) for kind, by_region in original.items()}
        for name in missing_instance_types(types):
            types[name] = instance_type_entry(name, types)
            for location_type, by_region in sibling_offerings(name, original).items():
                regions = offerings.setdefault(location_type, {})
                for region, rows in by_region.items():
                    regions[region] = [*regions.get(region, []), *rows]  # a new list: moto's stays as it was
        _CATALOG_TABLES = types, offerings
    return _CATALOG_TABLES
