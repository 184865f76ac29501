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

The replay's modules, one concern each:
- spotrelay.local.replay (this one): `replay()`, and the `Replay` class and its loop (deploy, run the agenda
  and the clock's wake-ups, check the invariants, settle the bills); every public name of its siblings is
  importable from here too;
- spotrelay.local.replay_state: what a replay holds, and the host its workers talk to (`ReplayState`);
- spotrelay.local.replay_inputs: what it sends into the system (the jobs' messages, the alarm, the schedule,
  recorded events, the outages of the functions, the operator's steps);
- spotrelay.local.replay_observe: what it sees the system do (refusals, launches, the jobs' ends), and the
  report it reads from moto at the end;
- spotrelay.local.replay_report: the report's models (`ReplayResult`: what `replay --json` prints);
- spotrelay.local.replay_expectations: a scenario's `expect:` entries checked against the report;
- spotrelay.local.replay_render: the report as text (timeline, cost report, expectations, chaos, invariants).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from moto.moto_api._internal import mock_random

from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.config import (
    ENV_BLOCK_MINUTES,
    ENV_BUDGET_USD_PER_HOUR,
    ENV_HEARTBEAT_SECONDS,
    ENV_MAX_CONCURRENT_JOBS,
    ENV_SPOT_VCPU_QUOTAS,
)
from spotrelay.local import patches
from spotrelay.local.deploy import LocalStack
from spotrelay.local.invariants import peek, read
from spotrelay.local.replay_expectations import _check_jobs_named, check
from spotrelay.local.replay_inputs import ALARM_PERIOD, EVENT_TARGETS, ReplayInputs
from spotrelay.local.replay_observe import DEFAULT_WORK_HOURS, ReplayObserver
from spotrelay.local.replay_render import render_text
from spotrelay.local.replay_report import (
    REFUSED,
    AttemptReport,
    ExpectationResult,
    JobReport,
    OperatorReport,
    ReplayResult,
    TimelineEntry,
)
from spotrelay.local.replay_state import STALL_SECONDS, TrackedJob, _offline_environment
from spotrelay.local.runtime import LocalRuntime
from spotrelay.local.scenario import Injection, Scenario, Submission, injections, submissions


class Replay(ReplayInputs, ReplayObserver):
    """One replay of one scenario (use `replay()`): its state and the workers' host (ReplayState), what it
    sends into the system (ReplayInputs), what it sees of it (ReplayObserver), and here, the loop."""

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


def run_scenario_file(path: str | Path, *, seed: int | None = None) -> ReplayResult:
    from spotrelay.local.scenario import load_scenario

    return replay(load_scenario(path), seed=seed)


__all__ = [
    "ALARM_PERIOD",
    "DEFAULT_WORK_HOURS",
    "EVENT_TARGETS",
    "REFUSED",
    "STALL_SECONDS",
    "AttemptReport",
    "ExpectationResult",
    "JobReport",
    "OperatorReport",
    "Replay",
    "ReplayResult",
    "TimelineEntry",
    "TrackedJob",
    "check",
    "render_text",
    "replay",
    "run_scenario_file",
]
