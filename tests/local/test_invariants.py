"""The replay's invariants (spotrelay.local.invariants): the pure checker, invariant by invariant (a
snapshot that breaks it is reported, naming the job and the instance; a clean one is not), and one replay
that breaks one on purpose (a stray managed instance launched mid-replay) and fails for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotrelay.config import TAG_MANAGED
from spotrelay.local.invariants import (
    CommittedCheckpoint,
    InstanceView,
    InvariantMonitor,
    JobStart,
    Observed,
    Snapshot,
    UnreadableRecord,
    Violation,
    check_invariants,
    peek,
    read,
)
from spotrelay.local.replay import Replay, ReplayResult, render_text
from spotrelay.local.scenario import Injection, parse_scenario
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Pool, parse_job_spec

from .conftest import REPO_ROOT

T0 = datetime(2026, 11, 30, tzinfo=UTC)
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
PERIOD = timedelta(minutes=5)  # the reconcile period of these snapshots; reconcile's grace is 5 minutes more


def job(job_id: str = "train-1", state: JobState = JobState.RUNNING, **fields: Any) -> Job:
    spec = parse_job_spec({"name": job_id, "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    return Job(job_id=job_id, spec=spec, state=state, submitted_at=T0, updated_at=T0, **fields)


def attempt(number: int = 1, instance_id: str | None = "i-1", job_id: str = "train-1", **fields: Any) -> Attempt:
    fields.setdefault("started_at", T0)
    fields.setdefault("task_token", f"token-{number}")
    return Attempt(job_id=job_id, attempt=number, pool=POOL, hourly_price=0.35, instance_id=instance_id, **fields)


def instance(instance_id: str = "i-1", launched_at: datetime = T0, job_id: str | None = "train-1") -> InstanceView:
    return InstanceView(instance_id, "running", launched_at, job_id, 1 if job_id else None)


def snapshot(
    jobs: Sequence[Job] = (),
    attempts: Sequence[Attempt] = (),
    instances: Sequence[InstanceView] = (),
    *,
    now: datetime = T0 + timedelta(hours=1),
    **history: Any,
) -> Snapshot:
    by_job: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    return Snapshot(
        now=now,
        jobs={j.job_id: j for j in jobs},
        attempts=by_job,
        instances=instances,
        executions={j.job_id: "RUNNING" for j in jobs if not j.state.is_terminal},
        reconcile_period=PERIOD,
        **history,
    )


def kinds(found: Sequence[Violation]) -> list[str]:
    return [v.kind for v in found]


def test_a_running_job_on_its_instance_breaks_nothing() -> None:
    # Given a job running on one instance, its attempt live, a checkpoint resumed from as committed
    commits = [CommittedCheckpoint("train-1", 1, 3, 0.5, T0 + timedelta(minutes=40))]
    clean = snapshot(
        [job()],
        [attempt()],
        [instance()],
        commits=commits,
        starts=[JobStart("train-1", 1, T0 + timedelta(minutes=1), None)],
    )
    # Then nothing is reported
    assert check_invariants(clean) == []


# --- every job ends in one terminal state, or visibly progresses ------------------------------------


def test_a_live_job_whose_execution_ended_is_not_progressing() -> None:
    # Given a RUNNING job whose JobLifecycle execution FAILED (nothing will move it any more)
    stuck = replace(snapshot([job()], [attempt()], [instance()]), executions={"train-1": "FAILED"})
    # Then it is reported, by job
    (violation,) = check_invariants(stuck)
    assert (violation.kind, violation.job_id) == ("not-progressing", "train-1")
    assert "FAILED" in violation.detail
    # A job with no execution at all too; a QUEUED one waits for admission without one
    assert kinds(check_invariants(replace(stuck, executions={}))) == ["not-progressing"]
    assert check_invariants(snapshot([job(state=JobState.QUEUED)])) == []


def test_a_failed_job_needs_a_reason_and_a_terminal_state_is_kept() -> None:
    ended = job(state=JobState.FAILED, ended_at=T0, failure_reason="NoCapacity: no pool within the cap")
    assert check_invariants(snapshot([ended])) == []
    (no_reason,) = check_invariants(snapshot([job(state=JobState.CANCELLED, ended_at=T0)]))
    assert (no_reason.kind, no_reason.job_id) == ("no-failure-reason", "train-1")
    # Given a job seen SUCCEEDED earlier in the replay, now FAILED: it reached two terminal states
    (changed,) = check_invariants(snapshot([ended], first_terminal={"train-1": (1, JobState.SUCCEEDED)}))
    assert changed.kind == "terminal-state-changed"
    assert "SUCCEEDED" in changed.detail
    assert "FAILED" in changed.detail
    # And a job queued again after it FAILED breaks the rule, unless it is a new run of it (`spotrelay resume`)
    failed_once = {"train-1": (1, JobState.FAILED)}
    (revived,) = check_invariants(snapshot([job(state=JobState.QUEUED)], first_terminal=failed_once))
    assert revived.kind == "terminal-state-changed"
    assert check_invariants(snapshot([job(state=JobState.QUEUED, run=2)], first_terminal=failed_once)) == []


def test_at_the_end_of_a_finished_replay_every_job_is_terminal() -> None:
    running = snapshot([job()], [attempt()], [instance()])
    assert check_invariants(running) == []  # progressing, mid-replay (or at the horizon)
    (violation,) = check_invariants(replace(running, finished=True))
    assert (violation.kind, violation.job_id) == ("unfinished", "train-1")


def test_a_submitted_job_with_no_record_at_the_end_of_the_replay_was_lost() -> None:
    # Given two messages SQS accepted, one of which became a job
    submitted = {"train-1": T0, "train-2": T0 + timedelta(minutes=1)}
    mid_replay = snapshot([job()], [attempt()], [instance()], submitted=submitted)
    # Then mid-replay the other may still be on its way (the dispatcher runs on the queue's alarm) ...
    assert check_invariants(mid_replay) == []
    # ... but at the end, with or without every job ended, it was lost
    (violation,) = check_invariants(replace(mid_replay, final=True))
    assert (violation.kind, violation.job_id) == ("never-recorded", "train-2")
    assert "submitted at 2026-11-30T00:01:00Z" in violation.detail


# --- no instance runs without a live attempt, nor for an ended job ----------------------------------


def test_an_instance_left_running_after_its_attempt_ended_is_an_orphan_after_a_period_and_the_grace() -> None:
    # Given the attempt on i-1 ended at +30 min, the job placing again, i-1 still running
    ended = attempt(outcome=AttemptOutcome.LOST, ended_at=T0 + timedelta(minutes=30))
    placing = job(state=JobState.PLACING)
    within = snapshot([placing], [ended], [instance()], now=T0 + timedelta(minutes=40))
    # Then it is left alone for one reconcile period plus reconcile's grace (10 min) ...
    assert check_invariants(within) == []
    # ... and reported after that, naming the job, the instance and the attempt
    (violation,) = check_invariants(replace(within, now=T0 + timedelta(minutes=41)))
    assert (violation.kind, violation.job_id, violation.instance_id, violation.attempt) == (
        "orphan-instance",
        "train-1",
        "i-1",
        1,
    )
    assert "11 min" in violation.detail


def test_an_instance_of_an_ended_job_is_reported_even_while_its_attempt_is_left_open() -> None:
    done = job(state=JobState.SUCCEEDED, ended_at=T0 + timedelta(minutes=30))
    late = snapshot([done], [attempt()], [instance()], now=T0 + timedelta(minutes=45))
    (violation,) = check_invariants(late)
    assert (violation.kind, violation.job_id, violation.instance_id) == ("instance-of-ended-job", "train-1", "i-1")
    assert check_invariants(replace(late, now=T0 + timedelta(minutes=35))) == []  # within the period


# --- no attempt resumes from an older checkpoint than the newest committed ---------------------------


def test_an_agent_that_starts_the_job_from_an_older_checkpoint_than_committed_is_reported() -> None:
    commits = [
        CommittedCheckpoint("train-1", 1, 4, 0.8, T0 + timedelta(minutes=50)),
        CommittedCheckpoint("train-1", 1, 5, 1.0, T0 + timedelta(minutes=58)),  # the final one, at the notice
    ]
    second = attempt(2, "i-2", started_at=T0 + timedelta(minutes=57), work_done_hours_at_start=0.8)
    # Given attempt 2 restored 1-4 at +60 min, when 1-5 had been committed at +58
    stale = snapshot(
        [job()],
        [attempt(outcome=AttemptOutcome.INTERRUPTED, ended_at=T0 + timedelta(minutes=59)), second],
        [instance("i-2")],
        commits=commits,
        starts=[JobStart("train-1", 2, T0 + timedelta(minutes=60), (1, 4))],
    )
    (violation,) = check_invariants(stale)
    assert (violation.kind, violation.job_id, violation.attempt) == ("stale-resume", "train-1", 2)
    assert "1-4" in violation.detail
    assert "1-5" in violation.detail
    # Restoring 1-5 is right; so is 1-4 if 1-5 came after the restore; starting afresh when one existed is not
    assert check_invariants(replace(stale, starts=[JobStart("train-1", 2, T0 + timedelta(minutes=60), (1, 5))])) == []
    assert check_invariants(replace(stale, starts=[JobStart("train-1", 2, T0 + timedelta(minutes=55), (1, 4))])) == []
    afresh = replace(stale, starts=[JobStart("train-1", 2, T0 + timedelta(minutes=60), None)])
    assert kinds(check_invariants(afresh)) == ["stale-resume"]
    assert kinds(check_invariants(replace(stale, starts=[]))) == []


def test_an_attempt_recorded_with_less_work_than_the_checkpoint_committed_before_it_is_reported() -> None:
    commits = [CommittedCheckpoint("train-1", 1, 4, 0.8, T0 + timedelta(minutes=50))]
    first = attempt(outcome=AttemptOutcome.INTERRUPTED, ended_at=T0 + timedelta(minutes=55))
    second = attempt(2, "i-2", started_at=T0 + timedelta(minutes=56), work_done_hours_at_start=0.5)
    (violation,) = check_invariants(snapshot([job()], [first, second], [instance("i-2")], commits=commits))
    assert (violation.kind, violation.job_id, violation.instance_id, violation.attempt) == (
        "stale-start-record",
        "train-1",
        "i-2",
        2,
    )
    fixed = second.model_copy(update={"work_done_hours_at_start": 0.8})
    assert check_invariants(snapshot([job()], [first, fixed], [instance("i-2")], commits=commits)) == []


# --- nothing runs twice at once for one job ---------------------------------------------------------


def test_two_live_attempts_of_one_job_are_reported_but_a_standby_is_not() -> None:
    both = [attempt(), attempt(2, "i-2")]
    (violation,) = check_invariants(snapshot([job()], both, [instance(), instance("i-2")]))
    assert (violation.kind, violation.job_id, violation.instance_id, violation.attempt) == (
        "runs-twice",
        "train-1",
        "i-2",
        2,
    )
    assert "i-1" in violation.detail
    # A standby launched ahead of a make-before-break handover (no Run task yet) runs beside attempt 1
    standby = attempt(2, "i-2", handover_from=1, task_token=None)
    assert check_invariants(snapshot([job()], [attempt(), standby], [instance(), instance("i-2")])) == []


# --- every record reads back ------------------------------------------------------------------------


def test_a_record_that_does_not_read_back_is_reported() -> None:
    unreadable = UnreadableRecord("JOB#train-1", "ATTEMPT#00002", "does not read as Attempt: ...")
    (violation,) = check_invariants(snapshot([job()], [attempt()], [instance()], unreadable=[unreadable]))
    assert (violation.kind, violation.job_id) == ("unreadable-record", "train-1")
    assert "ATTEMPT#00002" in violation.detail
    # Two unreadable records of one job are two violations for the monitor, each reported once
    monitor = InvariantMonitor()
    other = UnreadableRecord("JOB#train-1", "JOB", "does not read as Job: ...")
    twice = replace(observed([job()], [attempt()], [instance()]), unreadable=[unreadable, other])
    assert kinds(monitor.check(twice, T0)) == ["unreadable-record", "unreadable-record"]
    assert monitor.check(twice, T0 + timedelta(minutes=1)) == []


def test_the_monitor_reads_a_record_it_cannot_parse_as_unreadable() -> None:
    monitor = InvariantMonitor()
    parsed = monitor.cache.parse("JOB#train-1", "ATTEMPT#00001", '{"job_id": "train-1", "attempt": 0}')
    assert isinstance(parsed, UnreadableRecord)
    assert "Attempt" in parsed.error
    assert monitor.cache.parse("INSTANCE#i-1", "INSTANCE", None) is None  # not a record of a model


# --- every instance-second is billed to exactly one attempt -----------------------------------------


def test_a_managed_instance_named_by_no_attempt_is_unattributed_at_once() -> None:
    soon = T0 + timedelta(minutes=1)
    (violation,) = check_invariants(
        snapshot([job()], [attempt()], [instance(), instance("i-stray", job_id=None)], now=soon)
    )
    assert (violation.kind, violation.job_id, violation.instance_id) == ("unattributed-instance", None, "i-stray")
    # Left running past the period and the grace, it is an orphan too
    late = snapshot(
        [job()], [attempt()], [instance(), instance("i-stray", job_id=None)], now=T0 + timedelta(minutes=11)
    )
    assert kinds(check_invariants(late)) == ["unattributed-instance", "orphan-instance"]


def test_an_instance_tagged_for_a_live_job_is_being_recorded_for_the_launch_grace_then_unattributed() -> None:
    # Given the instance of a Launch whose attempt write failed (throttled), to be retried: its tags name the job
    launched = InstanceView("i-2", "running", T0, "train-1", 2)
    early = snapshot([job()], [attempt()], [instance(), launched], now=T0 + timedelta(minutes=1))
    assert check_invariants(early) == []
    # Never recorded past reconcile's grace, it is billed to no job
    late = replace(early, now=T0 + timedelta(minutes=6))
    assert kinds(check_invariants(late)) == ["unattributed-instance"]
    # And an instance tagged for an ended job has no grace
    ended = snapshot([job(state=JobState.CANCELLED, failure_reason="cancelled")], [], [launched], now=T0)
    assert "unattributed-instance" in kinds(check_invariants(ended))


def test_an_instance_named_by_two_attempts_is_billed_twice() -> None:
    first = attempt(outcome=AttemptOutcome.LOST, ended_at=T0 + timedelta(minutes=5))
    (violation,) = check_invariants(snapshot([job()], [first, attempt(2, "i-1")], [instance()]))
    assert (violation.kind, violation.job_id, violation.instance_id) == ("billed-twice", "train-1", "i-1")


# --- the monitor: history, and each violation once --------------------------------------------------


def observed(jobs: Sequence[Job], attempts: Sequence[Attempt], instances: Sequence[InstanceView]) -> Observed:
    by_job: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    return Observed(
        jobs={j.job_id: j for j in jobs},
        attempts=by_job,
        pointers={},
        instances=instances,
        executions={j.job_id: "RUNNING" for j in jobs},
    )


def test_the_monitor_reports_each_violation_once_and_remembers_terminal_states() -> None:
    monitor = InvariantMonitor(reconcile_period=PERIOD)
    stray = [instance(), instance("i-stray", job_id=None)]
    assert kinds(monitor.check(observed([job()], [attempt()], stray), T0)) == ["unattributed-instance"]
    assert monitor.check(observed([job()], [attempt()], stray), T0 + timedelta(minutes=1)) == []
    succeeded = job(state=JobState.SUCCEEDED, ended_at=T0 + timedelta(minutes=2))
    monitor.check(observed([succeeded], [attempt(outcome=AttemptOutcome.SUCCEEDED)], []), T0 + timedelta(minutes=2))
    failed = job(state=JobState.FAILED, failure_reason="?", ended_at=T0)
    assert kinds(monitor.check(observed([failed], [], []), T0 + timedelta(minutes=3))) == ["terminal-state-changed"]
    assert monitor.checked == 4
    assert [v.kind for v in monitor.violations] == ["unattributed-instance", "terminal-state-changed"]


# --- a replay that breaks one -----------------------------------------------------------------------


SCENARIO = {
    "name": "stray-instance",
    "region": "us-east-1",
    "start": "2026-11-30T00:00:00Z",
    "seed": 7,
    "market": {
        "prices": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "spot_price_usd_per_hour": 0.35}]
    },
    "jobs": [{"at": "0m", "spec": {"file": "../jobs/resnet50.yaml"}, "work_hours": 0.5}],
    "expect": [{"job": "resnet50", "state": "SUCCEEDED"}],
}
STRAY_AT = timedelta(minutes=10)


class StrayInstanceReplay(Replay):
    """The scenario, plus a managed instance nobody records, launched at +10 min through the runtime's EC2
    client (as a second scheduler sharing the account's tags would); also compares `peek` with `read`."""

    stray: str | None = None
    result: ReplayResult | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compared: list[tuple[int, bool]] = []  # (managed instances running, `peek` == `read`)

    def _load_agenda(self, events: Sequence[Injection]) -> None:
        super()._load_agenda(events)
        self.schedule(self.scenario.start + STRAY_AT, "stray", self._launch_stray)

    def _launch_stray(self) -> None:
        answer = self.runtime.ec2.run_instances(
            LaunchTemplate={"LaunchTemplateId": self.stack.launch_template_id},
            InstanceType="g6.xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_MANAGED, "Value": "true"}]}],
        )
        self.stray = answer["Instances"][0]["InstanceId"]

    def _check_invariants(self, *, final: bool = False) -> None:
        if final or (self.stray is not None and not self.compared):  # the stray's step, and the end
            through_api = read(self.runtime, self.stack)
            assert through_api.jobs
            assert through_api.attempts
            self.compared.append((len(through_api.instances), through_api == peek(self.runtime, self.stack)))
        super()._check_invariants(final=final)


@pytest.fixture(scope="module")
def stray_replay(synthesized_template: Path) -> StrayInstanceReplay:
    scenario = parse_scenario(SCENARIO, REPO_ROOT / "events" / "scenarios", "stray-instance")
    run = StrayInstanceReplay(scenario, template=synthesized_template)
    run.result = run.run()
    return run


def test_a_stray_managed_instance_mid_replay_is_caught_and_fails_the_replay(stray_replay: StrayInstanceReplay) -> None:
    result, stray = stray_replay.result, stray_replay.stray
    assert result is not None
    assert stray is not None
    # The job itself went well: its expectation passes ...
    assert all(e.passed for e in result.expectations)
    # ... but the stray's hours are billed to no attempt: the replay fails, naming the instance
    assert not result.passed
    assert {(v.kind, v.instance_id) for v in result.violations} == {("unattributed-instance", stray)}
    (violation,) = result.violations
    assert violation.at == result.scenario.start + STRAY_AT  # seen at the step that launched it
    report = result.to_json()["invariants"]
    assert report["checked"] > 10
    assert report["violations"] == [violation.to_json()]
    assert f"invariants: {report['checked']} checks, 1 violation" in render_text(result)
    assert any("invariant broken: unattributed-instance" in e.text for e in result.timeline)


def test_reading_moto_directly_reads_what_the_api_answers(stray_replay: StrayInstanceReplay) -> None:
    # With the job's instance and the stray running, and at the end (both terminated)
    assert stray_replay.compared == [(2, True), (0, True)]


def test_a_violation_names_its_tags_job_when_no_attempt_does() -> None:
    tagged = InstanceView("i-9", "running", T0, "train-1", 3)
    # past the launch grace (before it, the job's Launch may still record it)
    (violation,) = check_invariants(snapshot([job()], [attempt()], [instance(), tagged], now=T0 + timedelta(minutes=6)))
    assert (violation.kind, violation.job_id, violation.instance_id) == ("unattributed-instance", "train-1", "i-9")
