"""What `spotrelay cost` and `spotrelay status` say jobs have cost, at the prices in effect.

An attempt's settled bill is read from its record. One not settled yet (its instance still running, or
its end not reported) is counted as the control plane counts it (spotrelay.models.billing.cost_so_far):
the spot prices in effect from its launch to the end of its billing so far, now for a live instance. Each
pool's price history is read from EC2 once for all the jobs shown (`billing.price_windows`), not once per
attempt. A live instance's figure is an estimate until the instance is gone: its bill ends then, and is
settled then. Prices that cannot be read (no ec2:DescribeSpotPriceHistory, say) leave the attempts they
were for at their launch prices, with a warning: the command still answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotrelay.models import Attempt, Market, Pool, PriceQuote
from spotrelay.models.billing import SeriesKey, cost_so_far, price_windows, series_key

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

    from spotrelay.aws.deployed_stack import JobStatus

# `Compute.spot_price_history`: a pool's spot prices over [start, end], oldest first
PriceHistoryReader = Callable[[Pool, datetime, datetime], list[PriceQuote]]


@dataclass(frozen=True, slots=True)
class PriceHistories:
    """The pools' price histories read for one command (series key -> prices), and why some were not."""

    histories: Mapping[SeriesKey, Sequence[PriceQuote]] = field(default_factory=dict)
    error: str | None = None  # the pools not read count at their launch prices


@dataclass(frozen=True, slots=True)
class JobCost:
    """A job's cost so far at the prices in effect, and the same hours on on-demand."""

    total_usd: float
    live_usd: float  # of it, its live instances'
    on_demand_usd: float
    is_estimate: bool  # a live instance's bill is in it: final once that instance is gone


def read_price_histories(attempts: Iterable[Attempt], now: datetime, read: PriceHistoryReader) -> PriceHistories:
    """The price history of each pool where an attempt's cost needs one, one read per pool over the window
    they all need. The first read that fails ends the reading (an error of access or of the network would
    meet every other): its pool and those after it count at their launch prices."""
    from botocore.exceptions import BotoCoreError, ClientError

    histories: dict[SeriesKey, Sequence[PriceQuote]] = {}
    for key, window in sorted(price_windows(attempts, now).items()):
        try:
            histories[key] = read(window.pool, window.start, window.end)
        except (ClientError, BotoCoreError) as e:
            return PriceHistories(histories, _why(e))
    return PriceHistories(histories)


# A command waits for EC2, not for a retry loop: an endpoint that does not answer is an error in seconds
EC2_CONNECT_TIMEOUT_SECONDS = 10
EC2_ATTEMPTS = 3


def command_ec2_client(region: str | None, endpoint_url: str | None) -> tuple[EC2Client, str | None]:
    """The commands' EC2 client (`prices`, the costs of `cost` and `status`): in `region` (else the AWS
    configuration's) at `endpoint_url`, with a short connect timeout and few retries; and its region."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=EC2_CONNECT_TIMEOUT_SECONDS,
        retries={"mode": "standard", "total_max_attempts": EC2_ATTEMPTS},
    )
    kwargs: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url else {}
    session = boto3.session.Session(region_name=region)
    return session.client("ec2", config=config, **kwargs), session.region_name


def ec2_price_history(region: str | None, endpoint_url: str | None) -> PriceHistoryReader:
    """Spot price histories from EC2 in the stack's region (as `JobsClient.connect` finds it)."""
    from spotrelay.aws.compute import Ec2Compute

    client, region_name = command_ec2_client(region, endpoint_url)
    return Ec2Compute(client, region=region_name or "").spot_price_history


def job_cost(status: JobStatus, prices: PriceHistories, now: datetime) -> JobCost:
    histories = prices.histories
    live = status.live()
    return JobCost(
        total_usd=sum(cost_so_far(a, histories, now) for a in status.attempts),
        live_usd=sum(cost_so_far(a, histories, now) for a in live),
        on_demand_usd=status.on_demand_cost(now),
        is_estimate=any(a.cost_usd is None for a in live),
    )


def spot_price_now(attempt: Attempt, prices: PriceHistories, now: datetime) -> float | None:
    """The spot price in effect now in a live spot attempt's pool, from its history read (None: not read)."""
    if attempt.pool.market is not Market.SPOT:
        return None
    history = prices.histories.get(series_key(attempt.pool))
    known = [q for q in history or () if q.timestamp is None or q.timestamp <= now]
    return known[-1].usd_per_hour if known else None


def _why(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        info = response.get("Error", {})
        return f"{info.get('Code', 'error')}: {info.get('Message', '')}".rstrip(": ")
    return str(error)
