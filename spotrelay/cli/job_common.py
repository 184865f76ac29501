"""What the job commands share (spotrelay.cli.job_commands has the overview): their options (--stack, --region,
--endpoint-url, --json, the job id), the clock they count on, the stack's client (spotrelay.aws.deployed_stack) and its
one-line errors, the spot prices in effect that a cost counts, and the JSON lines and times they print.

The commands themselves: spotrelay.cli.job_submit, job_status, job_list, job_logs, job_cost_report, job_wait,
job_actions. boto3 is imported when one runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from spotrelay.cli.console import err, fail
from spotrelay.cli.costs import PriceHistories, PriceHistoryReader, ec2_price_history, read_price_histories
from spotrelay.clock import SYSTEM_CLOCK, WaitingClock
from spotrelay.models.billing import needs_prices

if TYPE_CHECKING:
    from spotrelay.aws.deployed_stack import JobsClient, JobStatus

T = TypeVar("T")

JobIdArgument = Annotated[str, typer.Argument(metavar="JOB_ID", help="what `spotrelay submit` printed")]
StackOption = Annotated[
    str, typer.Option("--stack", envvar="SPOTRELAY_STACK", help="the CloudFormation stack `cdk deploy` made")
]
# botocore reads AWS_DEFAULT_REGION and the config file, not AWS_REGION (the other SDKs' and Lambda's name)
RegionOption = Annotated[
    str | None,
    typer.Option("--region", envvar="AWS_REGION", help="default: AWS_REGION, else the AWS configuration's"),
]
EndpointOption = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        envvar="AWS_ENDPOINT_URL",
        help="another endpoint for every AWS service, e.g. `spotrelay local up`'s http://localhost:5055",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


def command_clock() -> WaitingClock:
    """The clock the commands count on: every now, poll and timeout (tests put a fake one here)."""
    return SYSTEM_CLOCK


def utc_now() -> datetime:
    """The time costs are counted to (tests put a virtual clock here)."""
    return command_clock().now()


def connect(stack: str, region: str | None, endpoint_url: str | None) -> JobsClient:
    from spotrelay.aws.deployed_stack import JobsClient, StackError

    try:
        return JobsClient.connect(stack, region=region, endpoint_url=endpoint_url)
    except StackError as e:
        fail(str(e), e.code)


def on_stack(stack: str, region: str | None, endpoint_url: str | None, use: Callable[[JobsClient], T]) -> T:
    """`use` the stack's client; a StackError is the command's one-line error and exit status."""
    return on_client(connect(stack, region, endpoint_url), use)


def on_client(client: JobsClient, use: Callable[[JobsClient], T]) -> T:
    """`use` the client; a StackError is the command's one-line error and exit status."""
    from spotrelay.aws.deployed_stack import StackError

    try:
        return use(client)
    except StackError as e:
        fail(str(e), e.code)


def prices_in_effect(
    statuses: list[JobStatus],
    now: datetime,
    region: str | None,
    endpoint_url: str | None,
    *,
    read: PriceHistoryReader | None = None,
    warn: bool = True,
) -> PriceHistories:
    """The spot price histories the jobs' unsettled attempts need, read from EC2 once per pool (with `read`,
    else a new EC2 client); a warning on stderr if they could not be read (those attempts then count at
    their launch prices), unless not `warn`."""
    attempts = [a for s in statuses for a in s.attempts]
    if not any(needs_prices(a) for a in attempts):
        return PriceHistories()  # every bill settled, or on-demand: nothing to ask EC2
    prices = read_price_histories(attempts, now, read or ec2_price_history(region, endpoint_url))
    if prices.error is not None and warn:
        err.print(
            f"warning: could not read the spot price history ({prices.error}); instances not yet billed in full "
            "are counted at their launch prices",
            markup=False,
            soft_wrap=True,
        )
    return prices


def json_line(answer: Mapping[str, Any]) -> None:
    """One JSON object on a line of its own, written at once: a reader of a long wait sees each as it comes."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def iso_time(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")  # as `status --json` writes a time
