"""`spotrelay prices`: what each pool a job fits costs now on spot, read live from EC2
(DescribeSpotPriceHistory, Linux/UNIX), beside the catalog's on-demand price, and the pool placement
picks.

The pools are the (instance type, AZ) pairs EC2 quotes for the catalog types that fit the job's resources
(`ResourcesSpec.fitting_types`, what placement filters types by). The pick is `place()` called as
`spotrelay place` calls it (`place_from_command_line`), on those quotes. Registered by spotrelay.cli.app;
boto3 is imported when the command runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from spotrelay.catalog import INSTANCE_TYPES, REFERENCE_GPU
from spotrelay.cli.console import fail, out, tables
from spotrelay.cli.costs import command_ec2_client
from spotrelay.cli.job_commands import EndpointOption, JsonOption, RegionOption, utc_now
from spotrelay.models import JobSpec, JobSpecError, Pool, PriceQuote, load_job_spec, parse_job_spec
from spotrelay.policy import InterruptionModel, Placement, place

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

# The region of the catalog's on-demand prices (spotrelay.catalog.instance_types)
CATALOG_PRICE_REGION = "us-east-1"
# The fields of an ad-hoc job (--gpus, --gpu-memory), named as the user typed them in an error
OPTION_FIELDS = {"resources.gpus": "--gpus", "resources.gpu_memory_gib": "--gpu-memory"}


def place_from_command_line(
    spec: JobSpec,
    quotes: Iterable[PriceQuote],
    *,
    work_done_hours: float = 0.0,
    elapsed_hours: float = 0.0,
    blocked: Collection[Pool] = (),
    bands: Mapping[str, int] | None = None,
) -> Placement:
    """`place()` as the commands call it (`spotrelay place`, `spotrelay prices`): the catalog's on-demand
    prices, the Spot Instance Advisor `bands` for the interruption rates (None: the default band), no
    budget spent and no instance running."""
    return place(
        spec,
        quotes,
        work_done_hours=work_done_hours,
        elapsed_hours=elapsed_hours,
        blocked=blocked,
        interruptions=InterruptionModel(bands=bands or {}),
    )


@dataclass(frozen=True, slots=True)
class PoolPrice:
    """One row: a pool the job fits, its spot price now (None: EC2 quotes none there, the on-demand pick
    only), the catalog's on-demand price of its type, and the market placement picks it on (None: not
    picked)."""

    pool: Pool
    spot_usd_per_hour: float | None
    spot_price_since: datetime | None
    on_demand_usd_per_hour: float | None
    picked: str | None

    def to_json_dict(self) -> dict[str, Any]:
        itype = INSTANCE_TYPES[self.pool.instance_type]
        return {
            "instance_type": self.pool.instance_type,
            "availability_zone": self.pool.availability_zone,
            "gpu_model": itype.gpu_model,
            "gpu_count": itype.gpu_count,
            "spot_usd_per_hour": self.spot_usd_per_hour,
            "spot_price_since": None if self.spot_price_since is None else self.spot_price_since.isoformat(),
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "picked": self.picked,
        }


def pool_prices(spec: JobSpec, quotes: Iterable[PriceQuote], placement: Placement) -> list[PoolPrice]:
    """The spot pools quoted for types that fit `spec`, cheapest first, with the pool `placement` picked
    marked (added if it is an on-demand pool with no spot quote)."""
    fitting = {t.name for t in spec.resources.fitting_types()}
    best = placement.best
    picked_offering = None if best is None else best.pool.offering
    rows = [
        PoolPrice(
            pool=q.pool,
            spot_usd_per_hour=q.usd_per_hour,
            spot_price_since=q.timestamp,
            on_demand_usd_per_hour=INSTANCE_TYPES[q.pool.instance_type].on_demand_usd_per_hour,
            picked=str(best.pool.market) if best is not None and q.pool.offering == picked_offering else None,
        )
        for q in quotes
        if q.pool.instance_type in fitting
    ]
    if best is not None and all(r.picked is None for r in rows):
        rows.append(
            PoolPrice(
                pool=best.pool,
                spot_usd_per_hour=None,
                spot_price_since=None,
                on_demand_usd_per_hour=INSTANCE_TYPES[best.pool.instance_type].on_demand_usd_per_hour,
                picked=str(best.pool.market),
            )
        )
    return sorted(
        rows,
        key=lambda r: (r.spot_usd_per_hour is None, r.spot_usd_per_hour or 0.0, *_offering_order(r.pool)),
    )


def prices_command(
    job_file: Annotated[
        Path | None, typer.Argument(metavar="JOB.yaml", help="job spec, YAML or JSON (or --gpus)")
    ] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", metavar="N", help="GPUs, instead of a JOB.yaml")] = None,
    gpu_memory: Annotated[
        float | None, typer.Option("--gpu-memory", metavar="GIB", help="minimum memory of each GPU (with --gpus)")
    ] = None,
    region: RegionOption = None,
    as_json: JsonOption = False,
    endpoint_url: EndpointOption = None,
) -> None:
    """Show what each pool (type x AZ) the job fits costs on spot now, from EC2, beside the on-demand
    price, and mark the pool `spotrelay place` would pick.

    \b
    The spot prices are EC2's now (DescribeSpotPriceHistory, Linux/UNIX);
    the on-demand ones the catalog's (us-east-1 Linux). Exit status 0,
    2 for bad input, 1 when EC2 quotes no pool the job fits or cannot be
    reached.
    """
    spec, what = job_to_price(job_file, gpus, gpu_memory)
    client, region_name = ec2_client(region, endpoint_url)
    quotes = read_spot_prices(client, region_name, endpoint_url, [t.name for t in spec.resources.fitting_types()])
    placement = place_from_command_line(spec, quotes)
    rows = pool_prices(spec, quotes, placement)
    if not rows:
        fail(f"no pool fits {what}: EC2 quotes no spot price in {region_name} for {fitting_summary(spec)}", code=1)
    if as_json:
        sys.stdout.write(json.dumps([r.to_json_dict() for r in rows], indent=2) + "\n")
        return
    print_pool_prices(rows, placement, what=what, region=region_name)


def job_to_price(job_file: Path | None, gpus: int | None, gpu_memory: float | None) -> tuple[JobSpec, str]:
    """The job spec the command prices, from JOB.yaml or from --gpus/--gpu-memory, and how to name it."""
    if job_file is not None and (gpus is not None or gpu_memory is not None):
        fail("give JOB.yaml or --gpus/--gpu-memory, not both")
    if job_file is not None:
        try:
            spec = load_job_spec(job_file)
        except JobSpecError as e:
            fail(str(e))
        return spec, f"job {spec.name}"
    if gpus is None:
        fail("--gpu-memory needs --gpus N" if gpu_memory is not None else "give a JOB.yaml, or --gpus N")
    resources: dict[str, Any] = {"gpus": gpus}
    if gpu_memory is not None:
        resources["gpu_memory_gib"] = gpu_memory
    try:
        spec = parse_job_spec({"name": "prices", "run": {"command": "true"}, "resources": resources}, "options")
    except JobSpecError as e:
        fail("; ".join(option_problem(p) for p in e.problems))
    memory = f" with {gpu_memory:g} GiB each" if gpu_memory is not None else ""
    return spec, f"{gpus} GPU(s){memory}"


def option_problem(problem: str) -> str:
    """`resources.gpus: ...` as `--gpus: ...`: the field as the user gave it."""
    field, sep, reason = problem.partition(": ")
    return f"{OPTION_FIELDS[field]}: {reason}" if sep and field in OPTION_FIELDS else problem


def fitting_summary(spec: JobSpec) -> str:
    names = [t.name for t in spec.resources.fitting_types()]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"the {len(names)} type(s) that fit ({shown})"


def ec2_client(region: str | None, endpoint_url: str | None) -> tuple[EC2Client, str]:
    """An EC2 client in `region` (else the AWS configuration's) at `endpoint_url`, and its region."""
    from botocore.exceptions import BotoCoreError

    try:
        client, region_name = command_ec2_client(region, endpoint_url)
        if not region_name:
            fail("--region: no region given or configured (give --region, or set AWS_REGION)")
        return client, region_name
    except ValueError as e:  # botocore's answer to an endpoint URL or region it cannot use
        fail(f"--endpoint-url {endpoint_url}: {e}" if endpoint_url else f"--region {region}: {e}")
    except BotoCoreError as e:
        fail(f"cannot make an EC2 client in {region}: {e}", code=1)


def read_spot_prices(
    client: EC2Client, region: str, endpoint_url: str | None, instance_types: list[str]
) -> list[PriceQuote]:
    """The spot price now of each pool of `instance_types` in every AZ of the region."""
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.aws.compute import Ec2Compute

    where = f"EC2 in {region}" + (f" at {endpoint_url}" if endpoint_url else "")
    try:
        return Ec2Compute(client, region=region).spot_prices(instance_types, [], utc_now())
    except ClientError as e:
        info = e.response.get("Error", {})
        why = f"{info.get('Code', 'error')}: {info.get('Message', '')}".rstrip(": ")
        fail(f"{where} refused DescribeSpotPriceHistory: {why}", code=1)
    except BotoCoreError as e:  # no credentials, an endpoint that does not answer
        fail(f"cannot read spot prices from {where}: {e}", code=1)


def print_pool_prices(rows: list[PoolPrice], placement: Placement, *, what: str, region: str) -> None:
    table = Table(
        title=f"spot prices now in {region} for {what}, cheapest first",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for column, justify in [
        ("type", "left"),
        ("zone", "left"),
        ("GPU", "left"),
        ("spot $/h", "right"),
        ("on-demand $/h", "right"),
        ("saving", "right"),
        ("picked", "left"),
    ]:
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        itype = INSTANCE_TYPES[r.pool.instance_type]
        spot, on_demand = r.spot_usd_per_hour, r.on_demand_usd_per_hour
        table.add_row(
            r.pool.instance_type,
            r.pool.availability_zone,
            f"{itype.gpu_count}x {itype.gpu_model}",
            "-" if spot is None else f"{spot:.4f}",
            "-" if on_demand is None else f"{on_demand:.4f}",
            "-" if spot is None or on_demand is None else f"{1 - spot / on_demand:.0%}",
            f"<- {r.picked}" if r.picked is not None else "",
        )
    tables().print(table)
    best = placement.best
    if best is None:
        verdict = placement.why_none()
    else:
        per = "to finish" if placement.work_hours_known else f"per {REFERENCE_GPU}-hour of work"
        verdict = (
            f"picked: {best.pool} at ${best.hourly_price:.4f}/h, expected ${best.expected_cost_to_finish:.2f} {per} "
            f"(ranked by {placement.objective}); market: {placement.market.reason}"
        )
    out.print(f"{len(rows)} pools; {verdict}", markup=False, soft_wrap=True)
    if region != CATALOG_PRICE_REGION:
        out.print(f"on-demand: the catalog's {CATALOG_PRICE_REGION} prices", markup=False, soft_wrap=True)


def _offering_order(pool: Pool) -> tuple[str, str]:
    return (pool.instance_type, pool.availability_zone)
