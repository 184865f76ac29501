"""`spotrelay cost`: what jobs cost against the same instance hours on on-demand, per job and in all (the
figures are spotrelay.cli.costs'), as a table or as JSON; the estimate's note and the share saved, which `ls`
and `status` print too.

Siblings: spotrelay.cli.job_list, spotrelay.cli.job_status, spotrelay.cli.job_common (the options, the stack's
client, the prices in effect); spotrelay.cli.job_commands has the overview.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Column, Table

from spotrelay.cli.console import out, tables
from spotrelay.cli.costs import job_cost
from spotrelay.cli.job_common import (
    EndpointOption,
    JsonOption,
    RegionOption,
    StackOption,
    on_stack,
    prices_in_effect,
    utc_now,
)


def cost_command(
    job_ids: Annotated[
        list[str] | None, typer.Argument(metavar="JOB_ID", help="default: every job of the stack")
    ] = None,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """What jobs cost, against the same instance hours on on-demand: per job and in all. Each instance is
    billed at the spot price in effect until its end: a live one up to now, an estimate until it is gone
    (marked *); on-demand prices are the catalog's (us-east-1)."""
    statuses = on_stack(stack, region, endpoint_url, lambda client: client.statuses(job_ids or []))
    now = utc_now()
    prices = prices_in_effect(statuses, now, region, endpoint_url)
    rows = [(s.job, job_cost(s, prices, now)) for s in statuses]
    total, on_demand = sum(c.total_usd for _, c in rows), sum(c.on_demand_usd for _, c in rows)
    estimated = any(c.is_estimate for _, c in rows)
    if as_json:
        answer = {
            "jobs": [
                {
                    "job_id": job.job_id,
                    "state": job.state.value,
                    "cost_usd": float(cost.total_usd),
                    "on_demand_cost_usd": float(cost.on_demand_usd),
                    "cost_is_estimate": cost.is_estimate,
                }
                for job, cost in rows
            ],
            "total": {
                "cost_usd": float(total),
                "on_demand_cost_usd": float(on_demand),
                "saved_usd": float(on_demand - total),
                "cost_is_estimate": estimated,
            },
        }
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
        return
    table = Table(
        Column("job", no_wrap=True),
        "state",
        "cost $",
        "on-demand $",
        "saved $",
        "saved",
        show_footer=True,
    )
    for job, cost in rows:
        spent, od = cost.total_usd, cost.on_demand_usd
        mark = "*" if cost.is_estimate else ""
        table.add_row(
            job.job_id, job.state.value, f"{spent:.2f}{mark}", f"{od:.2f}", f"{od - spent:.2f}", _share(spent, od)
        )
    table.columns[0].footer = f"{len(rows)} job(s)"
    for column, figure in zip(table.columns[2:5], (total, on_demand, on_demand - total), strict=True):
        column.footer = f"{figure:.2f}"
    table.columns[5].footer = _share(total, on_demand)
    tables().print(table)
    if estimated:
        out.print(ESTIMATE_NOTE, markup=False, soft_wrap=True)


ESTIMATE_NOTE = (
    "* an estimate: a live instance, counted at the spot prices in effect from its launch to now; final once "
    "the instance is gone"
)


def _share(cost: float, on_demand: float) -> str:
    """The share saved; "-" under a cent of on-demand, where a percentage of nothing says nothing."""
    return f"{(on_demand - cost) / on_demand:.0%}" if on_demand >= 0.005 else "-"
