"""`spotrelay` commands. Each command parses its input, calls the core, prints; errors are one line."""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich import box
from rich.table import Table

from spotrelay.agent import JOB_USER
from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.cli import admin, jobs
from spotrelay.cli.console import err, fail, option_seconds, out, tables
from spotrelay.cli.prices import place_from_command_line, prices_command
from spotrelay.config import ENV_AGENT_LOG_GROUP, ENV_BUCKET, ENV_TABLE, ENV_VEND_FUNCTION
from spotrelay.market import PriceFileError, load_advisor_bands, load_prices
from spotrelay.models import JobSpecError, Market, Pool, load_job_spec
from spotrelay.policy import Placement

T = TypeVar("T")

app = typer.Typer(
    name="spotrelay",
    help="Run GPU jobs on EC2 Spot: the cheapest pool that fits, checkpoints to S3, relaunch after interruptions.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def root() -> None:
    """Run GPU jobs on EC2 Spot: the cheapest pool that fits, checkpoints to S3, relaunch after interruptions."""


# A user's jobs on a deployed stack first: what most people run.
app.command("submit")(jobs.submit_command)
app.command("status")(jobs.status_command)
app.command("ls")(jobs.ls_command)
app.command("logs")(jobs.logs_command)
app.command("cost")(jobs.cost_command)
app.command("wait")(jobs.wait_command)
app.command("cancel")(jobs.cancel_command)
app.command("resume")(jobs.resume_command)
app.add_typer(admin.admin_app, name="admin")


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


@app.command("place")
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


app.command("prices")(prices_command)


@app.command("agent")
def agent_command(
    job_id: Annotated[
        str | None, typer.Option("--job-id", help="default: the instance tag spotrelay:job-id, from IMDS")
    ] = None,
    attempt: Annotated[
        int | None, typer.Option("--attempt", min=1, help="default: the instance tag spotrelay:attempt, from IMDS")
    ] = None,
    bucket: Annotated[str | None, typer.Option("--bucket", envvar=ENV_BUCKET, help="the checkpoint bucket")] = None,
    table: Annotated[str | None, typer.Option("--table", envvar=ENV_TABLE, help="the job table")] = None,
    log_group: Annotated[
        str | None,
        typer.Option(
            "--log-group", envvar=ENV_AGENT_LOG_GROUP, help="CloudWatch Logs group for the log lines too (the stack's)"
        ),
    ] = None,
    vend_function: Annotated[
        str | None,
        typer.Option(
            "--vend-function",
            envvar=ENV_VEND_FUNCTION,
            help="the stack's vend function: the job's credentials (else the agent's own are used)",
        ),
    ] = None,
    job_user: Annotated[
        str | None,
        typer.Option(
            "--job-user", help=f"when the agent runs as root, the job runs as this user (the unit's: {JOB_USER})"
        ),
    ] = None,
    imds_endpoint: Annotated[
        str, typer.Option("--imds-endpoint", help="instance metadata service (IMDSv2); a local stub in tests")
    ] = "http://169.254.169.254",
    poll_seconds: Annotated[
        float, typer.Option("--poll-seconds", min=0.01, help="how often IMDS is polled for notices")
    ] = 5.0,
    heartbeat_seconds: Annotated[
        float, typer.Option("--heartbeat-seconds", min=0.01, help="how often the task token is heartbeaten")
    ] = 60.0,
    region: Annotated[
        str | None, typer.Option("--region", help="default: AWS_REGION, AWS_DEFAULT_REGION, else IMDS")
    ] = None,
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="where the agent keeps the state that survives its restart")
    ] = Path("/var/lib/spotrelay"),
    checkpoint_dir: Annotated[
        Path | None, typer.Option("--checkpoint-dir", help="instead of the job's checkpoint.dir (local runs)")
    ] = None,
    previous_checkpoint_wait: Annotated[
        float,
        typer.Option(
            "--previous-checkpoint-wait",
            min=0,
            help="seconds after the previous attempt's notice to wait for its final checkpoint",
        ),
    ] = 150.0,
    migrate_poll_seconds: Annotated[
        float,
        typer.Option(
            "--migrate-poll-seconds", min=0.01, help="how often the attempt record is read for a migration request"
        ),
    ] = 60.0,
    standby_wait_seconds: Annotated[
        float,
        typer.Option("--standby-wait-seconds", min=0, help="how long a standby attempt waits to be handed its job"),
    ] = 1800.0,
) -> None:
    """Run this instance's job attempt: restore, run, checkpoint, report.

    \b
    Started by systemd on each GPU worker (see spotrelay.agent.systemd_unit):
    1. Learns the job id and attempt from the instance's tags (IMDSv2),
       unless --job-id/--attempt are given, and the task token from the
       attempt record in DynamoDB (never from user data).
    2. Restores the job's latest complete checkpoint from S3 into
       checkpoint.dir, verifying every file's size and sha256; a corrupt
       checkpoint fails the task with CheckpointCorrupt, the job does not
       start. If the previous attempt was interrupted and its final
       checkpoint is not committed yet, waits for it first.
    3. Runs the job (run.image with docker and GPUs, or run.command with
       /bin/sh) with SPOTRELAY_JOB_ID, SPOTRELAY_ATTEMPT,
       SPOTRELAY_CHECKPOINT_DIR, SPOTRELAY_RESUMED=1|0 and
       SPOTRELAY_PROGRESS_FILE in its environment.
    4. Polls IMDS every --poll-seconds. On a spot interruption notice:
       SIGTERM to the job, up to checkpoint.grace_seconds for it to save,
       upload the checkpoint dir (data, then the manifest, then the pointer
       by a conditional write), fail the task with SpotInterrupted. On a
       rebalance recommendation: checkpoint early. Every
       checkpoint.interval_minutes: upload what changed (incremental).
    5. Heartbeats the task token; reports success (exit 0), or JobFailed
       with the exit code and the last lines of the job's output.
    6. Reads its attempt record every --migrate-poll-seconds: when the
       control plane asks for a handover (a spot standby runs, ready to
       take the job off on-demand), stops and checkpoints as at a notice
       and fails the task with Migrating. An agent on a standby waits up
       to --standby-wait-seconds to be handed the job.

    \b
    Logs are JSON lines on stdout, each with job_id and attempt, and
    with --log-group in CloudWatch Logs too (`spotrelay logs` reads them). A
    restarted agent re-attaches to the running job (state in --state-dir)
    and never runs it twice; one whose outcome is reported does nothing.
    Exit status 0 once the outcome is reported (or when asked to stop,
    leaving the job running), non-zero when it cannot go on.
    """
    from spotrelay.agent.main import AgentOptions, run_agent

    if bucket is None or table is None:
        fail("give --bucket and --table (or SPOTRELAY_BUCKET and SPOTRELAY_TABLE)")
    if (job_id is None) != (attempt is None):
        fail("give --job-id and --attempt together, or neither (then the instance tags name them)")
    code = run_agent(
        AgentOptions(
            job_id=job_id,
            attempt=attempt,
            bucket=bucket,
            table=table,
            imds_endpoint=imds_endpoint,
            region=region,
            poll_seconds=poll_seconds,
            heartbeat_seconds=heartbeat_seconds,
            state_dir=state_dir,
            checkpoint_dir=checkpoint_dir,
            previous_checkpoint_wait_seconds=previous_checkpoint_wait,
            migrate_poll_seconds=migrate_poll_seconds,
            standby_wait_seconds=standby_wait_seconds,
            log_group=log_group,
            vend_function=vend_function,
            job_user=job_user,
        )
    )
    raise typer.Exit(code)


