"""`spotrelay place`: rank the pools a job file could run in by expected cost to finish, from a prices CSV
(and, with --advisor, the Spot Instance Advisor's interruption bands), as a table or as JSON.

Registered by spotrelay.cli.app; `spotrelay prices` (spotrelay.cli.prices) asks EC2 for the prices instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich import box
from rich.table import Table

from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.cli.console import err, fail, out, tables
from spotrelay.cli.prices import place_from_command_line
from spotrelay.market import PriceFileError, load_advisor_bands, load_prices
from spotrelay.models import JobSpecError, Market, Pool, load_job_spec
from spotrelay.policy import Placement

T = TypeVar("T")


def parse_blocked(values: list[str]) -> list[Pool]:
    pools = []
    for value in values:
        instance_type, sep, zone = value.partition(":")
        if not sep or not instance_type or not zone:
            fail(f"--blocked {value!r}: expected TYPE:AZ, e.g. g6.xlarge:us-east-1a")
        pools.append(Pool(instance_type=instance_type, availability_zone=zone, market=Market.SPOT))
    return pools


def csv_text(path: Path, load: Callable[[], T]) -> T:
    """`load()` a CSV file (spotrelay.market reads it as text): one that is not UTF-8 text, a binary file,
    is the one-line error naming it."""
    try:
        return load()
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at {e.start}): a CSV file is text")


def place_command(
    job_file: Annotated[Path, typer.Argument(metavar="JOB.yaml", help="job spec, YAML or JSON")],
    prices: Annotated[
        Path,
        typer.Option(
            "--prices",
            metavar="PRICES.csv",
            help="instance_type,availability_zone,spot_price_usd_per_hour[,timestamp]",
        ),
    ],
    blocked: Annotated[
        list[str] | None,
        typer.Option("--blocked", metavar="TYPE:AZ", help="skip this spot pool (repeatable)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the ranking as JSON")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="say why this pool, and why not the others")] = False,
    work_done: Annotated[
        float, typer.Option("--work-done", min=0, help="reference-GPU hours already done (from a checkpoint)")
    ] = 0.0,
    elapsed: Annotated[float, typer.Option("--elapsed", min=0, help="hours since the job was submitted")] = 0.0,
    advisor: Annotated[
        Path | None,
        typer.Option("--advisor", help="Spot Instance Advisor CSV (region,instance_type,interruption_range_index)"),
    ] = None,
    region: Annotated[str, typer.Option("--region", help="region of the --advisor bands")] = "us-east-1",
    top: Annotated[int, typer.Option("--top", min=1, help="rows of the table")] = 10,
) -> None:
    """Rank the pools JOB.yaml could run in by expected cost to finish, cheapest first."""
    try:
        spec = load_job_spec(job_file)
        quotes = csv_text(prices, lambda: load_prices(prices))
        bands = csv_text(advisor, lambda: load_advisor_bands(advisor, region)) if advisor is not None else {}
    except (JobSpecError, PriceFileError) as e:
        fail(str(e))
    placement = place_from_command_line(
        spec,
        quotes,
        work_done_hours=work_done,
        elapsed_hours=elapsed,
        blocked=parse_blocked(blocked or []),
        bands=bands,
    )
    if as_json:
        sys.stdout.write(json.dumps(placement.to_json_dict(), indent=2) + "\n")
    else:
        print_placement(placement, top)
    if explain:
        console = err if as_json else out
        console.print()
        for line in placement.explain():
            console.print(line, markup=False, soft_wrap=True)
    if placement.best is None:
        raise typer.Exit(1)


def print_placement(placement: Placement, top: int) -> None:
    if not placement.ranked:
        out.print(f"no pool for {placement.job_name} now", markup=False)
        return
    # Light rules and no outer padding: the eight columns fit an 80-column terminal whole
    table = Table(
        title=f"pools for {placement.job_name}, best first", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for column, justify in [
        ("#", "right"),
        ("type", "left"),
        ("zone", "left"),
        ("market", "left"),
        ("GPU", "left"),
        ("$/h", "right"),
        ("run h", "right"),
        ("exp. $", "right"),  # expected cost to finish
    ]:
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for rank, r in enumerate(placement.ranked[:top], start=1):
        itype = INSTANCE_TYPES[r.pool.instance_type]
        table.add_row(
            str(rank),
            r.pool.instance_type,
            r.pool.availability_zone,
            str(r.pool.market),
            f"{itype.gpu_count}x {itype.gpu_model}",
            f"{r.hourly_price:.4f}",
            f"{r.run_hours:.2f}",
            f"{r.expected_cost_to_finish:.2f}",
        )
    tables().print(table)
    more = len(placement.ranked) - top
    out.print(
        f"{len(placement.ranked)} feasible pools{f' ({more} not shown)' if more > 0 else ''}, "
        f"{len(placement.rejected)} rejected; market: {placement.market.reason}",
        markup=False,
        soft_wrap=True,
    )
