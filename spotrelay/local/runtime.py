"""The whole system on moto in this process: moto's mock, the patches, the clock, the market, the
deployed stack. What the replay engine (and the tests) build on.

    clock = VirtualClock(start)
    with LocalRuntime(clock=clock, market=market) as runtime:
        stack = runtime.deploy()                     # cdk.out/SpotRelay.template.json into moto
        runtime.sqs.send_message(QueueUrl=stack.queue_url, MessageBody=json.dumps(spec))
        with clock.exclusive():                      # inject, then let what it woke run
            runtime.put_event(recorded_alarm_event)  # EventBridge -> rule -> dispatcher (in-process)
        clock.wait_quiescent()                       # every execution blocked on the clock, or done
        clock.advance_to(clock.now() + timedelta(minutes=5))   # Wait states / retries / timeouts fire
        runtime.market_launches()                    # what EC2 started, where, when

Everything moto keeps (and the patches) lives for the `with` block: leaving it closes the clock
(executions still waiting stay parked), uninstalls the patches and stops moto's mock.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import boto3
from botocore.config import Config
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.moto_api._internal import mock_random

from spotrelay.local import patches
from spotrelay.local.clock import ClockClosed, ClockStalled, SimulationClock, VirtualClock, WallClock
from spotrelay.local.deploy import LocalStack, deploy_template, synthesize, template_path
from spotrelay.local.ec2_market import Ec2Market, Launch
from spotrelay.local.lambdas import QUIET_ENV, REPO_ROOT, InProcessLambdas
from spotrelay.market import SpotMarket

if TYPE_CHECKING:
    from moto.core.config import DefaultConfig
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient

MOTO_CONFIG: dict[str, Any] = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": True},  # the Docker backend's `_invoke_lambda` is what runs handlers in-process
}
DRIVER_CONFIG = Config(retries={"total_max_attempts": 1})
STOP_GRACE_SECONDS = 5.0


def _request_ids() -> Iterator[str]:
    while True:
        yield str(mock_random.uuid4())


class LocalRuntime:
    """moto + patches + clock (+ market) for the length of a `with` block. One at a time per process."""

    def __init__(
        self,
        *,
        clock: SimulationClock | None = None,
        market: SpotMarket | None = None,
        region: str = "us-east-1",
        code_root: Path = REPO_ROOT,
        quiet: bool = True,  # functions log errors only, no EMF metrics; moto logs nothing
        seed: int | None = None,
        function_overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.clock: SimulationClock = clock or VirtualClock(market.start if market else datetime.now(UTC))
        self.region = region
        self.code_root = code_root
        self.seed = seed
        self.quiet = quiet
        self._moto_log_level: int | None = None
        self.lambdas = InProcessLambdas(
            self.clock,
            code_root=code_root,
            overrides={**(QUIET_ENV if quiet else {}), **(function_overrides or {})},
            request_ids=_request_ids(),
        )
        self.market = Ec2Market(market, self.clock) if market is not None else None
        self.stack: LocalStack | None = None
        self._mock: Any = None
        self._installed: patches.Installed | None = None
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()

    # --- lifetime ----------------------------------------------------------------------------------

    def __enter__(self) -> LocalRuntime:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self.quiet:
            # moto logs the errors an execution's states raise (a Catch handles them): not the replay's output.
            moto_logger = logging.getLogger("moto")
            self._moto_log_level = moto_logger.level
            moto_logger.setLevel(logging.CRITICAL)
            # Powertools warns when an invocation added no metric (a reconcile with nothing to count):
            # a line in the function's log on Lambda, noise in the replay's and the server's output here
            warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)
        self._mock = mock_aws(config=cast("DefaultConfig", copy.deepcopy(MOTO_CONFIG)))
        self._mock.start()
        if self.seed is not None:
            mock_random.seed(self.seed)
        try:
            self._installed = patches.install(self.clock, self.lambdas, self.market)
        except BaseException:
            self._mock.stop()
            raise

    def stop(self) -> None:
        if isinstance(self.clock, VirtualClock):
            # Let a running execution reach its next wait first: after the mock stops, its AWS calls
            # would leave the process.
            with suppress(ClockStalled, ClockClosed):
                self.clock.wait_quiescent(timeout=STOP_GRACE_SECONDS)
            self.clock.close()
        elif isinstance(self.clock, WallClock):
            self.clock.close()
        if self._installed is not None:
            self._installed.uninstall()
            self._installed = None
        self.lambdas.unload()
        with self._clients_lock:
            self._clients.clear()
        if self._mock is not None:
            self._mock.stop()
            self._mock = None
        if self._moto_log_level is not None:
            logging.getLogger("moto").setLevel(self._moto_log_level)
            self._moto_log_level = None

    # --- the stack ---------------------------------------------------------------------------------

    def deploy(self, template: Path | None = None, *, synth_if_missing: bool = True) -> LocalStack:
        """Deploy the synthesized template (default: <code_root>/cdk.out/SpotRelay.template.json)."""
        path = template or template_path(self.code_root / "cdk.out")
        if not path.is_file() and template is None and synth_if_missing:
            synthesize(self.code_root)
        self.stack = deploy_template(path, region=self.region)
        return self.stack

    @property
    def deliveries(self) -> list[patches.Delivery]:
        """Every event EventBridge delivered to a Lambda or Step Functions target, with its error."""
        return self._installed.deliveries if self._installed is not None else []

    def market_launches(self) -> list[Launch]:
        return list(self.market.launches) if self.market is not None else []

    # --- clients (no SDK retries: they would sleep in real time) -----------------------------------
    # One client per service, made on first use and kept (boto3's clients are thread-safe; making one
    # costs about as much as a dozen calls, and without it the replay would make one per injected event).

    def client(self, service: str) -> Any:
        with self._clients_lock:
            made = self._clients.get(service)
            if made is None:
                made = self._clients[service] = boto3.client(  # type: ignore[call-overload]
                    service, region_name=self.region, config=DRIVER_CONFIG
                )
            return made

    @property
    def sqs(self) -> SQSClient:
        return cast("SQSClient", self.client("sqs"))

    @property
    def sfn(self) -> SFNClient:
        return cast("SFNClient", self.client("stepfunctions"))

    @property
    def ec2(self) -> EC2Client:
        return cast("EC2Client", self.client("ec2"))

    @property
    def dynamodb(self) -> DynamoDBClient:
        return cast("DynamoDBClient", self.client("dynamodb"))

    @property
    def s3(self) -> S3Client:
        return cast("S3Client", self.client("s3"))

    @property
    def events(self) -> EventBridgeClient:
        return cast("EventBridgeClient", self.client("events"))

    # --- injecting events --------------------------------------------------------------------------

    def put_event(self, event: Mapping[str, Any], *, at: datetime | None = None) -> str:
        """Put one event in the AWS shape (a recorded one: source, detail-type, detail, resources) on the
        default bus, stamped with `at` (default: the clock's now). Returns its event id."""
        return self.put_events([event], at=at)[0]

    def fire_schedule(self, rule_name: str) -> str:
        """Fire a schedule rule now (moto runs no schedule): its targets get a `Scheduled Event`."""
        account_id = self.stack.account_id if self.stack is not None else DEFAULT_ACCOUNT_ID
        return patches.fire_scheduled_rule(rule_name, account_id=account_id, region=self.region, when=self.clock.now())

    def put_events(self, events: Sequence[Mapping[str, Any]], *, at: datetime | None = None) -> list[str]:
        when = at or self.clock.now()
        entries: list[PutEventsRequestEntryTypeDef] = [
            {
                "Source": str(event["source"]),
                "DetailType": str(event["detail-type"]),
                "Detail": json.dumps(event.get("detail", {})),
                "Resources": [str(r) for r in event.get("resources", [])],
                "Time": when,
            }
            for event in events
        ]
        ids: list[str] = []
        for start in range(0, len(entries), 10):
            answer = self.events.put_events(Entries=entries[start : start + 10])
            for entry in answer["Entries"]:
                if "EventId" not in entry:
                    raise ValueError(
                        f"PutEvents refused an event: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}"
                    )
                ids.append(entry["EventId"])
        return ids
