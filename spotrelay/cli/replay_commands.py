"""`spotrelay bench / replay / events export`: offline runs of the policies and the stack. `bench` replays real
spot traces through the policies (spotrelay.bench), `replay` a scenario in moto on a virtual clock
(spotrelay.local.replay), `events export` the stack's archived EC2 events, for a replay
(spotrelay.local.scenario_export). What each needs is imported when it runs.

Registered by spotrelay.cli.app (`events` as a group); `local up` is spotrelay.cli.local_commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from spotrelay.cli.console import err, fail, tables


def bench_command(
    traces: Annotated[
        list[Path],
        typer.Option(
            "--traces",
            metavar="DIR",
            help="availability traces, one <zone>_<label>.json per pool (repeat to combine directories)",
        ),
    ],
    prices: Annotated[
        Path | None,
        typer.Option(
            "--prices",
            metavar="FILE",
            help=(
                "spot price history (training-on-a-dime CSV) or PRICES.csv; default: on-demand x the --advisor "
                "savings, else x 0.97/3.06 (the Can't Be Late paper's ratio)"
            ),
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", metavar="NAME|FILE", help="cant-be-late, cant-be-late-multi, fleet, or a YAML file"),
    ] = None,
    policies: Annotated[
        str,
        typer.Option(
            "--policies",
            metavar="a,b,...",
            help=(
                "policies to compare; also the what-if variants spotrelay-no-migrate and spotrelay-sees-capacity "
                "(on-demand always runs: the reference of the cost ratios)"
            ),
        ),
    ] = "on-demand,greedy,uniform-progress,skypilot-eager,spotrelay,omniscient",
    seed: Annotated[int, typer.Option("--seed", help="seed of the fleet workload's generator")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="OUT.png", help="cost vs deadline misses, and one job's timeline")
    ] = None,
    advisor: Annotated[
        Path | None,
        typer.Option("--advisor", help="Spot Instance Advisor CSV: interruption bands and savings"),
    ] = None,
    region: Annotated[str, typer.Option("--region", help="region of the --advisor bands")] = "us-east-1",
    processes: Annotated[
        int | None, typer.Option("--processes", min=1, help="worker processes (default: up to 2)")
    ] = None,
) -> None:
    """Replay real spot traces through the policies (spotrelay's own placement and recovery code among
    them) and compare their cost, deadline misses and completion times."""
    from spotrelay.bench.plot import write_plot
    from spotrelay.bench.report import print_tables, to_json
    from spotrelay.bench.suite import parse_policies, run_suite
    from spotrelay.bench.workloads import WorkloadError

    if plot is not None and not plot.parent.is_dir():  # before the replay, not after it
        fail(f"--plot {plot}: no directory {plot.parent}")
    try:
        chosen = parse_policies(policies)
        result = run_suite(
            traces,
            prices=prices,
            workload=workload,
            policies=chosen,
            seed=seed,
            advisor=advisor,
            region=region,
            processes=processes,
        )
    except WorkloadError as e:
        fail(str(e))
    if as_json:
        sys.stdout.write(json.dumps(to_json(result.runs), indent=2) + "\n")
    else:
        # A pipe gets the whole table (rich would squeeze it into 80 columns).
        print_tables(tables(), result.runs)
    for note in result.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    if plot is not None:
        try:
            write_plot(plot, result.runs)
        except OSError as e:
            fail(f"--plot {plot}: cannot write: {e.strerror}")
        err.print(f"wrote {plot}", markup=False)


def replay_command(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO.yaml", help="a replay scenario (events/scenarios/)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the jobs and the expectations as JSON")] = False,
    seed: Annotated[int | None, typer.Option("--seed", help="default: the scenario's seed")] = None,
    chaos: Annotated[
        int | None,
        typer.Option(
            "--chaos",
            metavar="SEED",
            min=0,
            help="inject faults at random, the same for the same SEED: EventBridge deliveries duplicated, "
            "delayed or dropped, Lambda invocations failing (retried as AWS does), spot launches refused, "
            "interruption warnings at any phase; then only a broken invariant fails the replay",
        ),
    ] = None,
) -> None:
    """Replay a scenario: the synthesized stack deployed into moto, the scenario's market behind EC2,
    its jobs and recorded events on a virtual clock, simulated workers checkpointing into moto S3.

    \b
    Prints the timeline (submitted, placed on, interrupted, checkpointed,
    relaunched on, finished) and a cost report per job; exits 1 if one of
    the scenario's expectations fails or an invariant is broken (no job
    lost, no instance left running, no older checkpoint resumed, ...).
    With --chaos SEED it also lists what it injected (spotrelay/local/chaos.py),
    and exits 1 only if an invariant is broken: under chaos an expectation
    (a cost, a number of attempts) may fail and the replay still pass.
    """
    try:
        from spotrelay.local.deploy import DeployError
        from spotrelay.local.replay import render_text, replay
        from spotrelay.local.scenario import ScenarioError, load_scenario
        from spotrelay.market import MarketSpecError
    except ImportError as e:
        fail(f"the replay needs moto: pip install 'spotrelay[local,aws]' ({e})")
    try:
        result = replay(load_scenario(scenario), seed=seed, chaos=chaos)
    except (ScenarioError, MarketSpecError, DeployError) as e:
        fail(str(e))
    except UnicodeDecodeError as e:  # a price or trace file the market reads (the scenario's own files say which)
        fail(f"{scenario}: a file it names is not UTF-8 text (byte 0x{e.object[e.start]:02x} at {e.start})")
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render_text(result) + "\n")
    if not result.passed:
        raise typer.Exit(1)


events_app = typer.Typer(
    help="Recorded events: export the stack's archived EC2 spot events for a replay.",
    no_args_is_help=True,
    add_completion=False,
)


@events_app.command("export")
def events_export_command(
    since: Annotated[str, typer.Option("--since", help="how far back: 24h, 90m, 2d")] = "24h",
    stack: Annotated[
        str, typer.Option("--stack", envvar="SPOTRELAY_STACK", help="the CloudFormation stack `cdk deploy` made")
    ] = "SpotRelay",
    region: Annotated[
        str | None,
        typer.Option("--region", envvar="AWS_REGION", help="default: AWS_REGION, else the AWS configuration's"),
    ] = None,
) -> None:
    """Write the stack's archived EC2 events of the last SINCE to stdout, one JSON event a line, each
    noted with its job and attempt: `spotrelay events export --since 24h > incident.jsonl`.

    \b
    EventBridge cannot read an archive: this replays it (StartReplay) onto its
    bus, filtered to a temporary rule that sends it to a temporary SQS queue,
    reads the queue, then deletes the rule and the queue. It takes minutes.
    """
    from datetime import UTC, datetime, timedelta

    import boto3

    from spotrelay.aws.store import DynamoJobStore
    from spotrelay.local.scenario_export import ExportError, export_archive, stack_archive, stack_table, to_jsonl
    from spotrelay.market import parse_duration

    try:
        hours = parse_duration(since, "--since")
    except ValueError as e:
        fail(str(e))
    session = boto3.session.Session(region_name=region)
    until = datetime.now(UTC)
    try:
        cloudformation = session.client("cloudformation")
        archive = stack_archive(cloudformation, stack, session.client("events"))
        store = DynamoJobStore(stack_table(cloudformation, stack), session.client("dynamodb"))
        exported = export_archive(
            events=session.client("events"),
            sqs=session.client("sqs"),
            archive_name=archive,
            since=until - timedelta(hours=hours),
            until=until,
            store=store,
        )
    except ExportError as e:
        fail(str(e))
    sys.stdout.write(to_jsonl(exported))
    err.print(f"exported {len(exported)} event(s) from archive {archive}", markup=False)
