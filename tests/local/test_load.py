"""The load run (spotrelay.local.load): its checks, and a small run of it on the deployed stack."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from spotrelay.control.dispatcher import MAX_MESSAGES_PER_RUN
from spotrelay.local.load import LoadReport, _problems, counts, run, write_storm


def test_jobs_are_split_by_priority_and_add_up() -> None:
    assert counts(1000) == {"high": 100, "normal": 300, "low": 600}
    assert counts(10) == {"high": 1, "normal": 3, "low": 6}
    assert sum(counts(7).values()) == 7


def test_the_storm_is_recorded_events_for_instances_that_are_not_ours(tmp_path: Path) -> None:
    storm = tmp_path / "storm.jsonl"
    instances = write_storm(storm, 50)
    events = [json.loads(line) for line in storm.read_text().splitlines()]
    assert len(events) == len(instances) == 50
    assert {e["source"] for e in events} == {"aws.ec2"}
    assert all(
        e["detail"]["instance-id"] in instances and e["resources"][0].endswith(e["detail"]["instance-id"])
        for e in events
    )
    assert len({e["id"] for e in events}) == 50
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)


def _report(**changes: object) -> LoadReport:
    clean = LoadReport(
        jobs=2,
        events=3,
        wall_seconds=1.0,
        simulated_hours=1.0,
        states={"SUCCEEDED": 2},
        dispatcher_runs=2,
        most_received_in_a_run=2,
        most_admitted_in_a_run=2,
        runs_admitting_out_of_priority=0,
        wait_hours={"high": {"median": 0.0, "max": 0.1}, "low": {"median": 0.5, "max": 1.0}},
        ec2_event_invocations=5,
        storm_invocations=3,
        failed_invocations={},
        invocations=20,
        violations=[],
        expectations_failed=[],
    )
    return replace(clean, **changes)  # type: ignore[arg-type]


def test_each_check_of_the_load_run_fails_it_alone() -> None:
    assert _problems(_report()) == []
    broken = {
        "states": {"SUCCEEDED": 1, "FAILED": 1},
        "violations": ["unfinished: x"],
        "expectations_failed": ["9 instances at once > 8"],
        "most_received_in_a_run": MAX_MESSAGES_PER_RUN + 1,
        "runs_admitting_out_of_priority": 1,
        "wait_hours": {"high": {"median": 0.6, "max": 0.9}, "low": {"median": 0.5, "max": 1.0}},
        "failed_invocations": {"ec2_events": 1},
        "storm_invocations": 2,
    }
    for name, value in broken.items():
        assert len(_problems(_report(**{name: value}))) == 1, name


def test_a_small_load_run_admits_by_priority_within_the_quota_and_acknowledges_every_event(
    synthesized_template: Path,
) -> None:
    report = run(10, 100, storm_minutes=2, template=synthesized_template)  # delivered before the last job ends
    assert report.problems == []
    assert report.states == {"SUCCEEDED": 10}
    assert report.storm_invocations == 100
    # ten jobs against eight instances: the high and normal ones launch at once, two low ones wait
    assert report.wait_hours["high"]["max"] == 0.0
    assert report.wait_hours["low"]["max"] > 0.0
    assert report.runs_admitting_out_of_priority == 0
