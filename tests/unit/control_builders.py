"""Builders shared by the control-plane tests: job specs, jobs, recorded EC2 events, and a `World` of fakes
with one method per control-plane entry point (dispatch, place, launch, recover, finalize, ...).

The world's market: three spot pools of L4 types (same GPU, same speed), so "best first" is simply
"cheapest first", plus pools the deployment must never use (a zone without a subnet, a family that is
not allowed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fakes import FakeClock, FakeCompute, FakeJobStore, FakeQueue, FakeWakeup, FakeWorkflow

from spotrelay.control.admission import AdmissionLimits
from spotrelay.control.cancel import CancelResult, cancel_job
from spotrelay.control.decisions import StepResult
from spotrelay.control.dispatcher import DispatchReport, dispatch
from spotrelay.control.ec2_events import Ec2Event, EventOutcome, handle_ec2_event
from spotrelay.control.lifecycle import (
    JobSummary,
    PlacementContext,
    finalize_step,
    launch_step,
    place_step,
    recover_step,
)
from spotrelay.control.ports import CheckpointPointer
from spotrelay.control.reconcile import ReconcileReport, reconcile
from spotrelay.control.resume import ResumeResult, resume_job
from spotrelay.models import Attempt, Job, JobSpec, JobState, Pool, parse_job_spec

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)  # FakeClock's start
HEARTBEAT_SECONDS = 300
BLOCK_MINUTES = 60  # the ec2-events function's block for an interrupted pool

ZONE_A, ZONE_B, ZONE_WITHOUT_SUBNET = "us-east-1a", "us-east-1b", "us-east-1c"
CHEAPEST = Pool(instance_type="g6.xlarge", availability_zone=ZONE_B)
SECOND = Pool(instance_type="g6.xlarge", availability_zone=ZONE_A)
THIRD = Pool(instance_type="g6.2xlarge", availability_zone=ZONE_A)
PRICES: dict[Pool, float] = {CHEAPEST: 0.35, SECOND: 0.40, THIRD: 0.45}
# Cheaper still, and never to be used: no subnet in that zone / a family the deployment does not allow.
NO_SUBNET = Pool(instance_type="g6.xlarge", availability_zone=ZONE_WITHOUT_SUBNET)
NOT_ALLOWED = Pool(instance_type="g4dn.xlarge", availability_zone=ZONE_A)
FORBIDDEN_PRICES: dict[Pool, float] = {NO_SUBNET: 0.05, NOT_ALLOWED: 0.05}

CONTEXT = PlacementContext(
    subnets={ZONE_A: "subnet-aaaa", ZONE_B: "subnet-bbbb"},
    allowed_families=("g5", "g6", "g6e", "p4d", "p5"),
)


def spec_dict(**fields: Any) -> dict[str, Any]:
    """A 1-GPU job spec as a user would send it, every other field at its default unless given."""
    data: dict[str, Any] = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}
    data.update(fields)
    return data


def job_spec(**fields: Any) -> JobSpec:
    return parse_job_spec(spec_dict(**fields))


def make_job(
    job_id: str = "train-1",
    *,
    state: JobState = JobState.QUEUED,
    submitted_at: datetime = T0,
    **spec_fields: Any,
) -> Job:
    spec_fields.setdefault("name", job_id)
    return Job(
        job_id=job_id, spec=job_spec(**spec_fields), state=state, submitted_at=submitted_at, updated_at=submitted_at
    )


def limits(
    *,
    max_concurrent_jobs: int = 100,
    budget_usd_per_hour: float = 1000.0,
    spot_vcpu_quotas: dict[str, int] | None = None,
    allowed_families: tuple[str, ...] = CONTEXT.allowed_families,
) -> AdmissionLimits:
    """Admission limits that admit everything unless a test tightens one of them."""
    return AdmissionLimits(
        max_concurrent_jobs=max_concurrent_jobs,
        budget_usd_per_hour=budget_usd_per_hour,
        spot_vcpu_quotas={"g": 10_000, "p": 10_000} if spot_vcpu_quotas is None else spot_vcpu_quotas,
        allowed_families=allowed_families,
    )


def recorded_event(
    events_dir: Path, name: str, *, instance_id: str | None = None, at: datetime | None = None
) -> Ec2Event:
    """A recorded EventBridge event, parsed as the ec2-events function does, its `detail.instance-id`
    bound to `instance_id` (the recorded id is a placeholder) and its time moved to `at` if given."""
    raw = json.loads((events_dir / "recorded" / name).read_text())
    detail = dict(raw["detail"])
    if instance_id is not None:
        detail["instance-id"] = instance_id
    return Ec2Event(
        id=raw["id"],
        source=raw["source"],
        detail_type=raw["detail-type"],
        time=at if at is not None else datetime.fromisoformat(raw["time"]),
        detail=detail,
    )


def error(name: str, **cause: Any) -> dict[str, Any]:
    """What the state machine hands Recover in `$.error` when the Run task failed with `name`."""
    return {"Error": name, "Cause": json.dumps(cause)}


@dataclass
class World:
    """The fakes of every port, and the control plane's entry points wired to them."""

    store: FakeJobStore = field(default_factory=FakeJobStore)
    compute: FakeCompute = field(
        default_factory=lambda: FakeCompute(
            {(p.instance_type, p.availability_zone): usd for p, usd in (PRICES | FORBIDDEN_PRICES).items()}
        )
    )
    workflow: FakeWorkflow = field(default_factory=FakeWorkflow)
    queue: FakeQueue = field(default_factory=FakeQueue)
    wakeup: FakeWakeup = field(default_factory=FakeWakeup)
    clock: FakeClock = field(default_factory=FakeClock)

    # --- reading what a user would see ---------------------------------------------------------------

    def job(self, job_id: str = "train-1") -> Job:
        return self.store.get_job(job_id)[0]

    def attempt(self, job_id: str = "train-1", number: int = 1) -> Attempt:
        return self.store.get_attempt(job_id, number)

    def blocked(self) -> dict[Pool, datetime]:
        """Pools blocked now -> until when."""
        return {b.pool: b.until for b in self.store.blocked_pools(self.clock.now())}

    def fail_results(self, token: str) -> list[str]:
        """The errors the Run task waiting on `token` was failed with."""
        return [r.error for r in self.workflow.task_results if r.task_token == token and r.error is not None]

    # --- entry points -----------------------------------------------------------------------------------

    def dispatch(self, admission: AdmissionLimits | None = None) -> DispatchReport:
        return dispatch(
            store=self.store,
            queue=self.queue,
            workflow=self.workflow,
            clock=self.clock,
            limits=admission or limits(),
            heartbeat_seconds=HEARTBEAT_SECONDS,
            compute=self.compute,
        )

    def place(self, job_id: str = "train-1") -> StepResult:
        return place_step(job_id, store=self.store, compute=self.compute, clock=self.clock, context=CONTEXT)

    def launch(
        self, job_id: str = "train-1", token: str = "token-1", heartbeat_timeout_seconds: int | None = None
    ) -> dict[str, Any]:
        return launch_step(
            job_id,
            token,
            store=self.store,
            compute=self.compute,
            clock=self.clock,
            context=CONTEXT,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )

    def recover(self, job_id: str = "train-1", failure: dict[str, Any] | None = None) -> StepResult:
        return recover_step(
            job_id, failure or error("SpotInterrupted"), store=self.store, compute=self.compute, clock=self.clock
        )

    def finalize(self, job_id: str = "train-1", outcome: str = "SUCCEEDED", **final: Any) -> JobSummary:
        return finalize_step(
            job_id,
            {"outcome": outcome, **final},
            store=self.store,
            compute=self.compute,
            clock=self.clock,
            wakeup=self.wakeup,
        )

    def cancel(self, job_id: str = "train-1") -> CancelResult:
        return cancel_job(
            job_id, store=self.store, compute=self.compute, workflow=self.workflow, clock=self.clock, wakeup=self.wakeup
        )

    def resume(self, job_id: str = "train-1") -> ResumeResult:
        return resume_job(job_id, store=self.store, workflow=self.workflow, clock=self.clock, wakeup=self.wakeup)

    def reconcile(self) -> ReconcileReport:
        return reconcile(
            store=self.store,
            compute=self.compute,
            workflow=self.workflow,
            clock=self.clock,
            heartbeat_seconds=HEARTBEAT_SECONDS,
            placement=CONTEXT,
        )

    def handle(self, event: Ec2Event) -> EventOutcome:
        return handle_ec2_event(
            event, store=self.store, workflow=self.workflow, compute=self.compute, block_minutes=BLOCK_MINUTES
        )

    # --- getting a job somewhere -------------------------------------------------------------------------

    def admitted(self, job_id: str = "train-1", **spec_fields: Any) -> Job:
        """A job the dispatcher admitted: PLACING, with its JobLifecycle execution running."""
        job = make_job(job_id, state=JobState.PLACING, submitted_at=self.clock.now(), **spec_fields)
        assert self.store.create_job(job)
        self.workflow.start(job_id, {"job_id": job_id, "heartbeat_seconds": HEARTBEAT_SECONDS})
        return job

    def relaunched(self, job_id: str = "train-1", token: str = "token-2") -> Attempt:
        """Place and Launch again; the new Run task waits on `token`. Returns the new attempt."""
        assert self.place(job_id).action == "launch"
        launched = self.launch(job_id, token)
        self.workflow.open_task(token)
        return self.attempt(job_id, int(launched["attempt"]))

    def launched(self, job_id: str = "train-1", token: str = "token-1", **spec_fields: Any) -> Attempt:
        """An admitted job, placed and launched; its Run task waits on `token`. Returns attempt 1."""
        self.admitted(job_id, **spec_fields)
        return self.relaunched(job_id, token)

    def mark_running(self, job_id: str = "train-1", number: int = 1) -> Attempt:
        """What the `running` state-change event records: the instance runs, the job is RUNNING."""
        attempt = self.attempt(job_id, number).model_copy(update={"running_at": self.clock.now()})
        self.store.put_attempt(attempt)
        job, version = self.store.get_job(job_id)
        self.store.put_job(job.model_copy(update={"state": JobState.RUNNING}), version)
        return attempt

    def running(self, job_id: str = "train-1", token: str = "token-1", **spec_fields: Any) -> Attempt:
        """A job whose attempt 1 is running on its instance (launched and running at the clock's now)."""
        self.launched(job_id, token, **spec_fields)
        return self.mark_running(job_id)

    def warned(self, job_id: str = "train-1", number: int = 1) -> Attempt:
        """What the interruption warning records on the attempt (ec2_events)."""
        attempt = self.attempt(job_id, number).model_copy(update={"interrupted_at": self.clock.now()})
        self.store.put_attempt(attempt)
        return attempt

    def checkpoint(
        self, job_id: str = "train-1", *, attempt: int = 1, seq: int = 0, work_done_hours: float, final: bool = False
    ) -> None:
        """The agent committed a checkpoint of `work_done_hours` reference-GPU hours (`final`: at the notice)."""
        assert self.store.advance_checkpoint(
            CheckpointPointer(
                job_id=job_id,
                attempt=attempt,
                seq=seq,
                manifest_key=f"jobs/{job_id}/checkpoints/{attempt}-{seq}/manifest.json",
                work_done_hours=work_done_hours,
                committed_at=self.clock.now(),
                final=final,
            )
        )

    def advance(self, **delta: float) -> datetime:
        return self.clock.advance(timedelta(**delta))
