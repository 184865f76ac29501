"""What one replay holds (`ReplayState`: the scenario, the clock, the agenda, the timeline, the jobs and
workers it tracks), the host its workers, Lambda's retries and the chaos talk to (now, schedule, note, emit,
terminate), and the environment it runs in (no real account reachable).

`ReplayState` is the base of the replay's parts: spotrelay.local.replay_inputs (what it sends into the system),
spotrelay.local.replay_observe (what it sees the system do, and the report), spotrelay.local.replay (the
`Replay` class that joins them, and its loop).
"""

from __future__ import annotations

import heapq
import io
import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.local.chaos import Chaos
from spotrelay.local.clock import DEFAULT_STALL_SECONDS, VirtualClock
from spotrelay.local.deploy import LocalStack
from spotrelay.local.imds import InstanceMetadataService
from spotrelay.local.invariants import InvariantMonitor
from spotrelay.local.lambdas import AsynchronousInvocations
from spotrelay.local.outages import FunctionOutages
from spotrelay.local.recorded import instance_event, load_recorded
from spotrelay.local.replay_report import OperatorReport, TimelineEntry
from spotrelay.local.runtime import LocalRuntime
from spotrelay.local.scenario import Scenario, Submission
from spotrelay.local.workers import AgentLogbook, InstanceWorker
from spotrelay.market import from_scenario_market
from spotrelay.models import Attempt

STALL_SECONDS = DEFAULT_STALL_SECONDS  # a deadlock detector: see spotrelay.local.clock


@dataclass
class TrackedJob:
    submission: Submission
    job_id: str
    message_id: str
    submitted_at: datetime
    done: bool = False
    launched: bool = False


@contextmanager
def _offline_environment() -> Iterator[None]:
    """Nothing of the replay may reach a real account: no profile, no endpoint, fake credentials."""
    saved = {k: os.environ.get(k) for k in _OFFLINE}
    try:
        for key, value in _OFFLINE.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


_OFFLINE: dict[str, str | None] = {
    "AWS_PROFILE": None,
    "AWS_DEFAULT_PROFILE": None,
    "AWS_SESSION_TOKEN": None,
    "AWS_SECURITY_TOKEN": None,
    "AWS_ENDPOINT_URL": None,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}


class ReplayState:
    """One replay's state, and the host of its workers (the base of `spotrelay.local.replay.Replay`)."""

    # set once the stack is deployed (`Replay.run`)
    runtime: LocalRuntime
    stack: LocalStack
    store: DynamoJobStore
    storage: S3CheckpointStorage
    tokens: StepFunctionsTaskTokens
    checkpoint_root: Path
    # set by `_attach_outages` (spotrelay.local.replay_inputs) and `Replay._load_agenda`
    _asynchronous: AsynchronousInvocations | None
    _outages: FunctionOutages | None
    _operator: list[OperatorReport]
    _pending_submissions: int

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int | None = None,
        template: Path | None = None,
        chaos: int | None = None,
        function_log_level: str | None = None,
    ) -> None:
        self.scenario = scenario
        # the functions' Powertools log level (they print to stdout, as on Lambda); None: errors only
        self.function_log_level = function_log_level
        self.function_output = io.StringIO()  # what the handlers printed (their log lines): not the replay's
        self.seed = scenario.seed if seed is None else seed
        self.chaos = Chaos(chaos) if chaos is not None else None
        self.template = template
        self.market = from_scenario_market(scenario.market, scenario.base_dir, scenario.start)
        self.clock = VirtualClock(scenario.start, stall_seconds=STALL_SECONDS)
        self.horizon = scenario.at(scenario.horizon)
        self._agenda: list[tuple[datetime, int, str, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._timeline: list[TimelineEntry] = []
        self.jobs: dict[str, TrackedJob] = {}  # by name
        self._by_id: dict[str, TrackedJob] = {}
        self.workers: dict[str, InstanceWorker] = {}  # by instance id
        self._workers_by_attempt: dict[tuple[str, int], InstanceWorker] = {}
        self.imds = InstanceMetadataService(self.clock)
        self.region = scenario.region
        self.logbook = AgentLogbook(self.clock, self._workers_by_attempt)
        self._seen_launches = 0
        self._seen_refusals = 0
        self._seen_invocations = 0
        self._alarm = "OK"
        self._events_injected = 0
        self._attempt_cache: dict[str, list[Attempt]] = {}  # filled by the report, once the replay is over
        self.invariants = InvariantMonitor(
            reconcile_period=timedelta(minutes=scenario.schedule_minutes), market=self.market
        )  # bills are checked against the scenario's prices
        self._checked_activity: tuple[int, int, int] | None = None  # what had happened at the last check
        self._recorded = load_recorded()

    # --- the host of the workers -------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._agenda, (max(when, self.clock.now()), next(self._seq), label, action))

    def note(self, job: str, text: str, when: datetime | None = None) -> None:
        self._timeline.append(TimelineEntry(when or self.clock.now(), next(self._seq), job, text))

    def emit(self, kind: str, instance_id: str, **detail: str) -> None:
        """An EC2 event in its recorded AWS shape, about `instance_id`, on EventBridge now."""
        self._put(self._bound(self._recorded[kind], instance_id, **detail))

    def terminate(self, instance_id: str) -> None:
        self.runtime.ec2.terminate_instances(InstanceIds=[instance_id])

    # --- events ------------------------------------------------------------------------------------

    def _bound(self, template: dict[str, Any], instance_id: str, **detail: str) -> dict[str, Any]:
        stack = self.stack
        return instance_event(
            template, instance_id, account_id=stack.account_id, region=stack.region, when=self.clock.now(), **detail
        )

    def _put(self, event: dict[str, Any]) -> None:
        self.runtime.put_event(event)


__all__ = ["STALL_SECONDS", "ReplayState", "TrackedJob"]
