"""The job tables of `spotrelay ls` and `status` in an 80-column terminal: what a user scans stays whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console

from spotrelay.aws.deployed_stack import JobStatus
from spotrelay.cli import job_list, job_status
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, Pool, parse_job_spec

NOW = datetime(2026, 11, 30, 13, tzinfo=UTC)
SPEC = parse_job_spec({"name": "resnet50", "run": {"command": "x"}, "resources": {"gpus": 1}, "work_hours": 6})
LONG_ID = "bert-finetune-0a1b2c3d4e5f"


def terminal(monkeypatch: pytest.MonkeyPatch) -> Console:
    console = Console(width=80, record=True, force_terminal=True)
    monkeypatch.setattr(job_list, "tables", lambda: console)
    return console


def test_ls_keeps_ids_names_states_pools_and_costs_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    console = terminal(monkeypatch)
    # Given a job between pools after three interruptions, and one an hour on an on-demand instance
    on_demand = Pool(instance_type="g4dn.12xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND)
    live = Attempt(
        job_id="resnet50-f6ef9928557f",
        attempt=1,
        pool=on_demand,
        hourly_price=3.912,
        instance_id="i-9bf0d0c19e8805840",
        started_at=NOW,
    )
    bert = SPEC.model_copy(update={"name": "bert-finetune"})
    listed = [
        JobStatus(
            Job(
                job_id=LONG_ID, spec=bert, state=JobState.RECOVERING, submitted_at=NOW, updated_at=NOW, interruptions=3
            ),
            [],
        ),
        JobStatus(
            Job(job_id="resnet50-f6ef9928557f", spec=SPEC, state=JobState.RUNNING, submitted_at=NOW, updated_at=NOW),
            [live],
        ),
    ]
    monkeypatch.setattr(job_list, "on_stack", lambda *args: listed)
    monkeypatch.setattr(job_list, "utc_now", lambda: NOW + timedelta(hours=1))
    # When `ls` prints them in an 80-column terminal
    job_list.ls_command(stack="SpotRelay", region=None, endpoint_url=None, ended=False, as_json=False)
    # Then nothing is cut short: ids, names, states, progress, pools, costs (the live one's an estimate)
    text = console.export_text()
    assert "…" not in text
    for whole in (LONG_ID, "bert-finetune", "RECOVERING", "0.00/6 h", "3 lost", "11-30", "13:00"):
        assert whole in text
    for whole in ("resnet50-f6ef9928557f", "RUNNING", "g4dn.12xlarge", "us-east-1a", "on-demand", "3.91*"):
        assert whole in text


def test_the_attempts_table_keeps_pools_markets_and_times_whole_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    console = terminal(monkeypatch)
    lost: dict[str, Any] = {"ended_at": NOW, "outcome": AttemptOutcome.LOST}
    attempts = [
        Attempt(
            job_id=LONG_ID,
            attempt=1,
            pool=Pool(instance_type="g4dn.12xlarge", availability_zone="us-east-1a"),
            hourly_price=1.2,
            instance_id="i-9bf0d0c19e8805840",
            started_at=NOW,
            **lost,
        ),
        Attempt(
            job_id=LONG_ID,
            attempt=2,
            pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.ON_DEMAND),
            hourly_price=0.805,
            instance_id="i-f645d0c19e8805841",
            started_at=NOW,
        ),
    ]
    job = Job(job_id=LONG_ID, spec=SPEC, state=JobState.RUNNING, submitted_at=NOW, updated_at=NOW, attempts=2)
    console.print(job_status.attempts_table(JobStatus(job, attempts)))
    text = console.export_text()
    assert "…" not in text
    for whole in ("g4dn.12xlarge", "us-east-1a", "on-demand", "11-30 13:00", "LOST", "live", "0.805"):
        assert whole in text
    assert "i-9bf0d0c1" in text  # the id may fold, but not vanish
