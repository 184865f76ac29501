"""Records written by a newer version read here: a field this version does not know is kept, carried
through a read-modify-write, and never makes the record unreadable (spotrelay.models.records)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from control_builders import job_spec, spec_dict
from pydantic import ValidationError

from spotrelay.models import Attempt, Job, JobSpecError, JobState, Pool, parse_job_spec
from spotrelay.models.records import CheckpointManifest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def newer(record: str, **fields: object) -> str:
    """`record` as a newer version writes it: with fields this one does not declare."""
    return json.dumps({**json.loads(record), **fields})


def test_a_job_record_with_a_field_this_version_does_not_know_reads_and_keeps_it_through_an_update() -> None:
    # Given a job record a newer version wrote, with a top-level field and one in its pool plan
    job = Job(job_id="train-1", spec=job_spec(), submitted_at=NOW, updated_at=NOW)
    stored = newer(job.model_dump_json(), priority_boost=3)
    # When this version reads it and changes it, as update_job does
    read = Job.model_validate_json(stored)
    read.state = JobState.PLACING
    written = json.loads(read.model_dump_json())
    # Then the change is made and the newer field is written back as it was
    assert written["state"] == "PLACING"
    assert written["priority_boost"] == 3


def test_an_attempt_record_with_unknown_fields_reads_and_its_pool_stays_equal_to_itself() -> None:
    pool = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
    attempt = Attempt(job_id="train-1", attempt=1, pool=pool, hourly_price=0.35, started_at=NOW)
    record = json.loads(attempt.model_dump_json())
    record["gpu_temperature_c"] = 71.5
    record["pool"]["capacity_reservation_id"] = "cr-0123"
    read = Attempt.model_validate_json(json.dumps(record))
    # the attempt keeps the newer field; the pool, a value compared and hashed (blocked pools), leaves it out
    assert json.loads(read.model_dump_json())["gpu_temperature_c"] == 71.5
    assert read.pool == pool
    assert read.pool in {pool}


def test_a_job_whose_spec_has_a_field_a_newer_version_added_reads_and_keeps_it() -> None:
    # Given a stored job whose spec (and a nested part of it) carries fields this version does not know
    job = Job(job_id="train-1", spec=job_spec(), submitted_at=NOW, updated_at=NOW)
    record = json.loads(job.model_dump_json())
    record["spec"]["preemption_policy"] = "checkpoint-first"
    record["spec"]["limits"]["max_gpu_hours"] = 40
    # When this version reads it and writes it back
    read = Job.model_validate_json(json.dumps(record))
    written = json.loads(read.model_dump_json())
    # Then it read (no quarantine, no lost job) and the newer fields are still there
    assert (written["spec"]["preemption_policy"], written["spec"]["limits"]["max_gpu_hours"]) == (
        "checkpoint-first",
        40,
    )


def test_a_spec_being_submitted_with_an_unknown_key_is_still_refused_naming_it() -> None:
    unknown = r"limits\.max_gpu_hours: unknown key \(did you mean max_wait_hours\?\); allowed keys here: "
    with pytest.raises(JobSpecError, match=unknown):
        parse_job_spec({**spec_dict(), "limits": {"max_gpu_hours": 40}})


def test_a_checkpoint_manifest_with_a_field_this_version_does_not_know_is_refused_naming_it() -> None:
    # A manifest says how to read the bytes: a newer agent's field (a compression, say) must not be guessed at
    manifest = {"job_id": "train-1", "attempt": 1, "seq": 3, "created_at": NOW.isoformat(), "files": []}
    CheckpointManifest.model_validate(manifest)
    with pytest.raises(ValidationError, match="compression"):
        CheckpointManifest.model_validate({**manifest, "compression": "zstd"})


def test_a_known_field_holding_what_it_cannot_hold_is_still_an_error_naming_it() -> None:
    job = Job(job_id="train-1", spec=job_spec(), submitted_at=NOW, updated_at=NOW)
    with pytest.raises(ValidationError, match="state"):
        Job.model_validate_json(newer(job.model_dump_json(), state="HIBERNATING"))
