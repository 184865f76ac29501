"""The DynamoDB faults a chaos seed injects (spotrelay.local.patches.StoreFaults), on the real store over
moto: a throttled write is retried by the SDK and lands; a concurrent writer makes a write conditioned on
the version it read fail its condition for real (the store's ConflictError), and nothing else."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from spotrelay.aws.store import DynamoJobStore
from spotrelay.control.ports import ConflictError
from spotrelay.local import patches
from spotrelay.local.patches import installation
from spotrelay.models import Job, JobState, parse_job_spec

T0 = datetime(2026, 11, 30, tzinfo=UTC)


class Scripted:
    """StoreFaults answering from a script, one answer per write (then None), and recording the writes."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.writes: list[tuple[str, str | None]] = []

    def store_fault(self, operation: str, request: Mapping[str, Any]) -> str | None:
        answer = self.answers.pop(0) if self.answers else None
        self.writes.append((operation, answer))
        return answer


class _Installed:
    def __init__(self, faults: Scripted) -> None:
        self.store_faults = faults


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[Scripted]:
    scripted = Scripted()
    patcher = patches._Patcher()
    patches._patch_dynamodb_faults(patcher)
    monkeypatch.setattr(installation, "_installed", _Installed(scripted))
    try:
        yield scripted
    finally:
        patcher.undo()


def job(job_id: str = "train-1") -> Job:
    spec = parse_job_spec({"name": job_id, "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    return Job(job_id=job_id, spec=spec, state=JobState.QUEUED, submitted_at=T0, updated_at=T0)


def test_a_throttled_write_is_retried_by_the_sdk_and_lands(store: DynamoJobStore, faults: Scripted) -> None:
    faults.answers = [patches.STORE_THROTTLED, patches.STORE_THROTTLED]
    assert store.create_job(job()) is True
    # two throttled answers to the one PutItem, then the SDK's third try landed
    assert faults.writes == [
        ("PutItem", patches.STORE_THROTTLED),
        ("PutItem", patches.STORE_THROTTLED),
        ("PutItem", None),
    ]
    assert store.get_job("train-1")[0].job_id == "train-1"


def test_a_concurrent_writer_fails_a_write_conditioned_on_the_version_it_read(
    store: DynamoJobStore, faults: Scripted
) -> None:
    # Given a job at some version
    store.create_job(job())
    read, version = store.get_job("train-1")
    faults.writes.clear()
    # When a write conditioned on that version meets a concurrent writer
    faults.answers = [patches.STORE_CONFLICT]
    changed = read.model_copy(update={"state": JobState.PLACING})
    with pytest.raises(ConflictError):
        store.put_job(changed, version)
    # Then the record is the one read (nothing of the failed write), one version on: read again and retried,
    # the write lands
    again, moved = store.get_job("train-1")
    assert (again.state, moved) == (JobState.QUEUED, version + 1)
    assert store.put_job(changed, moved) == moved + 1
    assert store.get_job("train-1")[0].state is JobState.PLACING


def test_a_conflict_needs_a_versioned_condition_and_an_item() -> None:
    assert patches.versioned_attribute({"ConditionExpression": "version = :expected"}) == "version"
    assert (
        patches.versioned_attribute(
            {"ConditionExpression": "#v = :expected", "ExpressionAttributeNames": {"#v": "version"}}
        )
        == "version"
    )
    assert patches.versioned_attribute({"ConditionExpression": "attribute_not_exists(pk)"}) is None
    assert patches.versioned_attribute({}) is None
