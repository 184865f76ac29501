"""`spotrelay admin quarantined / release`: an operator's view of the job records the dispatcher set aside
because they did not read back (spotrelay.aws.store), and the way back once one has been fixed by hand.
`spotrelay admin redrive / replay-archive`: the recovery after the control plane was down (the README's
runbook; spotrelay.aws.recovery, which a replay's `operator:` steps call too).

Registered by spotrelay.cli.app as the `admin` group; the stack is found as by the job commands
(spotrelay.cli.job_commands). boto3 is imported when one runs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich import box
from rich.table import Column, Table

from spotrelay.cli.console import err, out, tables
from spotrelay.cli.job_commands import EndpointOption, JobIdArgument, JsonOption, RegionOption, StackOption, on_stack

if TYPE_CHECKING:
    from collections.abc import Callable

    from spotrelay.aws.deployed_stack import JobsClient
    from spotrelay.aws.store import DynamoJobStore, Release

T = TypeVar("T")

admin_app = typer.Typer(
    name="admin",
    help="For the stack's operator: job records set aside as unreadable, and releasing them once fixed; "
    "the recovery after the control plane was down (redrive, replay-archive).",
    no_args_is_help=True,
    add_completion=False,
)


def _on_table(client: JobsClient, what: str, use: Callable[[DynamoJobStore], T]) -> T:
    """`use` the stack's table; an AWS error is a StackError (the command's one-line error)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.aws.deployed_stack import StackError

    store = client.store
    try:
        return use(store)
    except (ClientError, BotoCoreError) as e:
        raise StackError(f"cannot {what} in stack {client.stack.name}: {e}") from None


