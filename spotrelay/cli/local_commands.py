"""`spotrelay local up / interrupt`: the whole stack on moto on this machine (spotrelay.local.server), and a
spot interruption sent to one of its instances. moto is imported when one runs.

Registered by spotrelay.cli.app as the `local` group; its siblings for offline runs: spotrelay.cli.replay_commands.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from spotrelay.cli.console import fail, option_seconds, out
from spotrelay.market import PriceFileError

local_app = typer.Typer(
    name="local",
    help="The whole stack on moto, on this machine (no AWS account).",
    no_args_is_help=True,
    add_completion=False,
)


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
