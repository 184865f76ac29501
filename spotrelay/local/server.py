"""`spotrelay local up`: the stack deployed into moto, served over HTTP for the AWS CLI, boto3 in
another process, or `cdk deploy`.

moto's server runs in this process next to moto's in-process mock: both use the same backends, so
what the server's clients create, the in-process Lambda functions and state machines see, and the
other way round. Time is the wall clock (`WallClock`, optionally faster): Wait states, Retry
intervals and heartbeats run in real (or scaled) time, because nothing drives a virtual clock here.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from spotrelay.aws.deployed_stack import DEFAULT_STACK
from spotrelay.config import ENV_HEARTBEAT_SECONDS, SCHEDULE_MINUTES
from spotrelay.local.clock import WallClock
from spotrelay.local.deploy import LocalStack
from spotrelay.local.lambdas import REPO_ROOT
from spotrelay.local.runtime import LocalRuntime
from spotrelay.local.up_workers import PREFIX as UP_PREFIX
from spotrelay.local.up_workers import LocalWorkers
from spotrelay.market import MarketBuilder, SpotMarket, from_scenario_market

DEFAULT_PORT = 5055
NO_WORKER_HEARTBEAT_SECONDS = 30 * 24 * 3600  # under the Run task's own timeout (a year)
DEFAULT_HOST = "localhost"  # not 127.0.0.1: the CDK CLI and some SDKs treat the two differently
DEFAULT_PRICES = REPO_ROOT / "events" / "prices" / "us-east-1-example.csv"


class PortInUse(RuntimeError):
    pass


@dataclass(frozen=True)
class ServedStack:
    endpoint_url: str
    stack: LocalStack
    runtime: LocalRuntime
    workers: LocalWorkers | None = None


def price_market(prices: Path, start: datetime) -> SpotMarket:
    """A market from a PRICES.csv (the table of `spotrelay place`), unlimited capacity."""
    return MarketBuilder(start).add_price_file(prices).build()


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


class _Server:
    """moto's server (as `ThreadedMotoServer` serves it), with `wrap` around its WSGI app."""

    def __init__(self, host: str, port: int, wrap: Callable[[Any], Any] | None = None) -> None:
        app: Any = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(
            host, port, wrap(app) if wrap else app, threaded=True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()


@contextmanager
def serve_local_stack(
    *,
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    region: str = "us-east-1",
    template: Path | None = None,
    market: SpotMarket | None = None,
    speed: float = 1.0,
    code_root: Path = REPO_ROOT,
    quiet: bool = False,
    workers: Path | None = None,
    echo: Callable[[str], None] = lambda line: None,
) -> Iterator[ServedStack]:
    """moto's server on host:port with the stack deployed; stops both when the block ends. With `workers` (a
    scratch directory), every instance the control plane launches runs a real agent (spotrelay.local.up_workers)."""
    _check_port(host, port)
    clock = WallClock(market.start if market is not None else None, speed=speed)
    # Without workers nothing heartbeats: a Run task would time out and the job be relaunched as lost every
    # heartbeat (15 min). Launched jobs stay LAUNCHING instead.
    overrides = {} if workers is not None else {ENV_HEARTBEAT_SECONDS: str(NO_WORKER_HEARTBEAT_SECONDS)}
    with LocalRuntime(
        clock=clock, market=market, region=region, code_root=code_root, quiet=quiet, function_overrides=overrides
    ) as runtime:
        # werkzeug prints a line for every request (each boto3 call, each poll): its warnings are enough
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        endpoint_url = f"http://{host}:{port}"
        instances: LocalWorkers | None = None
        stack: LocalStack | None = None

        def wrap(app: Any) -> Any:
            def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
                if "HTTP_ORIGIN" in environ:
                    return _refused(start_response, 403, BROWSER_REFUSED)
                if environ.get("PATH_INFO", "").startswith(UP_PREFIX):
                    if instances is None:
                        return _refused(start_response, 404, "this local up runs no workers (--no-workers)")
                    return instances.serve(environ, start_response)
                return app(environ, start_response)

            return serve

        server = _Server(host, port, wrap)
        server.start()
        stopped = threading.Event()
        schedule: threading.Thread | None = None
        try:
            stack = runtime.deploy(template)
            if workers is not None:
                instances = LocalWorkers(runtime, clock, stack, endpoint_url, workers, echo=echo)
                instances.start()
            # moto runs no EventBridge schedule: fire the stack's (dispatch + reconcile) on the wall clock
            schedule = threading.Thread(
                target=_fire_schedules, args=(runtime, stack, speed, stopped), name="schedule", daemon=True
            )
            schedule.start()
            yield ServedStack(endpoint_url=endpoint_url, stack=stack, runtime=runtime, workers=instances)
        finally:
            stopped.set()
            if schedule is not None:
                schedule.join(timeout=30)
            if instances is not None:
                instances.stop()
            server.stop()


# A browser sends Origin with every cross-origin request (its CORS preflight, and a form's POST), an SDK or the
# AWS CLI never does. moto's server answers any origin's preflight, so without this any web page open in a
# browser on this machine could send a job to the queue, and with workers its command would run here.
BROWSER_REFUSED = "local up answers no browser (a request with an Origin header): use the AWS CLI or an SDK"


def _refused(start_response: Callable[..., Any], status: int, message: str) -> list[bytes]:
    start_response(f"{status} Refused", [("Content-Type", "application/json")])
    return [json.dumps({"error": message}).encode()]


def _fire_schedules(runtime: LocalRuntime, stack: LocalStack, speed: float, stopped: threading.Event) -> None:
    """Every SCHEDULE_MINUTES of simulated time, fire every schedule rule of the stack, until `stopped`."""
    log = logging.getLogger(__name__)
    while not stopped.wait(SCHEDULE_MINUTES * 60 / speed):
        for rule in stack.schedule_rules:
            try:
                runtime.fire_schedule(rule)
            except Exception:  # a failing target is the function's to report; the schedule goes on
                log.exception("schedule rule failed", extra={"rule": rule})


def describe(served: ServedStack) -> list[str]:
    """What `local up` prints: the endpoint, the names, and how to talk to it."""
    stack = served.stack
    lines = [
        f"spotrelay stack {stack.stack_name} deployed into moto in {stack.deploy_seconds:.2f} s",
        f"  endpoint        {served.endpoint_url}   (region {stack.region}, account {stack.account_id})",
        f"  job queue       {stack.queue_url}",
        f"  dead letters    {stack.dlq_url}",
        f"  table           {stack.table_name}",
        f"  bucket          {stack.bucket_name}",
        f"  state machine   {stack.state_machine_arn}",
        f"  launch template {stack.launch_template_id}",
        f"  agent log group {stack.outputs.get('AgentLogGroupName', '-')}   (spotrelay logs JOB_ID)",
        (
            f"  instances       each runs a real agent and the job's command, in {served.workers.root}/<instance id>"
            if served.workers is not None
            else "  instances       run no agent (--no-workers): launched jobs stay LAUNCHING"
        ),
        "  subnets         " + ", ".join(f"{zone} {subnet}" for zone, subnet in stack.subnets.items()),
        "  functions",
        *(f"    {name:<12}  {function}" for name, function in stack.functions.items()),
        "",
        "Try it (any credentials do):",
        f"  export AWS_REGION={stack.region} AWS_DEFAULT_REGION={stack.region} AWS_ACCESS_KEY_ID=testing "
        f"AWS_SECRET_ACCESS_KEY=testing AWS_ENDPOINT_URL={served.endpoint_url}",
        f"  spotrelay submit events/jobs/tiny-train.yaml{_stack_option(stack.stack_name)}   # prints the job's id",
        *(
            f"  spotrelay {command}{_stack_option(stack.stack_name)}"
            for command in (
                "status JOB_ID",
                "logs -f JOB_ID",
                "ls --all",
                "cost JOB_ID",
                "cancel JOB_ID",
                "resume JOB_ID",
            )
        ),
        *(
            [
                f"  spotrelay local interrupt --job JOB_ID{_stack_option(stack.stack_name)}   "
                "# a spot interruption: the two-minute warning, then the instance ends",
            ]
            if served.workers is not None
            else []
        ),
        "or with the AWS CLI:",
        f"  aws --endpoint-url {served.endpoint_url} sqs send-message --queue-url {stack.queue_url} "
        "--message-body file://job.json",
        f"  aws --endpoint-url {served.endpoint_url} lambda invoke "
        f"--function-name {stack.functions.get('dispatcher', '<dispatcher>')} /dev/stdout",
        f"  aws --endpoint-url {served.endpoint_url} stepfunctions list-executions "
        f"--state-machine-arn {stack.state_machine_arn}",
        "",
        "Ctrl-C stops it.",
    ]
    return lines


def _stack_option(name: str) -> str:
    return "" if name == DEFAULT_STACK else f" --stack {name}"


def run_local_up(
    *,
    port: int,
    region: str,
    prices: Path | None,
    template: Path | None,
    speed: float,
    echo: Callable[[str], None],
    until: threading.Event | None = None,
    workers: Path | None = None,
    verbose: bool = False,
    market_scenario: Path | None = None,
) -> int:
    """Serve until Ctrl-C (or `until` is set); returns the exit status. `workers`: the instances' scratch
    directories (None: the instances run no agent). `verbose`: every function's log lines and metrics here
    (else their errors only)."""
    now = datetime.now(UTC)
    if market_scenario is not None:  # its prices and outages from now on: its hour 0 is when local up starts
        from spotrelay.local.scenario import load_scenario

        scenario = load_scenario(market_scenario)
        market: SpotMarket | None = from_scenario_market(scenario.market, scenario.base_dir, now)
    else:
        market = price_market(prices, now) if prices is not None else None
    stop = until or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())  # `kill`, docker stop: as Ctrl-C
    with serve_local_stack(
        port=port,
        region=region,
        template=template,
        market=market,
        speed=speed,
        workers=workers,
        echo=echo,
        quiet=not verbose,
    ) as served:
        try:
            for line in describe(served):
                echo(line)
            while not stop.wait(3600):
                pass
        except KeyboardInterrupt:
            pass
        echo("stopping")
    return 0