@admin_app.command("quarantined")
def quarantined_command(
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the job records quarantined because they did not read back: job, when, why, and whether each
    reads back now.

    \b
    The dispatcher sets such a record aside so that it stops no run. Fix it
    by hand (its item: pk JOB#<job id>, sk JOB, the JSON in `record`), then
    `spotrelay admin release JOB_ID` puts it back.
    """
    found = on_stack(
        stack,
        region,
        endpoint_url,
        lambda client: _on_table(client, "list the quarantined job records", lambda store: store.quarantined_jobs()),
    )
    if as_json:
        sys.stdout.write(json.dumps([asdict(q) for q in found], indent=2) + "\n")
        return
    if not found:
        err.print("no quarantined job records", markup=False)
        return
    table = Table(
        Column("job", no_wrap=True),
        Column("quarantined", no_wrap=True),
        Column("from", no_wrap=True),
        Column("reads now", no_wrap=True),
        Column("why", overflow="fold"),
        box=box.SIMPLE_HEAD,
    )
    for q in found:
        table.add_row(q.job_id, q.quarantined_at, q.index or "-", "yes" if q.reads_back else "no", q.reason)
    tables().print(table)


@admin_app.command("release")
def release_command(
    job_id: JobIdArgument,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put a quarantined job record, fixed by hand, back where its state belongs (queued, live, ended).

    \b
    If it still does not read back, it stays quarantined: the error says why
    (exit status 1). Use the spotrelay version the stack runs: "reads back"
    means as this version reads it.
    """
    from spotrelay.aws.deployed_stack import USAGE, StackError
    from spotrelay.control.ports import ConflictError, NotFoundError

    def release(store: DynamoJobStore) -> Release:
        try:
            return store.release_quarantined(job_id)
        except NotFoundError:
            raise StackError(f"no job {job_id} in stack {stack}", USAGE) from None
        except ConflictError as e:
            raise StackError(f"{e}: run the command again") from None

    answer = on_stack(stack, region, endpoint_url, lambda client: _on_table(client, f"release job {job_id}", release))
    if as_json:
        sys.stdout.write(json.dumps(asdict(answer)) + "\n")
    elif answer.outcome == "unreadable":
        err.print(f"error: {answer.why}", markup=False, soft_wrap=True)
    else:
        out.print(answer.why, markup=False, soft_wrap=True)
    if answer.outcome == "unreadable":
        raise typer.Exit(1)


def _when(value: str, option: str) -> datetime:
    """An ISO 8601 time with its zone (2026-11-30T00:30:00Z) -> an aware datetime; else the one-line error."""
    from spotrelay.aws.deployed_stack import USAGE
    from spotrelay.cli.console import fail

    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} {value!r}: not an ISO 8601 time (e.g. 2026-11-30T00:30:00Z)", USAGE)
    if parsed.tzinfo is None:
        fail(f"{option} {value!r}: give its time zone (e.g. 2026-11-30T00:30:00Z, or +02:00)", USAGE)
    return parsed.astimezone(UTC)


@admin_app.command("redrive")
def redrive_command(
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Invoke each function with the events Lambda dead-lettered after its retries, and with those
    EventBridge could not deliver to it, deleting each one it handled (after the control plane was down:
    the README's runbook).

    \b
    Safe to run again: the handlers are idempotent, and an event the
    function fails again stays in the DLQ (exit status 1).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.aws import recovery
    from spotrelay.aws.deployed_stack import StackError
    from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT

    def run(client: JobsClient) -> list[recovery.Redrive]:
        done = []
        queues = recovery.dead_letter_queues(client.stack.output, client.stack.outputs.get(EVENT_TARGET_DLQ_OUTPUT))
        for queue in queues:
            try:
                done.append(queue.redrive(client.sqs, client.lambda_))
            except (ClientError, BotoCoreError) as e:
                raise StackError(f"cannot redrive the DLQ of {queue.name} in stack {client.stack.name}: {e}") from None
        return done

    done = on_stack(stack, region, endpoint_url, run)
    if as_json:
        rows = [asdict(r) | {"complete": r.complete} for r in done]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        for r in done:
            line = f"{r.function}: {r.handled} of {r.found} dead-lettered events handled"
            line += f", {r.failed} failed again and stay in the DLQ" if r.failed else ""
            out.print(line, markup=False, soft_wrap=True)
            for error in r.errors:
                err.print(f"  {error}", markup=False, soft_wrap=True)
    if not all(r.complete for r in done):
        raise typer.Exit(1)


FromOption = Annotated[str, typer.Option("--from", help="the window's start, ISO 8601 with a zone (e.g. ...Z)")]
ToOption = Annotated[str, typer.Option("--to", help="the window's end, ISO 8601 with a zone")]


@admin_app.command("replay-archive")
def replay_archive_command(
    start: FromOption,
    end: ToOption,
    stack: StackOption = "SpotRelay",
    region: RegionOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Deliver the stack's archived EC2 events of a window again (EventBridge StartReplay to the bus they
    came from), e.g. the window the control plane was down (the README's runbook).

    \b
    The rules deliver them as they did the first time; the handlers are
    idempotent. Follow it with `aws events describe-replay --replay-name NAME`.
    """
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.aws import recovery
    from spotrelay.aws.deployed_stack import USAGE, StackError

    window = (_when(start, "--from"), _when(end, "--to"))

    def run(client: JobsClient) -> recovery.ArchiveReplay:
        name = recovery.archive_name(client.stack.outputs) or client.stack.output(recovery.ARCHIVE_ARN_OUTPUT)
        events = boto3.client("events", region_name=client.lambda_.meta.region_name, endpoint_url=endpoint_url)
        try:
            return recovery.replay_archive(events, archive_name=name, start=window[0], end=window[1])
        except ValueError as e:
            raise StackError(str(e), USAGE) from None
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot replay archive {name} of stack {client.stack.name}: {e}") from None

    replayed = on_stack(stack, region, endpoint_url, run)
    if as_json:
        document = {k: v for k, v in asdict(replayed).items() if k != "raw"}
        sys.stdout.write(json.dumps(document, default=str) + "\n")
        return
    out.print(
        f"replay {replayed.name} of {replayed.archive_arn} ({window[0]:%Y-%m-%dT%H:%M:%SZ} to "
        f"{window[1]:%Y-%m-%dT%H:%M:%SZ}) to {replayed.destination_arn}: {replayed.state or 'started'}",
        markup=False,
        soft_wrap=True,
    )
