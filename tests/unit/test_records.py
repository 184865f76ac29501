"""What the scheduler records: pool keys, attempt cost, remaining work, and checkpoint manifests that
cannot point outside the checkpoint directory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from spotrelay.models import (
    Attempt,
    CheckpointFile,
    CheckpointManifest,
    Job,
    Market,
    Pool,
    load_job_spec,
    parse_job_spec,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
SHA = "a" * 64
G6 = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")


def manifest(files: list[dict[str, Any]], attempt: int = 1, seq: int = 0) -> CheckpointManifest:
    return CheckpointManifest.model_validate(
        {"job_id": "job-1", "attempt": attempt, "seq": seq, "created_at": T0, "files": files}
    )


# --- Pool -------------------------------------------------------------------------------------------


def test_pool_offering_is_type_colon_zone_whatever_the_market() -> None:
    # Given the same type and zone on the spot and on-demand markets
    on_demand = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND)

    # When their offering keys are taken
    # Then both are the `--blocked` key TYPE:AZ
    assert G6.offering == "g6.xlarge:us-east-1a"
    assert on_demand.offering == "g6.xlarge:us-east-1a"


def test_pool_reads_as_type_in_zone_with_market() -> None:
    # Given a spot pool (the default market) and an on-demand pool
    on_demand = Pool(instance_type="p5.4xlarge", availability_zone="us-east-1d", market=Market.ON_DEMAND)

    # When they are printed
    # Then a person reads type, zone and market
    assert str(G6) == "g6.xlarge in us-east-1a (spot)"
    assert str(on_demand) == "p5.4xlarge in us-east-1d (on-demand)"


def test_pools_with_the_same_fields_are_one_key() -> None:
    # Given two pools built separately from the same values
    again = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.SPOT)

    # When they are used as keys
    # Then they are the same key (the blocked-pool cache relies on it)
    assert {G6: 1, again: 2} == {G6: 2}


# --- Attempt ----------------------------------------------------------------------------------------


def test_finished_attempt_costs_price_times_its_runtime() -> None:
    # Given an attempt at $0.50/h that ran 2 h 30 min
    attempt = Attempt(
        job_id="job-1",
        attempt=1,
        pool=G6,
        hourly_price=0.5,
        started_at=T0,
        ended_at=T0 + timedelta(hours=2, minutes=30),
    )

    # When its cost is asked later
    later = T0 + timedelta(days=3)

    # Then it is charged for the time it ran, not until now
    assert attempt.runtime_hours(later) == pytest.approx(2.5)
    assert attempt.cost(later) == pytest.approx(1.25)


def test_live_attempt_costs_price_times_time_so_far() -> None:
    # Given a live attempt at $0.40/h started 90 min ago
    attempt = Attempt(job_id="job-1", attempt=2, pool=G6, hourly_price=0.4, started_at=T0)
    now = T0 + timedelta(minutes=90)

    # When its cost is asked now
    # Then it is charged up to now
    assert attempt.is_live
    assert attempt.cost(now) == pytest.approx(0.6)


def test_attempt_cost_is_never_negative_when_clocks_disagree() -> None:
    # Given a live attempt whose start is a little after "now" (clock skew between hosts)
    attempt = Attempt(job_id="job-1", attempt=1, pool=G6, hourly_price=1.0, started_at=T0)

    # When its cost is asked
    # Then it is zero, not a refund
    assert attempt.cost(T0 - timedelta(seconds=30)) == 0


def test_attempt_numbers_start_at_one() -> None:
    # Given an attempt numbered 0
    # When it is recorded
    # Then it is refused
    with pytest.raises(ValidationError, match="attempt"):
        Attempt(job_id="job-1", attempt=0, pool=G6, hourly_price=1.0, started_at=T0)


# --- Job --------------------------------------------------------------------------------------------


def test_remaining_work_is_spec_work_minus_work_done(events_dir: Path) -> None:
    # Given the example job (6 h of reference-GPU work) with 2.5 h in its last checkpoint
    spec = load_job_spec(events_dir / "jobs" / "resnet50.yaml")
    job = Job(job_id="job-1", spec=spec, submitted_at=T0, updated_at=T0, work_done_hours=2.5)

    # When the remaining work is asked
    # Then it is 3.5 h
    assert job.remaining_work_hours() == pytest.approx(3.5)


def test_remaining_work_does_not_go_below_zero(events_dir: Path) -> None:
    # Given a job whose checkpoints report more work than the spec estimated
    spec = load_job_spec(events_dir / "jobs" / "resnet50.yaml")
    job = Job(job_id="job-1", spec=spec, submitted_at=T0, updated_at=T0, work_done_hours=7.0)

    # When the remaining work is asked
    # Then it is zero
    assert job.remaining_work_hours() == 0


def test_remaining_work_is_unknown_without_work_hours() -> None:
    # Given a job whose spec gives no work_hours
    spec = parse_job_spec({"name": "x", "run": {"command": "true"}, "resources": {"gpus": 1}})
    job = Job(job_id="job-1", spec=spec, submitted_at=T0, updated_at=T0, work_done_hours=1.0)

    # When the remaining work is asked
    # Then there is no answer
    assert job.remaining_work_hours() is None


# --- CheckpointManifest -----------------------------------------------------------------------------


def test_manifest_orders_by_attempt_then_seq_and_names_its_prefix() -> None:
    # Given checkpoints from two attempts
    early = manifest([{"path": "model.pt", "size": 10, "sha256": SHA}], attempt=1, seq=12)
    late = manifest([{"path": "model.pt", "size": 20, "sha256": SHA}], attempt=2, seq=0)

    # When they are ordered
    # Then the second attempt's first checkpoint comes after the first attempt's twelfth
    assert early.order == (1, 12)
    assert late.order == (2, 0)
    assert sorted([late, early], key=lambda m: m.order) == [early, late]
    # and each lives under its own S3 prefix
    assert early.prefix == "jobs/job-1/checkpoints/1-12/"
    assert late.prefix == "jobs/job-1/checkpoints/2-0/"


def test_manifest_counts_the_bytes_of_its_files() -> None:
    # Given a manifest of two files
    m = manifest(
        [
            {"path": "model.pt", "size": 1000, "sha256": SHA},
            {"path": "optim/state.pt", "size": 24, "sha256": "0" * 64},
        ]
    )

    # When its size is asked
    # Then it is the sum of the file sizes
    assert m.total_bytes == 1024


def test_manifest_rejects_a_path_listed_twice() -> None:
    # Given a manifest listing model.pt twice
    files = [{"path": "model.pt", "size": 1, "sha256": SHA}, {"path": "model.pt", "size": 2, "sha256": SHA}]

    # When it is validated
    # Then it is refused: a path may appear once
    with pytest.raises(ValidationError, match="each path may appear once"):
        manifest(files)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param("../other-job/model.pt", id="dot-dot-first"),
        pytest.param("optim/../../model.pt", id="dot-dot-inside"),
        pytest.param("optim//state.pt", id="empty-part"),
        pytest.param("optim/", id="trailing-slash"),
    ],
)
def test_checkpoint_file_path_must_stay_inside_the_checkpoint_dir(path: str) -> None:
    # Given a file path that would escape or be ambiguous inside checkpoint.dir
    # When a manifest lists it
    with pytest.raises(ValidationError) as caught:
        manifest([{"path": path, "size": 1, "sha256": SHA}])

    # Then it is refused with the rule, on the file's path field
    (error,) = caught.value.errors()
    assert error["loc"] == ("files", 0, "path")
    assert "must be a relative path inside checkpoint.dir" in error["msg"]


def test_nested_relative_path_is_accepted() -> None:
    # Given a file in a subdirectory of checkpoint.dir, with a dot in its name
    # When a manifest lists it
    m = manifest([{"path": "optim/state..v2.pt", "size": 1, "sha256": SHA}])

    # Then it is kept as written
    assert m.files == (CheckpointFile(path="optim/state..v2.pt", size=1, sha256=SHA),)


@pytest.mark.parametrize(
    "digest",
    [
        pytest.param("a" * 63, id="too-short"),
        pytest.param("a" * 65, id="too-long"),
        pytest.param("A" * 64, id="upper-case"),
        pytest.param("g" * 64, id="not-hex"),
        pytest.param("", id="empty"),
    ],
)
def test_checkpoint_file_needs_a_lowercase_hex_sha256(digest: str) -> None:
    # Given a file whose sha256 is not 64 lowercase hex digits
    # When a manifest lists it
    with pytest.raises(ValidationError) as caught:
        manifest([{"path": "model.pt", "size": 1, "sha256": digest}])

    # Then it is refused on the sha256 field
    (error,) = caught.value.errors()
    assert error["loc"] == ("files", 0, "sha256")
