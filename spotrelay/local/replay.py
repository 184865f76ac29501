"""The replay engine: a scenario (spotrelay.local.scenario) run through the whole system on moto, on
the virtual clock, with a timeline and a cost report.

    result = replay(load_scenario("events/scenarios/interruption-relaunch.yaml"), seed=7)
    print(render_text(result)); json.dumps(result.to_json())

What the replay does (and AWS would):
- deploys the synthesized template into moto (`LocalRuntime.deploy`), with the scenario's `stack:`
  settings applied to the functions' environment variables (UpdateFunctionConfiguration, as a
  re-deploy with other CDK context would set them);
- sends each job's JSON to the job queue at its time; one minute later the queue-depth alarm goes to
  ALARM (its `CloudWatch Alarm State Change` event, in the recorded shape), and back to OK once the
  queue is empty; the safety-net schedule fires every 5 minutes of virtual time (dispatch + reconcile);
- runs the real worker agent on every instance the market lets Launch start (spotrelay.local.workers):
  `running` state change, IMDS for the instance, the agent's restore, periodic checkpoints into moto S3,
  heartbeats, and its report on the task token; the job is a simulated process (spotrelay.local.sim_job);
- interrupts as the market says (`SpotMarket.interruption_time`: the pool's capacity goes, or its price
  rises above the launch's MaxPrice): the interruption warning two minutes before (EventBridge and the
  instance's IMDS), the agent's final checkpoint and SendTaskFailure, the `shutting-down` state change then
  (and `terminated` 30 s later);
- injects the scenario's recorded events at their times, bound to the named job's attempt (its
  `detail.instance-id` and instance ARN replaced); an injected warning, rebalance or termination acts
  on the simulated worker as it would on a real instance;
- checks the invariants of every replay (spotrelay.local.invariants) after each step and at the end: a
  violation fails the replay, as a failed expectation does;
- under a scenario's `outages_of_functions` (spotrelay.local.outages), fails every Lambda invocation in each
  window before its handler runs: the tasks' Retry waits it out, EventBridge's events are retried by Lambda
  and then dead-lettered; its `operator:` steps then run the recovery the README's runbook gives
  (spotrelay.aws.recovery, as `spotrelay admin redrive` / `replay-archive` call it), each reported in
  `ReplayResult.operator`;
- under a chaos seed (`replay(..., chaos=SEED)`, spotrelay.local.chaos), injects faults at random,
  reproducibly: EventBridge deliveries duplicated, delayed or dropped, Lambda invocations failed (and
  retried as Lambda and the state machine do), spot launches refused, interruption warnings at any phase
  of an instance. Only the invariants decide whether such a replay passed.

Everything runs on one VirtualClock: the driver (this module) moves time from one wake-up to the next
(its own agenda, and the executions' Wait states, Retry intervals and task-token timeouts). For a
scenario and a seed the replay is deterministic.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import io
import itertools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from moto.moto_api._internal import mock_random

from spotrelay.aws import recovery
from spotrelay.aws.checkpoints import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.config import (
    ENV_BLOCK_MINUTES,
    ENV_BUDGET_USD_PER_HOUR,
    ENV_HEARTBEAT_SECONDS,
    ENV_MAX_CONCURRENT_JOBS,
    ENV_SPOT_VCPU_QUOTAS,
    EVENT_TARGET_DLQ_OUTPUT,
    TAG_ATTEMPT,
    TAG_JOB_ID,
)
from spotrelay.control.accounting import on_demand_cost
from spotrelay.control.dispatcher import job_id_for
from spotrelay.control.ports import NotFoundError
from spotrelay.local import patches
from spotrelay.local.chaos import Chaos, ChaosKind, ChaosReport
from spotrelay.local.chaos import summary as chaos_summary
from spotrelay.local.clock import DEFAULT_STALL_SECONDS, VirtualClock
from spotrelay.local.deploy import LocalStack
from spotrelay.local.ec2_market import Launch
from spotrelay.local.imds import InstanceMetadataService
from spotrelay.local.invariants import InvariantMonitor, Violation, peek, read, report_json, summary
from spotrelay.local.lambdas import AsynchronousInvocations
from spotrelay.local.outages import AsynchronousDeliveries, FunctionOutages, dead_letters_to_sqs
from spotrelay.local.recorded import instance_event, iso, load_recorded
from spotrelay.local.runtime import LocalRuntime
from spotrelay.local.scenario import (
    Expectation,
    Injection,
    OperatorAction,
    OperatorStep,
    Scenario,
    ScenarioError,
    Submission,
    injections,
    submissions,
)
from spotrelay.local.workers import AgentLogbook, InstanceWorker
from spotrelay.market import from_scenario_market
from spotrelay.models import Attempt, Job, JobState, Market

ALARM_PERIOD = timedelta(minutes=1)
STALL_SECONDS = DEFAULT_STALL_SECONDS  # a deadlock detector: see spotrelay.local.clock
DEFAULT_WORK_HOURS = 1.0  # a job that does not say how long it runs
REFUSED = "EC2 refused"  # how the timeline notes a launch EC2 refused
_GONE = {"stopping", "stopped", "shutting-down", "terminated"}

EVENT_TARGETS = "event targets"  # how the operator report names the rule targets' DLQ


# ------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime
    seq: int
    job: str
    text: str


@dataclass
class TrackedJob:
    submission: Submission
    job_id: str
    message_id: str
    submitted_at: datetime
    done: bool = False
    launched: bool = False


@dataclass(frozen=True)
class AttemptReport:
    instance_type: str
    availability_zone: str
    market: str
    start: datetime
    end: datetime | None
    outcome: str | None
    hourly_price: float
    agent: tuple[dict[str, Any], ...] = ()  # what the instance's agent did, and when (InstanceWorker.summary)
    notice_to_final_checkpoint_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "availability_zone": self.availability_zone,
            "market": self.market,
            "start": iso(self.start),
            "end": iso(self.end) if self.end is not None else None,
            "outcome": self.outcome,
            "notice_to_final_checkpoint_seconds": self.notice_to_final_checkpoint_seconds,
            "agent": list(self.agent),
        }


@dataclass(frozen=True)
class JobReport:
    name: str
    entry: str
    job_id: str
    state: str
    attempts: tuple[AttemptReport, ...]
    cost: float
    on_demand_cost: float
    lost_work_hours: float
    interruptions: int
    failure_reason: str | None
    submitted_at: datetime
    ended_at: datetime | None
    in_dlq: bool

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "job_id": self.job_id,
            "state": self.state,
            "attempts": [a.to_json() for a in self.attempts],
            "cost": round(self.cost, 4),
            "on_demand_cost": round(self.on_demand_cost, 4),
            "lost_work_hours": round(self.lost_work_hours, 4),
        }


@dataclass(frozen=True)
class ExpectationResult:
    expectation: Expectation
    passed: bool
    detail: str


@dataclass(frozen=True)
class OperatorReport:
    """One `operator:` step as it ran: redrive-dlq (per DLQ: found, handled, failed, depth before and
    after) or replay-archive (the replay's name, window, and the deliveries it made)."""

    at: datetime
    run: str
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "run": self.run, **self.detail}


