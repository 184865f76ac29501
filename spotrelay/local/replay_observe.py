"""What a replay sees the system do (`ReplayObserver`, a part of `spotrelay.local.replay.Replay`): as it
runs, the refusals and launches of EC2 (a simulated worker started on each instance), the jobs' ends and the
chaos seed's interruptions, on the timeline; once it is over, the report (spotrelay.local.replay_report) read
from moto, with the scenario's expectations checked (spotrelay.local.replay_expectations).

Its siblings: spotrelay.local.replay_state (the state it works on), spotrelay.local.replay_inputs (what the
replay sends into the system), spotrelay.local.replay (the loop that runs them).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.control.accounting import on_demand_cost
from spotrelay.control.ports import NotFoundError
from spotrelay.local.chaos import ChaosKind
from spotrelay.local.ec2_market import Launch
from spotrelay.local.replay_expectations import check
from spotrelay.local.replay_report import REFUSED, AttemptReport, JobReport, ReplayResult
from spotrelay.local.replay_state import ReplayState, TrackedJob
from spotrelay.local.workers import InstanceWorker
from spotrelay.models import Attempt, Job, JobState, Market

DEFAULT_WORK_HOURS = 1.0  # a job that does not say how long it runs


class ReplayObserver(ReplayState):
    """What the replay sees the system do, and its report (a part of `spotrelay.local.replay.Replay`)."""

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


__all__ = ["DEFAULT_WORK_HOURS", "ReplayObserver"]