local_app = typer.Typer(
    name="local",
    help="The whole stack on moto, on this machine (no AWS account).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(local_app, name="local")


@local_app.command("up")
def local_up_command(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="where moto's server listens")] = 5055,
    region: Annotated[str, typer.Option("--region", help="the stack's region")] = "us-east-1",
    prices: Annotated[
        Path | None,
        typer.Option("--prices", metavar="PRICES.csv", help="spot prices EC2 answers with (default: the example)"),
    ] = None,
    template: Annotated[
        Path | None,
        typer.Option("--template", help="default: cdk.out/SpotRelay.template.json (synthesized if missing)"),
    ] = None,
    speed: Annotated[float, typer.Option("--speed", min=0.001, help="simulated seconds per real second")] = 1.0,
    workers: Annotated[
        bool, typer.Option("--workers/--no-workers", help="run a real agent and the job's command on each instance")
    ] = True,
    instances_dir: Annotated[
        Path | None,
        typer.Option("--instances-dir", help="the instances' scratch directories (default: a new temporary one)"),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="every function's log lines and metrics here (else errors only)")
    ] = False,
    market: Annotated[
        Path | None,
        typer.Option(
            "--market",
            metavar="SCENARIO.yaml",
            help="a scenario's market (prices, outages) from now on, instead of --prices: it moves on the wall clock",
        ),
    ] = None,
) -> None:
    """Deploy the synthesized stack into moto and serve it on localhost:PORT until Ctrl-C.

    \b
    The Lambda functions run in this process (the project's code), the
    state machine runs in moto, EC2 answers spot prices and capacity from
    PRICES.csv. Every instance the control plane launches runs the real
    `spotrelay agent` as a local process, which runs the job's run.command
    here (checkpoints to and from moto's S3, log lines to `spotrelay logs`).
    `spotrelay local interrupt` sends an instance its spot interruption.
    Talk to it with any AWS client:
      aws --endpoint-url http://localhost:5055 sqs send-message ...
    """
    try:
        from spotrelay.local.deploy import DeployError
        from spotrelay.local.scenario import ScenarioError
        from spotrelay.local.server import DEFAULT_PRICES, PortInUse, run_local_up
        from spotrelay.market import MarketSpecError
    except ImportError as e:
        fail(f"the local runtime needs moto: pip install 'spotrelay[local,aws]' ({e})")
    if market is not None and prices is not None:
        fail("give --prices or --market, not both")
    chosen = prices if prices is not None else (DEFAULT_PRICES if DEFAULT_PRICES.is_file() else None)
    scratch = None
    if workers:
        scratch = instances_dir if instances_dir is not None else Path(tempfile.mkdtemp(prefix="spotrelay-instances-"))
    try:
        code = run_local_up(
            port=port,
            region=region,
            prices=chosen,
            template=template,
            speed=speed,
            echo=lambda line: out.print(line, markup=False, soft_wrap=True),
            workers=scratch,
            verbose=verbose,
            market_scenario=market,
        )
    except (DeployError, PortInUse, PriceFileError, ScenarioError, MarketSpecError) as e:
        fail(str(e))
    raise typer.Exit(code)