@dataclass
class ReplayResult:
    scenario: Scenario
    seed: int
    jobs: list[JobReport]
    timeline: list[TimelineEntry]
    expectations: list[ExpectationResult]
    ended_at: datetime
    wall_seconds: float
    deploy_seconds: float
    launches: int = 0
    refusals: int = 0
    events_injected: int = 0
    lambda_invocations: int = 0
    checkpoints: int = 0
    invariant_checks: int = 0  # spotrelay.local.invariants: after each step where something happened, at the end
    violations: list[Violation] = field(default_factory=list)
    chaos: ChaosReport | None = None  # what a chaos seed injected (spotrelay.local.chaos)
    operator: list[OperatorReport] = field(default_factory=list)  # the scenario's operator: steps, as they ran
    dead_lettered: dict[str, int] = field(default_factory=dict)  # function -> events Lambda sent to its DLQ
    failed_by_outage: dict[str, int] = field(default_factory=dict)  # function -> invocations an outage failed

    @property
    def passed(self) -> bool:
        """No invariant broken, and (without chaos, which may legitimately break them) every expectation met."""
        if self.violations:
            return False
        return self.chaos is not None or all(e.passed for e in self.expectations)

    @property
    def simulated_hours(self) -> float:
        return (self.ended_at - self.scenario.start).total_seconds() / 3600

    def to_json(self) -> dict[str, Any]:
        passed = sum(1 for e in self.expectations if e.passed)
        return {
            "jobs": [j.to_json() for j in self.jobs],
            "expectations": {"passed": passed, "failed": len(self.expectations) - passed},
            "invariants": report_json(self.invariant_checks, self.violations),
            **({"chaos": self.chaos.to_json()} if self.chaos is not None else {}),
            **({"operator": [o.to_json() for o in self.operator]} if self.operator else {}),
        }


# ------------------------------------------------------------------------------------------- engine


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


