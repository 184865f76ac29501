"""One queued job's admission error (its record kept changing under the write, or does not read back) is
that job's alone: the dispatcher reports it and admits, fails or notes the others in the same run, in
priority order and within the same room."""

from __future__ import annotations

import json
from typing import Any

import pytest
from control_builders import World, limits, make_job, spec_dict
from fakes import FakeJobStore
from pydantic import ValidationError

from spotrelay.control.admission import AdmissionLimits
from spotrelay.control.ports import ConflictError, UnreadableRecordError
from spotrelay.models import Job, JobState


def send(world: World, **spec_fields: Any) -> str:
    return world.queue.send(json.dumps(spec_dict(**spec_fields))).message_id


def unreadable(job_id: str) -> UnreadableRecordError:
    """What the store raises reading a job record spoilt since the listing (a hand edit, another version)."""
    record = make_job(job_id).model_dump_json().replace('"state":"QUEUED"', '"state":"EXPLODED"')
    try:
        Job.model_validate_json(record)
    except ValidationError as e:
        return UnreadableRecordError.of(f"job {job_id}", e)
    raise AssertionError("the spoilt record reads")


class TroubledStore(FakeJobStore):
    """A store where some jobs' records do not read back (`spoilt`, since they were listed), and every write
    of one job loses its race (`raced`: another writer always in between)."""

    def __init__(self, raced: str | None = None) -> None:
        super().__init__()
        self.spoilt: set[str] = set()
        self.raced = raced

    def get_job(self, job_id: str) -> tuple[Job, int]:
        if job_id in self.spoilt:
            raise unreadable(job_id)
        return super().get_job(job_id)

    def put_job(self, job: Job, expected_version: int) -> int:
        if job.job_id == self.raced:
            raise ConflictError(f"job {job.job_id} is no longer at version {expected_version}")
        return super().put_job(job, expected_version)


def recorded(world: World, *specs: dict[str, Any]) -> None:
    """The jobs sent and recorded QUEUED by a dispatcher run with no room."""
    for fields in specs:
        send(world, **fields)
    world.dispatch(limits(max_concurrent_jobs=0))


def test_a_job_whose_record_does_not_read_back_is_reported_and_the_others_are_admitted() -> None:
    # Given three queued jobs with room for all, the first one's record unreadable when admission reads it
    store = TroubledStore()
    world = World(store=store)
    recorded(world, {"name": "first"}, {"name": "second"}, {"name": "third"})
    store.spoilt.add("first-msg1")

    # When the dispatcher runs
    report = world.dispatch()

    # Then the other two are admitted and PLACING, and the first is reported, still QUEUED
    assert report.admitted == ["second-msg2", "third-msg3"]
    assert list(report.admission_errors) == ["first-msg1"]
    assert report.admission_errors["first-msg1"].startswith(
        "UnreadableRecordError: job first-msg1 does not read back (state: Input should be 'QUEUED', "
    )
    assert report.errors == {}
    assert [world.job(j).state for j in ("second-msg2", "third-msg3")] == [JobState.PLACING, JobState.PLACING]

    # And once its record reads again, the next run admits it (its execution, started already, is the same one)
    store.spoilt.clear()
    assert world.job("first-msg1").state is JobState.QUEUED
    again = world.dispatch()
    assert (again.admitted, again.admission_errors) == (["first-msg1"], {})
    assert world.job("first-msg1").state is JobState.PLACING
    assert sorted(world.workflow.executions) == ["first-msg1", "second-msg2", "third-msg3"]


def test_a_job_whose_writes_keep_losing_is_reported_and_its_room_is_not_given_to_a_lower_priority_job() -> None:
    # Given room for two jobs, an urgent job whose every write loses its race, a normal one, and a low one
    world = World(store=TroubledStore(raced="urgent-msg2"))
    send(world, name="normal")
    send(world, name="urgent", priority="high")
    send(world, name="later", priority="low")

    # When the dispatcher runs
    report = world.dispatch(limits(max_concurrent_jobs=2))

    # Then the normal job is admitted, the urgent one reported, and the low one still held: the room the plan
    # gave the urgent job stays taken this run (its execution has started), as the limits say
    assert report.admitted == ["normal-msg1"]
    assert report.admission_errors == {"urgent-msg2": "ConflictError: job urgent-msg2 is no longer at version 1"}
    assert report.held == {"later-msg3": "max_concurrent_jobs 2 reached"}
    assert world.job("normal-msg1").state is JobState.PLACING
    assert world.job("later-msg3").state is JobState.QUEUED
    assert sorted(world.workflow.executions) == ["normal-msg1", "urgent-msg2"]


@pytest.mark.parametrize(
    ("other", "admission"),
    [
        pytest.param(
            {"name": "other", "resources": {"gpus": 1, "gpu_models": ["H100"]}},
            limits(allowed_families=("g6",)),
            id="to-fail-as-unschedulable",
        ),
        pytest.param({"name": "other", "priority": "low"}, limits(max_concurrent_jobs=1), id="to-note-as-held"),
    ],
)
def test_a_job_to_fail_or_hold_whose_record_does_not_read_back_does_not_stop_the_others(
    other: dict[str, Any], admission: AdmissionLimits
) -> None:
    # Given a job to admit, and one to fail as unschedulable or to hold, whose record does not read back
    store = TroubledStore()
    world = World(store=store)
    recorded(world, {"name": "small", "priority": "high"}, other)
    store.spoilt.add("other-msg2")

    # When the dispatcher runs
    report = world.dispatch(admission)

    # Then the first job is admitted all the same, and the other is reported and left as it was
    assert report.admitted == ["small-msg1"]
    assert report.failed == []
    assert list(report.admission_errors) == ["other-msg2"]
    assert report.admission_errors["other-msg2"].startswith("UnreadableRecordError: job other-msg2 does not read back")
    store.spoilt.clear()
    assert world.job("other-msg2").state is JobState.QUEUED