@local_app.command("interrupt")
def local_interrupt_command(
    instance_id: Annotated[str | None, typer.Argument(help="the instance (default: --job's newest)")] = None,
    job: Annotated[str | None, typer.Option("--job", help="the job whose running instance is interrupted")] = None,
    notice: Annotated[
        str, typer.Option("--notice", help="time from the warning to the instance's end (EC2: 2m)", metavar="DURATION")
    ] = "2m",
    rebalance_first: Annotated[
        bool, typer.Option("--rebalance-first", help="a rebalance recommendation before the warning")
    ] = False,
    endpoint_url: Annotated[
        str | None,
        typer.Option("--endpoint-url", envvar="AWS_ENDPOINT_URL", help="`local up`'s endpoint (default: port 5055)"),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="what was sent, as JSON")] = False,
) -> None:
    """Send a spot interruption to an instance of `spotrelay local up`, as AWS FIS does.

    \b
    The interruption warning appears in the instance's IMDS and on
    EventBridge (EC2 Spot Instance Interruption Warning, AWS's shape),
    after a rebalance recommendation with --rebalance-first; the instance
    is terminated when the notice runs out. The agent checkpoints, the
    control plane relaunches the job on another pool, where it resumes.
    """
    from spotrelay.local.up_workers import INTERRUPT_PATH

    if (instance_id is None) == (job is None):
        fail("give an INSTANCE_ID or --job JOB_ID (one of them)")
    seconds = option_seconds(notice, "--notice")
    if not 1 <= seconds <= 3600:
        fail(f"--notice: {notice!r} is not between 1s and 1h (EC2 gives 2m)")
    base = (endpoint_url or "http://localhost:5055").rstrip("/")
    body = json.dumps(
        {"instance_id": instance_id, "job_id": job, "notice_seconds": seconds, "rebalance_first": rebalance_first}
    ).encode()
    request = urllib.request.Request(
        base + INTERRUPT_PATH, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(request, timeout=30) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read()).get("error", str(e))
        except ValueError:
            reason = f"{base} answered {e.code}: is it `spotrelay local up`?"
        fail(reason, code=1)
    except (urllib.error.URLError, OSError) as e:
        fail(f"cannot reach `spotrelay local up` at {base}: {getattr(e, 'reason', e)}", code=1)
    if json_output:
        out.print_json(data=answer)
        return
    extra = " after a rebalance recommendation" if answer.get("rebalance_recommended") else ""
    out.print(
        f"{answer['instance_id']} ({answer['job_id']} attempt {answer['attempt']}): interruption warning sent{extra}; "
        f"the instance ends at {answer['terminates_at']}",
        markup=False,
        soft_wrap=True,
    )


@app.command("bench")
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


@app.command("replay")
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
app.add_typer(events_app, name="events")


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


def main() -> None:
    app()