class Replay:
    """One replay of one scenario (use `replay()`)."""

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

    def _alarm_event(self, value: str) -> dict[str, Any]:
        event = copy.deepcopy(self._recorded["alarm"])
        stack = self.stack
        name = stack.depth_alarm_name
        now = self.clock.now()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.000+0000")
        event["account"], event["region"], event["time"] = stack.account_id, stack.region, iso(now)
        event["resources"] = [f"arn:aws:cloudwatch:{stack.region}:{stack.account_id}:alarm:{name}"]
        detail = event["detail"]
        detail["alarmName"] = name
        for metric in detail["configuration"]["metrics"]:
            metric["metricStat"]["metric"]["dimensions"]["QueueName"] = stack.queue_url.rsplit("/", 1)[-1]
        detail["previousState"]["value"] = self._alarm
        detail["previousState"]["timestamp"] = detail["state"]["timestamp"]
        detail["state"]["value"] = value
        detail["state"]["timestamp"] = stamp
        return dict(event)

    def _evaluate_alarm(self) -> None:
        """The queue-depth alarm (>= 1 visible message over a minute): its state change, if any."""
        attributes = self.runtime.sqs.get_queue_attributes(
            QueueUrl=self.stack.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        depth = int(attributes.get("ApproximateNumberOfMessages", "0"))
        value = "ALARM" if depth >= 1 else "OK"
        if value != self._alarm:
            self._put(self._alarm_event(value))
            self._alarm = value

    def _tick(self) -> None:
        for rule in self.stack.schedule_rules:
            self.runtime.fire_schedule(rule)
        self._evaluate_alarm()
        self.schedule(self.clock.now() + timedelta(minutes=self.scenario.schedule_minutes), "schedule", self._tick)

    def _submit(self, batch: Sequence[Submission]) -> None:
        for submission in batch:
            message_id = self.runtime.sqs.send_message(QueueUrl=self.stack.queue_url, MessageBody=submission.body)[
                "MessageId"
            ]
            try:
                data = json.loads(submission.body)
            except json.JSONDecodeError:
                data = None
            name = data.get("name") if isinstance(data, dict) else None
            job_id = job_id_for(name if isinstance(name, str) and name else "invalid", message_id)
            tracked = TrackedJob(submission, job_id, message_id, self.clock.now())
            self.jobs[submission.name] = tracked
            self._by_id[job_id] = tracked
            self.note(submission.name, f"submitted ({job_id})")
        self.schedule(self.clock.now() + ALARM_PERIOD, "alarm", self._evaluate_alarm)

    def _inject(self, injection: Injection) -> None:
        event = copy.deepcopy(injection.event)
        worker: InstanceWorker | None = None
        if injection.job is not None:
            tracked = self.jobs.get(injection.job)
            worker = (
                self._workers_by_attempt.get((tracked.job_id, injection.attempt or 1)) if tracked is not None else None
            )
            if worker is None:
                self.note(
                    injection.job,
                    f"recorded event {injection.source} not injected: attempt {injection.attempt or 1} has no instance",
                )
                return
            event = self._bound(event, worker.instance_id)
        else:
            event["time"] = iso(self.clock.now())
        self._put(event)
        self._events_injected += 1
        kind = str(event.get("detail-type", ""))
        label = injection.job or "-"
        self.note(label, f"injected {kind} ({injection.source})")
        if worker is None:
            return
        detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
        assert isinstance(detail, dict)
        if kind == "EC2 Spot Instance Interruption Warning":
            worker.notice("injected")
        elif kind == "EC2 Instance Rebalance Recommendation":
            worker.rebalance()
        elif kind == "EC2 Instance State-change Notification" and detail.get("state") in _GONE:
            worker.lost()

    def _terminated(self, instance_ids: Sequence[str]) -> None:
        """TerminateInstances went through (the control plane's, or the replay's own at a notice's end)."""
        for instance_id in instance_ids:
            worker = self.workers.get(instance_id)
            if worker is not None:
                worker.terminated_by_control_plane()

    # --- observing the system ----------------------------------------------------------------------

    def _observe(self) -> None:
        market = self.runtime.market
        assert market is not None
        # Refusals first: Launch tries its pools in order, so a refusal seen with a launch came before it
        refusals = market.refusals
        while self._seen_refusals < len(refusals):
            refusal = refusals[self._seen_refusals]
            tracked = self._by_id.get(refusal.tags.get(TAG_JOB_ID, ""))
            label = tracked.submission.name if tracked is not None else "-"
            self.note(label, f"{REFUSED} {refusal.pool.offering} ({refusal.pool.market}): {refusal.code}", refusal.at)
            self._seen_refusals += 1
        launches = market.launches
        while self._seen_launches < len(launches):
            self._adopt(launches[self._seen_launches])
            self._seen_launches += 1
        invocations = self.runtime.lambdas.invocations
        functions = self.stack.functions
        ended: set[str] = set()
        while self._seen_invocations < len(invocations):
            invocation = invocations[self._seen_invocations]
            self._seen_invocations += 1
            if invocation.function_name == functions.get("finalize") and isinstance(invocation.event, dict):
                ended.add(str(invocation.event.get("job_id")))
            elif invocation.function_name == functions.get("dispatcher") and isinstance(invocation.result, dict):
                # the dispatcher's report: jobs it failed (invalid messages, no allowed type fits)
                ended.update(
                    str(j) for j in [*invocation.result.get("rejected", []), *invocation.result.get("failed", [])]
                )
        for job_id in sorted(ended):
            tracked = self._by_id.get(job_id)
            if tracked is not None and not tracked.done:
                self._check_done(tracked)

    def _check_done(self, tracked: TrackedJob) -> None:
        try:
            job, _ = self.store.get_job(tracked.job_id)
        except NotFoundError:
            return
        if job.state.is_terminal:
            tracked.done = True
            ended = job.ended_at or self.clock.now()
            if job.state is JobState.SUCCEEDED:
                # no cost here: its last instance is still billed until its end is reported (the cost report)
                text = f"finished: SUCCEEDED after {job.attempts} attempt(s)"
            else:
                text = f"finished: {job.state} ({job.failure_reason or 'no reason'})"
            self.note(tracked.submission.name, text, ended)

    def _adopt(self, launch: Launch) -> None:
        job_id = launch.tags.get(TAG_JOB_ID)
        tracked = self._by_id.get(job_id or "")
        if job_id is None or tracked is None:
            self.note("-", f"instance {launch.instance_id} launched for an unknown job", launch.at)
            return
        tracked.launched = True
        attempt = int(launch.tags.get(TAG_ATTEMPT, "1"))
        job, _ = self.store.get_job(job_id)
        spec = job.spec
        interruption = None
        if launch.spot_price is not None:
            t = self.market.interruption_time(launch.pool, self.market.to_hours(launch.at), launch.max_price)
            interruption = self.market.to_datetime(t) if t is not None else None
        name = tracked.submission.name
        faults = [f for f in self.scenario.faults if f.attempt == attempt and f.job in {name, tracked.submission.entry}]
        if self.chaos is not None:
            chaos_fault = self.chaos.agent_fault(
                launch.instance_id,
                job=name,
                attempt=attempt,
                launched_hours=(launch.at - self.scenario.start).total_seconds() / 3600,
                run_seconds=max(0.0, (spec.work_hours or DEFAULT_WORK_HOURS) - job.work_done_hours) * 3600,
            )
            faults += [chaos_fault] if chaos_fault is not None else []
        worker = InstanceWorker(
            host=self,
            launch=launch,
            job_id=job_id,
            job_name=name,
            attempt=attempt,
            spec=spec,
            work_hours=spec.work_hours or DEFAULT_WORK_HOURS,
            interruption_at=interruption,
            scenario_start=self.scenario.start,
            faults=faults,
        )
        self.workers[launch.instance_id] = worker
        self._workers_by_attempt[(job_id, attempt)] = worker
        price = f", ${launch.spot_price:.3f}/h" if launch.spot_price is not None else ""
        verb = "placed on" if attempt == 1 else f"relaunched (attempt {attempt}) on"
        try:
            handover_from = self.store.get_attempt(job_id, attempt).handover_from
        except NotFoundError:  # recorded a moment after the launch returns
            handover_from = None
        if handover_from is not None:
            verb = f"standby (attempt {attempt}) to take over from attempt {handover_from}, launched on"
        self.note(
            tracked.submission.name,
            f"{verb} {launch.pool.instance_type} in {launch.pool.availability_zone} ({launch.pool.market}{price})",
            launch.at,
        )
        worker.start()
        if self.chaos is not None and launch.pool.market is Market.SPOT:
            remaining_hours = max(0.0, worker.work_hours - job.work_done_hours)
            planned = self.chaos.interruption(
                launch.at,
                run_seconds=remaining_hours / worker.speed * 3600,
                checkpoint_seconds=spec.checkpoint.interval_minutes * 60,
            )
            if planned is not None:
                at, phase = planned
                self.schedule(at, f"{launch.instance_id} chaos notice", lambda: self._chaos_notice(worker, phase))

    def _chaos_notice(self, worker: InstanceWorker, phase: str) -> None:
        """A chaos interruption: the warning on EventBridge and in IMDS, as the market gives one."""
        if worker.state == "gone" or worker.notice_at is not None or self.chaos is None:
            return
        what = f"spot interruption warning while {phase} ({worker.job_name} attempt {worker.attempt})"
        self.chaos.record(ChaosKind.INTERRUPTION, worker.instance_id, what)
        self.emit("warning", worker.instance_id)
        worker.notice("chaos")

    # --- running -----------------------------------------------------------------------------------

    def _act(self, action: Callable[[], None]) -> None:
        with self.clock.exclusive():
            action()
        self.clock.wait_quiescent()
        self._observe()
        self._check_invariants()

    def _activity(self) -> tuple[int, int, int]:
        """What the system has done so far: Lambda invocations, launches, things the agents did."""
        return (
            len(self.runtime.lambdas.invocations),
            self._seen_launches,
            sum(len(w.events) for w in self.workers.values()),
        )

    def _check_invariants(self, *, final: bool = False) -> None:
        """The invariants (spotrelay.local.invariants) on what moto holds now, between two steps (every
        process blocked on the clock): after every action of the replay (a submission, an event, a
        schedule tick, an instance's boot or end), and after every wake-up of the clock at which a Lambda
        ran, an instance was launched or an agent did something. The agents' IMDS polls and heartbeats
        alone change nothing the invariants read, and checking at those wake-ups too (most of the wake-ups)
        would slow every replay and find nothing new. The last check reads through the API, as a client would."""
        self._checked_activity = self._activity()
        observed = (read if final else peek)(self.runtime, self.stack, self.invariants.cache)
        now = self.clock.now()
        for violation in self.invariants.check(
            observed,
            now,
            agents=self.workers.values(),
            finished=final and self._all_done(),
            final=final,
            submitted={t.job_id: t.submitted_at for t in self.jobs.values()},
        ):
            tracked = self._by_id.get(violation.job_id or "")
            self.note(
                tracked.submission.name if tracked else "-", f"invariant broken: {violation.kind}: {violation.detail}"
            )

    def _all_done(self) -> bool:
        return bool(self.jobs) and all(t.done for t in self.jobs.values()) and not self._pending_submissions

    def _configure_stack(self) -> None:
        settings = self.scenario.stack
        changes: dict[str, str] = {}
        if settings.max_concurrent_jobs is not None:
            changes[ENV_MAX_CONCURRENT_JOBS] = str(settings.max_concurrent_jobs)
        if settings.budget_usd_per_hour is not None:
            changes[ENV_BUDGET_USD_PER_HOUR] = f"{settings.budget_usd_per_hour:g}"
        if settings.spot_vcpu_quotas is not None:
            changes[ENV_SPOT_VCPU_QUOTAS] = json.dumps(settings.spot_vcpu_quotas, sort_keys=True)
        if settings.block_minutes is not None:
            changes[ENV_BLOCK_MINUTES] = f"{settings.block_minutes:g}"
        if settings.heartbeat_seconds is not None:
            changes[ENV_HEARTBEAT_SECONDS] = str(settings.heartbeat_seconds)
        if not changes:
            return
        client = self.runtime.client("lambda")
        for name in self.stack.functions.values():
            variables = dict(client.get_function_configuration(FunctionName=name)["Environment"]["Variables"])
            mine = {k: v for k, v in changes.items() if k in variables}
            if mine:
                client.update_function_configuration(
                    FunctionName=name, Environment={"Variables": {**variables, **mine}}
                )

    def run(self) -> ReplayResult:
        started = time.perf_counter()
        events = injections(self.scenario)  # read once: checked before the deploy, scheduled after it
        _check_jobs_named(self.scenario, events)
        # The handlers' own output (Powertools flushes EMF metrics after 100 values even when they are
        # disabled) is not the replay's: stdout is the timeline, or the JSON.
        with (
            contextlib.redirect_stdout(self.function_output),
            _offline_environment(),
            tempfile.TemporaryDirectory(prefix="spotrelay-replay-") as scratch,
            LocalRuntime(
                clock=self.clock,
                market=self.market,
                region=self.scenario.region,
                seed=self.seed,
                function_overrides={"POWERTOOLS_LOG_LEVEL": self.function_log_level}
                if self.function_log_level is not None
                else None,
            ) as runtime,
            self.logbook,
        ):
            self.runtime = runtime
            assert runtime.market is not None
            runtime.market.terminate_listeners.append(self._terminated)
            self.stack: LocalStack = runtime.deploy(self.template)
            self.store = DynamoJobStore(self.stack.table_name, runtime.dynamodb)
            self.storage = S3CheckpointStorage(runtime.s3, self.stack.bucket_name)
            self.tokens = StepFunctionsTaskTokens(runtime.sfn)
            self.checkpoint_root = Path(scratch)
            self._configure_stack()
            # The deploy draws more or fewer random ids the first time in a process (moto's lazily built
            # backends): seed again, so that job ids and instance ids depend on the scenario and seed only.
            mock_random.seed(self.seed)
            self._attach_chaos()
            self._attach_outages()
            self._load_agenda(events)
            self._loop()
            self._settle_bills()
            self.clock.wait_quiescent()
            self._check_invariants(final=True)
            result = self._report(time.perf_counter() - started)
        return result

    def _attach_chaos(self) -> None:
        """From now on (the stack deployed and configured), the chaos seed's faults, through the hooks."""
        chaos = self.chaos
        if chaos is None:
            return
        installed = patches.installed()
        assert installed is not None
        assert self.runtime.market is not None
        chaos.attach(self, self.stack.functions)
        installed.delivery_faults = chaos
        installed.store_faults = chaos
        self.runtime.lambdas.faults = chaos
        self.runtime.market.refusal_faults = chaos.refuse_launch

    def _attach_outages(self) -> None:
        """The scenario's outages of the functions and its operator steps (spotrelay.local.outages)."""
        scenario = self.scenario
        self._asynchronous: AsynchronousInvocations | None = None
        self._outages: FunctionOutages | None = None
        self._operator: list[OperatorReport] = []
        if not scenario.outages_of_functions and not scenario.operator:
            return
        installed = patches.installed()
        assert installed is not None
        roles = {name: module for module, name in self.stack.functions.items()}
        if self.chaos is not None:
            self._asynchronous = self.chaos.asynchronous()
        else:
            self._asynchronous = AsynchronousInvocations(self, label="lambda", who=lambda name: roles.get(name, name))
            installed.delivery_faults = AsynchronousDeliveries(self._asynchronous)
        self._asynchronous.dead_letter = dead_letters_to_sqs(self.runtime.sqs, self._dead_letter_queues())
        windows = [(scenario.at(o.start), scenario.at(o.end)) for o in scenario.outages_of_functions]
        self._outages = FunctionOutages(self.now, windows, otherwise=self.runtime.lambdas.faults)
        self.runtime.lambdas.faults = self._outages
        for start, end in windows:
            self.schedule(
                start, "outage", lambda: self.note("-", "control plane down: every function invocation fails")
            )
            self.schedule(end, "outage", lambda: self.note("-", "control plane back: the functions answer again"))
        for step in scenario.operator:
            self.schedule(scenario.at(step.at), "operator", lambda step=step: self._run_operator(step))  # type: ignore[misc]

    def _dead_letter_queues(self) -> dict[str, str]:
        """function name -> its DLQ's URL, from the stack's outputs (moto keeps no DeadLetterConfig)."""
        outputs = self.stack.outputs
        return {
            outputs[recovery.function_name_output(module)]: outputs[recovery.dead_letter_queue_output(module)]
            for module in recovery.DEAD_LETTERED_FUNCTIONS
            if recovery.function_name_output(module) in outputs and recovery.dead_letter_queue_output(module) in outputs
        }

    def _run_operator(self, step: OperatorStep) -> None:
        """An operator step, calling what the CLI command calls (spotrelay.aws.recovery)."""
        sqs = self.runtime.sqs
        if step.run is OperatorAction.REDRIVE_DLQ:
            # What `spotrelay admin redrive` drains: each function's DLQ (Lambda's retries given up), then the
            # rule targets' (the events EventBridge could not deliver)
            lambda_ = self.runtime.client("lambda")
            outputs = self.stack.outputs
            queues: list[tuple[str, str]] = list(self._dead_letter_queues().items())
            targets_dlq = outputs.get(EVENT_TARGET_DLQ_OUTPUT)
            if targets_dlq is not None:
                queues.append((EVENT_TARGETS, targets_dlq))
            targets = {outputs[recovery.function_name_output(f)] for f in recovery.REDRIVABLE_TARGETS}

            def redrive(function: str, queue_url: str) -> recovery.Redrive:
                if function == EVENT_TARGETS:
                    return recovery.redrive_event_targets(sqs, lambda_, queue_url=queue_url, functions=targets)
                return recovery.redrive(sqs, lambda_, queue_url=queue_url, function_name=function)

            for function, queue_url in queues:
                before = recovery.queue_depth(sqs, queue_url)
                done = redrive(function, queue_url)
                after = recovery.queue_depth(sqs, queue_url)
                detail = {"function": function, "depth_before": before, "found": done.found, "handled": done.handled}
                detail |= {"failed": done.failed, "depth_after": after}
                self._operator.append(OperatorReport(self.clock.now(), str(step.run), detail))
                self.note(
                    "operator",
                    f"spotrelay admin redrive: {done.handled} of {done.found} dead-lettered events of {function} "
                    f"handled, {done.failed} failed again; the DLQ holds {after} (held {before})",
                )
            return
        assert step.start is not None
        assert step.end is not None
        start, end = self.scenario.at(step.start), self.scenario.at(step.end)
        deliveries = len(self.runtime.deliveries)
        replayed = recovery.replay_archive(
            self.runtime.events, archive_name=recovery.archive_name(self.stack.outputs), start=start, end=end
        )
        made = self.runtime.deliveries[deliveries:]
        detail = {"name": replayed.name, "from": iso(start), "to": iso(end), "state": replayed.state}
        detail |= {"events": len({d.event_id for d in made}), "deliveries": len(made)}
        detail |= {"failed": sum(1 for d in made if d.error is not None)}
        self._operator.append(OperatorReport(self.clock.now(), str(step.run), detail))
        self.note(
            "operator",
            f"spotrelay admin replay-archive {iso(start)} to {iso(end)}: {detail['events']} archived events "
            f"delivered again ({detail['deliveries']} deliveries, {detail['failed']} failed)",
        )

    def _load_agenda(self, events: Sequence[Injection]) -> None:
        pending = submissions(self.scenario)
        self._pending_submissions = len(pending)
        for at, group in itertools.groupby(pending, key=lambda s: s.at):
            batch = list(group)

            def submit(batch: list[Submission] = batch) -> None:
                self._pending_submissions -= len(batch)
                self._submit(batch)

            self.schedule(at, "submit", submit)
        for injection in events:
            self.schedule(injection.at, "inject", lambda i=injection: self._inject(i))  # type: ignore[misc]
        self.schedule(self.scenario.start, "schedule", self._tick)

    def _loop(self) -> None:
        clock = self.clock
        while not self._all_done():
            next_action = self._agenda[0][0] if self._agenda else None
            next_wakeup = clock.next_wakeup()
            candidates = [t for t in (next_action, next_wakeup) if t is not None]
            if not candidates:
                break
            when = min(candidates)
            if when > self.horizon:
                clock.advance_to(self.horizon)
                self._observe()
                break
            clock.advance_to(when)
            self._observe()
            if self._activity() != self._checked_activity:
                self._check_invariants()
            while self._agenda and self._agenda[0][0] <= clock.now() and not self._all_done():
                _, _, _, action = heapq.heappop(self._agenda)
                self._act(action)

    def _settle_bills(self) -> None:
        """Every job has ended; the `terminated` state changes of their last instances are still on their way
        (spotrelay.local.workers sends one TERMINATED_AFTER their `shutting-down`, which settles the bill, but
        may itself be retried or redriven). Run on until the last of them
        is out, so that the report's costs are the bills settled at each instance's end
        (spotrelay.models.billing), as `spotrelay cost` shows them once the events are handled. (A replay cut
        short by its horizon reports what was known then.)"""
        ends = [when for when, _, label, _ in self._agenda if label.endswith(" terminated")]
        if not self._all_done() or not ends:
            return
        deadline = min(max(ends), self.horizon)
        clock = self.clock
        while True:
            due = [t for t in (self._agenda[0][0] if self._agenda else None, clock.next_wakeup()) if t is not None]
            if not due or min(due) > deadline:
                return
            clock.advance_to(min(due))
            self._observe()
            while self._agenda and self._agenda[0][0] <= clock.now():
                _, _, _, action = heapq.heappop(self._agenda)
                self._act(action)

    # --- report ------------------------------------------------------------------------------------

    def _dead_letters(self) -> set[str]:
        bodies: set[str] = set()
        sqs = self.runtime.sqs
        while True:
            answer = sqs.receive_message(
                QueueUrl=self.stack.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=3600, WaitTimeSeconds=0
            )
            messages = answer.get("Messages", [])
            if not messages:
                return bodies
            bodies.update(m.get("Body", "") for m in messages)

    def _report(self, wall_seconds: float) -> ReplayResult:
        now = self.clock.now()
        dlq = self._dead_letters()
        reports: list[JobReport] = []
        for tracked in self.jobs.values():
            reports.append(self._job_report(tracked, now, dlq))
        result = ReplayResult(
            scenario=self.scenario,
            seed=self.seed,
            jobs=reports,
            timeline=sorted(self._timeline, key=lambda e: (e.at, e.seq)),
            expectations=[],
            ended_at=now,
            wall_seconds=wall_seconds,
            deploy_seconds=self.stack.deploy_seconds,
            launches=self._seen_launches,
            refusals=self._seen_refusals,
            events_injected=self._events_injected,
            lambda_invocations=len(self.runtime.lambdas.invocations),
            checkpoints=sum(w.checkpoints for w in self.workers.values()),
            invariant_checks=self.invariants.checked,
            violations=list(self.invariants.violations),
            chaos=self.chaos.report() if self.chaos is not None else None,
            operator=list(self._operator),
            dead_lettered=dict(
                Counter(module for _, module, sent in self._asynchronous.given_up if sent)
                if self._asynchronous is not None
                else {}
            ),
            failed_by_outage=dict(self._outages.failed) if self._outages is not None else {},
        )
        result.expectations = [check(e, result, self._attempt_spans()) for e in self.scenario.expect]
        return result

    def _attempt_spans(self) -> list[tuple[datetime, datetime]]:
        now = self.clock.now()
        spans = []
        for tracked in self.jobs.values():
            for attempt in self._attempts(tracked.job_id):
                spans.append((attempt.started_at, attempt.ended_at or now))
        return spans

    def _attempts(self, job_id: str) -> list[Attempt]:
        if job_id not in self._attempt_cache:
            try:
                self._attempt_cache[job_id] = self.store.attempts(job_id)
            except NotFoundError:
                self._attempt_cache[job_id] = []
        return self._attempt_cache[job_id]

    def _job_report(self, tracked: TrackedJob, now: datetime, dlq: set[str]) -> JobReport:
        job: Job | None
        try:
            job, _ = self.store.get_job(tracked.job_id)
        except NotFoundError:
            job = None
        attempts = self._attempts(tracked.job_id)
        cost = sum(a.cost(now) for a in attempts)
        on_demand = on_demand_cost(attempts, now)
        return JobReport(
            name=tracked.submission.name,
            entry=tracked.submission.entry,
            job_id=tracked.job_id,
            state=str(job.state) if job is not None else "NOT_RECORDED",
            attempts=tuple(
                AttemptReport(
                    instance_type=a.pool.instance_type,
                    availability_zone=a.pool.availability_zone,
                    market=str(a.pool.market),
                    start=a.started_at,
                    end=a.ended_at,
                    outcome=str(a.outcome) if a.outcome is not None else None,
                    hourly_price=a.hourly_price,
                    agent=tuple(worker.summary())
                    if (worker := self._workers_by_attempt.get((tracked.job_id, a.attempt)))
                    else (),
                    notice_to_final_checkpoint_seconds=worker.final_checkpoint_seconds if worker else None,
                )
                for a in attempts
            ),
            cost=cost,
            on_demand_cost=on_demand,
            lost_work_hours=job.lost_work_hours if job is not None else 0.0,
            interruptions=job.interruptions if job is not None else 0,
            failure_reason=job.failure_reason if job is not None else None,
            submitted_at=tracked.submission.at,
            ended_at=job.ended_at if job is not None else None,
            in_dlq=tracked.submission.body in dlq,
        )


def replay(
    scenario: Scenario,
    *,
    seed: int | None = None,
    template: Path | None = None,
    chaos: int | None = None,
    function_log_level: str | None = None,
) -> ReplayResult:
    """Run `scenario` (deterministic for a scenario, a seed and a chaos seed; default: the scenario's seed,
    no chaos). `function_log_level` ("INFO", "DEBUG"): the functions' log lines on stdout at that level."""
    return Replay(scenario, seed=seed, template=template, chaos=chaos, function_log_level=function_log_level).run()


# ------------------------------------------------------------------------------------- expectations


def _check_jobs_named(scenario: Scenario, events: Sequence[Injection]) -> None:
    """An expectation about, or an event bound to, a job the scenario never submits is a mistake in the
    scenario (a typo in a name): say so before replaying hours of it, not in its result."""
    names = {name for s in submissions(scenario) for name in (s.name, s.entry)}
    its_jobs = f"(its jobs: {', '.join(sorted(names)) or 'none'})"
    faults = sorted({f.job for f in scenario.faults if f.job not in names})
    if faults:
        raise ScenarioError(f"scenario {scenario.name}: faults name no job it submits: {', '.join(faults)} {its_jobs}")
    unknown = sorted({e.job for e in scenario.expect if e.job is not None and e.job not in names})
    if unknown:
        raise ScenarioError(
            f"scenario {scenario.name}: expect names no job it submits: {', '.join(unknown)} {its_jobs}"
        )
    bound = sorted({(i.source, i.job) for i in events if i.job is not None and i.job not in names})
    if bound:
        listed = ", ".join(f"{source} to {job}" for source, job in bound)
        raise ScenarioError(f"scenario {scenario.name}: events bound to a job it never submits: {listed} {its_jobs}")


def _matching(expectation: Expectation, jobs: Sequence[JobReport]) -> list[JobReport]:
    if expectation.job is None:
        return []
    return [j for j in jobs if j.name == expectation.job or j.entry == expectation.job]


def _max_overlap(spans: Sequence[tuple[datetime, datetime]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def _problems(e: Expectation, job: JobReport) -> list[str]:
    problems: list[str] = []
    attempts = len(job.attempts)

    def bound(ok: bool, text: str) -> None:
        if not ok:
            problems.append(text)

    if e.state is not None:
        bound(job.state == str(e.state), f"state {job.state}, expected {e.state}")
    if e.min_attempts is not None:
        bound(attempts >= e.min_attempts, f"{attempts} attempts < {e.min_attempts}")
    if e.max_attempts is not None:
        bound(attempts <= e.max_attempts, f"{attempts} attempts > {e.max_attempts}")
    if e.min_interruptions is not None:
        bound(job.interruptions >= e.min_interruptions, f"{job.interruptions} interruptions < {e.min_interruptions}")
    if e.max_interruptions is not None:
        bound(job.interruptions <= e.max_interruptions, f"{job.interruptions} interruptions > {e.max_interruptions}")
    if e.max_cost is not None:
        bound(job.cost <= e.max_cost, f"cost ${job.cost:.4f} > ${e.max_cost:g}")
    if e.max_lost_work_hours is not None:
        bound(
            job.lost_work_hours <= e.max_lost_work_hours, f"lost {job.lost_work_hours:.3f} h > {e.max_lost_work_hours}"
        )
    last = job.attempts[-1] if job.attempts else None
    if e.last_pool is not None:
        where = f"{last.instance_type}:{last.availability_zone}" if last else "none"
        bound(where == e.last_pool, f"last pool {where}, expected {e.last_pool}")
    if e.last_market is not None:
        market = last.market if last else "none"
        bound(market == str(e.last_market), f"last market {market}, expected {e.last_market}")
    if e.reason_contains is not None:
        reason = job.failure_reason or ""
        bound(e.reason_contains in reason, f"reason {reason!r} lacks {e.reason_contains!r}")
    if e.in_dlq is not None:
        bound(job.in_dlq == e.in_dlq, f"in the DLQ: {job.in_dlq}, expected {e.in_dlq}")
    if e.max_wait is not None:
        if not job.attempts:
            problems.append("never launched")
        else:
            waited = (job.attempts[0].start - job.submitted_at).total_seconds() / 3600
            bound(waited <= e.max_wait + 1e-9, f"waited {waited:.2f} h > {e.max_wait:g} h for its first launch")
    if e.max_notice_to_checkpoint_seconds is not None:
        for number, a in enumerate(job.attempts, start=1):
            took = a.notice_to_final_checkpoint_seconds
            noticed = any(event["event"] == "notice" for event in a.agent)
            if noticed and took is None:
                problems.append(f"attempt {number}: no final checkpoint after the notice")
            elif took is not None:
                bound(
                    took <= e.max_notice_to_checkpoint_seconds,
                    f"attempt {number}: final checkpoint {took:.0f} s after the notice > "
                    f"{e.max_notice_to_checkpoint_seconds:g} s",
                )
    if e.finished_within is not None:
        if job.ended_at is None:
            problems.append("not finished")
        else:
            took = (job.ended_at - job.submitted_at).total_seconds() / 3600
            bound(took <= e.finished_within + 1e-9, f"took {took:.2f} h > {e.finished_within:g} h")
    return problems


def check(
    expectation: Expectation, result: ReplayResult, spans: Sequence[tuple[datetime, datetime]]
) -> ExpectationResult:
    problems: list[str] = []
    if expectation.max_running_instances is not None:
        most = _max_overlap(spans)
        if most > expectation.max_running_instances:
            problems.append(f"{most} instances at once > {expectation.max_running_instances}")
    if expectation.job is not None:
        jobs = _matching(expectation, result.jobs)
        if not jobs:
            problems.append(f"no job named {expectation.job}")
        for job in jobs:
            problems.extend(f"{job.name}: {p}" for p in _problems(expectation, job))
    what = expectation.model_dump(exclude_none=True)
    label = ", ".join(f"{k}={v}" for k, v in what.items())
    return ExpectationResult(expectation, not problems, label if not problems else f"{label}: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ output


def _offset(start: datetime, when: datetime) -> str:
    seconds = int((when - start).total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"+{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


def render_text(result: ReplayResult, *, timeline_limit: int = 400) -> str:
    scenario = result.scenario
    chaos = f", chaos seed {result.chaos.seed}" if result.chaos is not None else ""
    lines = [
        f"scenario {scenario.name} (seed {result.seed}{chaos}), start {iso(scenario.start)}, "
        f"{result.simulated_hours:.2f} simulated hours in {result.wall_seconds:.1f} s",
        "",
        "timeline",
    ]
    entries = result.timeline
    width = max([len(e.job) for e in entries] + [3])
    # A pool refusing a job's every retry through an outage is one line per pool with a count, until the job
    # has anything else to say; --json keeps every entry
    shown: list[list[Any]] = []  # [at, job, text, times, last at]
    refusing: dict[str, dict[str, int]] = {}  # job -> refusal text -> its shown line
    for entry in entries:
        burst = refusing.setdefault(entry.job, {})
        if not entry.text.startswith(REFUSED):
            burst.clear()
        elif entry.text in burst:
            line = shown[burst[entry.text]]
            line[3] += 1
            line[4] = entry.at
            continue
        else:
            burst[entry.text] = len(shown)
        shown.append([entry.at, entry.job, entry.text, 1, entry.at])
    for at, job, text, times, last in shown[:timeline_limit]:
        again = f"  (x{times}, the last at {_offset(scenario.start, last)})" if times > 1 else ""
        lines.append(f"  {_offset(scenario.start, at)}  {job:<{width}}  {text}{again}")
    if len(shown) > timeline_limit:
        lines.append(f"  ... {len(shown) - timeline_limit} more lines (--json for the data)")
    lines += ["", "cost report"]
    header = (
        f"  {'job':<{width}}  {'state':<10} {'att':>3}  {'cost':>9}  {'on-demand':>9}  {'savings':>14}  {'lost h':>6}"
    )
    lines.append(header)
    total_cost = total_od = total_lost = 0.0
    for job in result.jobs:
        share = f"{job.savings / job.on_demand_cost:.0%}" if job.on_demand_cost > 0 else "-"
        lines.append(
            f"  {job.name:<{width}}  {job.state:<10} {len(job.attempts):>3}  {job.cost:>9.2f}  "
            f"{job.on_demand_cost:>9.2f}  {job.savings:>8.2f} {share:>5}  {job.lost_work_hours:>6.2f}"
        )
        total_cost += job.cost
        total_od += job.on_demand_cost
        total_lost += job.lost_work_hours
    if len(result.jobs) > 1:
        share = f"{(total_od - total_cost) / total_od:.0%}" if total_od > 0 else "-"
        lines.append(
            f"  {'total':<{width}}  {'':<10} {'':>3}  {total_cost:>9.2f}  {total_od:>9.2f}  "
            f"{total_od - total_cost:>8.2f} {share:>5}  {total_lost:>6.2f}"
        )
    lines.append("  (USD; on-demand: the same instance hours at on-demand prices; lost: reference-GPU hours redone)")
    lines += ["", "expectations" + (" (not binding under chaos: only the invariants are)" if chaos else "")]
    for e in result.expectations:
        lines.append(f"  {'PASS' if e.passed else 'FAIL'}  {e.detail}")
    passed = sum(1 for e in result.expectations if e.passed)
    lines.append(f"  {passed} passed, {len(result.expectations) - passed} failed")
    if result.chaos is not None:
        lines += ["", *chaos_summary(result.chaos)]
    lines += ["", *summary(result.invariant_checks, result.violations)]
    return "\n".join(lines)


def run_scenario_file(path: str | Path, *, seed: int | None = None) -> ReplayResult:
    from spotrelay.local.scenario import load_scenario

    return replay(load_scenario(path), seed=seed)


__all__ = [
    "ExpectationResult",
    "JobReport",
    "OperatorReport",
    "Replay",
    "ReplayResult",
    "TimelineEntry",
    "check",
    "render_text",
    "replay",
    "run_scenario_file",
]
