"""`spotrelay events export` against the stack deployed into moto: the archive replayed onto its bus,
caught by a temporary rule and queue, annotated with the job and attempt, and replayable."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotrelay.aws.store import DynamoJobStore
from spotrelay.control.ports import InstanceRef
from spotrelay.local import LocalRuntime, VirtualClock
from spotrelay.local.scenario import injections, parse_scenario
from spotrelay.local.scenario_export import export_archive, stack_archive, stack_table, to_jsonl
from spotrelay.market import MarketBuilder
from spotrelay.models import Job, parse_job_spec

from .conftest import REPO_ROOT

START = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_export_reads_the_archive_and_binds_instances_to_attempts(synthesized_template: Path, tmp_path: Path) -> None:
    market = MarketBuilder(START).add_price("g6.xlarge", "us-east-1a", 0.35).build()
    with LocalRuntime(clock=VirtualClock(START), market=market, seed=3) as runtime:
        stack = runtime.deploy(synthesized_template)
        store = DynamoJobStore(stack.table_name, runtime.dynamodb)
        # Given a job whose attempt 2 ran on i-0123456789abcdef0, and EC2 events archived by the stack
        spec = parse_job_spec({"name": "resnet50", "run": {"command": "train"}, "resources": {"gpus": 1}})
        store.create_job(Job(job_id="resnet50-abc", spec=spec, submitted_at=START, updated_at=START))
        store.put_instance_ref(InstanceRef(instance_id="i-0123456789abcdef0", job_id="resnet50-abc", attempt=2))
        warning = json.loads((REPO_ROOT / "events" / "recorded" / "spot-interruption-warning.json").read_text())
        warning["detail"]["instance-id"] = "i-0123456789abcdef0"
        other = json.loads((REPO_ROOT / "events" / "recorded" / "rebalance-recommendation.json").read_text())
        other["detail"]["instance-id"] = "i-00000000000000001"
        runtime.put_events([warning], at=START + timedelta(minutes=5))
        runtime.put_events([other], at=START + timedelta(minutes=1))
        cloudformation = runtime.client("cloudformation")
        assert stack_table(cloudformation, stack.stack_name) == stack.table_name
        # When the archive is exported
        exported = export_archive(
            events=runtime.events,
            sqs=runtime.sqs,
            archive_name=stack_archive(cloudformation, stack.stack_name, runtime.events),
            since=START - timedelta(days=1),
            until=START + timedelta(days=1),
            store=store,
            poll_seconds=0,
            sleep=lambda _: None,
        )
        # Then both events come back in time order, the known instance noted with its job and attempt
        assert [e["detail-type"] for e in exported] == [
            "EC2 Instance Rebalance Recommendation",
            "EC2 Spot Instance Interruption Warning",
        ]
        assert all("replay-name" not in e for e in exported)
        assert "spotrelay" not in exported[0]
        assert exported[1]["spotrelay"] == {"job": "resnet50", "attempt": 2, "job_id": "resnet50-abc"}
        # And the temporary rule and queue are gone
        assert not [r for r in runtime.events.list_rules()["Rules"] if r["Name"].startswith("spotrelay-export-")]
        assert not [u for u in runtime.sqs.list_queues().get("QueueUrls", []) if "spotrelay-export-" in u]
    # And a scenario naming the file binds the events by job and attempt, keeping their spacing
    (tmp_path / "incident.jsonl").write_text(to_jsonl(exported))
    scenario = parse_scenario(
        {"name": "incident", "start": "2026-12-01T00:00:00Z", "events": {"file": "incident.jsonl", "at": "1h"}},
        tmp_path,
    )
    planned = injections(scenario)
    assert [(i.job, i.attempt) for i in planned] == [(None, None), ("resnet50", 2)]
    assert planned[1].at - planned[0].at == timedelta(minutes=4)
    assert planned[0].at == datetime(2026, 12, 1, 1, tzinfo=UTC)
