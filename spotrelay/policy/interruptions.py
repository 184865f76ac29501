"""Interruption-rate priors per pool, sharpened by the interruptions we observe ourselves.

The prior is the Spot Instance Advisor's interruption-frequency band for the instance type in the
region (https://aws.amazon.com/ec2/spot/instance-advisor/): "the share of spot instances of this type
that AWS interrupted over the trailing month". The Advisor does not say how long those instances
lived, so no exact hourly rate follows from it. We read a band as the chance that an instance is
interrupted within one day of running (`BAND_WINDOW_HOURS`) — pessimistic for long-lived instances,
which is the safe side for a scheduler that pays for lost work.

Our own observations (k interruptions in h instance-hours in that pool) sharpen the prior as the mean
of a Gamma-Poisson posterior: rate = (prior_rate * PRIOR_WEIGHT_HOURS + k) / (PRIOR_WEIGHT_HOURS + h).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.models import Market, Pool

# The Advisor's bands (index 0..4, labels '<5%' .. '>20%'); the share we take as each band's value
# is its midpoint, and 30% for the open-ended top band.
BAND_SHARES: tuple[float, ...] = (0.025, 0.075, 0.125, 0.175, 0.30)
BAND_LABELS: tuple[str, ...] = ("<5%", "5-10%", "10-15%", "15-20%", ">20%")
# The Advisor's feed gave `global_rate` '<10%' in its 2025 snapshot: a type with no band gets band 1.
DEFAULT_BAND = 1
BAND_WINDOW_HOURS = 24.0
PRIOR_WEIGHT_HOURS = 24.0


def band_hourly_rate(band: int) -> float:
    """Interruptions per instance-hour for an Advisor band (see the module docstring)."""
    share = BAND_SHARES[band]
    return -math.log1p(-share) / BAND_WINDOW_HOURS


class PoolObservation(BaseModel):
    model_config = ConfigDict(frozen=True)

    interruptions: int = Field(default=0, ge=0)
    instance_hours: float = Field(default=0, ge=0)


class InterruptionModel(BaseModel):
    """Expected spot interruptions per instance-hour, per pool. On-demand pools are never interrupted."""

    model_config = ConfigDict(frozen=True)

    bands: Mapping[str, int] = Field(default_factory=dict, description="instance type -> Advisor band 0..4")
    observed: Mapping[str, PoolObservation] = Field(
        default_factory=dict, description="offering 'type:az' -> what we saw there"
    )
    default_band: int = Field(default=DEFAULT_BAND, ge=0, le=4)

    def band(self, instance_type: str) -> int:
        return self.bands.get(instance_type, self.default_band)

    def hourly_rate(self, pool: Pool) -> float:
        if pool.market is Market.ON_DEMAND:
            return 0.0
        prior = band_hourly_rate(self.band(pool.instance_type))
        seen = self.observed.get(pool.offering)
        if seen is None:
            return prior
        return (prior * PRIOR_WEIGHT_HOURS + seen.interruptions) / (PRIOR_WEIGHT_HOURS + seen.instance_hours)

    def describe(self, pool: Pool) -> str:
        if pool.market is Market.ON_DEMAND:
            return "on-demand: not interrupted"
        seen = self.observed.get(pool.offering)
        band = f"Advisor band {BAND_LABELS[self.band(pool.instance_type)]}"
        if seen is None:
            return band
        return f"{band}, sharpened by {seen.interruptions} interruption(s) in {seen.instance_hours:.1f} h here"
