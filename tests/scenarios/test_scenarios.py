"""Every scenario of events/scenarios, replayed end to end; the tests read the replay's JSON (what
`spotrelay replay --json` prints) and the timeline."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotrelay.local.replay import ReplayResult, check, render_text, replay
from spotrelay.local.scenario import Expectation, ScenarioError, injections, load_scenario

from .conftest import SCENARIOS

Replayed = Callable[..., ReplayResult]
START = datetime(2026, 11, 30, tzinfo=UTC)


def job(result: ReplayResult, name: str) -> dict:  # type: ignore[type-arg]
    return next(j for j in result.to_json()["jobs"] if j["name"] == name)


def pools(entry: dict) -> list[tuple[str, str, str, str | None]]:  # type: ignore[type-arg]
    return [(a["instance_type"], a["availability_zone"], a["market"], a["outcome"]) for a in entry["attempts"]]


def hours_after_start(stamp: str) -> float:
    return (datetime.fromisoformat(stamp.replace("Z", "+00:00")) - START).total_seconds() / 3600


def timeline(result: ReplayResult, name: str) -> list[str]:
    return [e.text for e in result.timeline if e.job == name]


def test_json_has_exactly_the_documented_shape(replayed: Replayed) -> None:
    document = replayed("happy-path").to_json()
    assert set(document) == {"jobs", "expectations", "invariants"}
    assert set(document["expectations"]) == {"passed", "failed"}
    assert set(document["invariants"]) == {"checked", "violations"}
    (entry,) = document["jobs"]
    assert set(entry) == {"name", "job_id", "state", "attempts", "cost", "on_demand_cost", "lost_work_hours"}
    assert set(entry["attempts"][0]) == {
        "instance_type",
        "availability_zone",
        "market",
        "start",
        "end",
        "outcome",
        "notice_to_final_checkpoint_seconds",
        "agent",
    }


def test_happy_path(replayed: Replayed) -> None:
    result = replayed("happy-path")
    entry = job(result, "resnet50")
    assert entry["state"] == "SUCCEEDED"
    assert pools(entry) == [("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED")]
    # 2 reference hours on an L4 (0.968 of a V100) after a minute's boot, at $0.35/h
    assert entry["attempts"][0]["start"] == "2026-11-30T00:00:00Z"
    assert hours_after_start(entry["attempts"][0]["end"]) == pytest.approx(1 / 60 + 2 / 0.968, abs=1 / 600)
    assert entry["cost"] == pytest.approx(0.35 * (1 / 60 + 2 / 0.968), abs=0.01)
    assert entry["on_demand_cost"] > 2 * entry["cost"]
    assert entry["lost_work_hours"] == 0
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}
    assert result.checkpoints >= 8  # every 15 minutes, into moto S3 through the agent's checkpointer


def test_the_same_seed_replays_the_same(replayed: Replayed) -> None:
    first = replayed("happy-path")
    again = replayed("happy-path", 7)  # the scenario's own seed, replayed a second time
    assert again is not first
    assert again.to_json() == first.to_json()
    assert [(e.at, e.job, e.text) for e in again.timeline] == [(e.at, e.job, e.text) for e in first.timeline]


def test_interruption_checkpoints_and_relaunches_on_the_next_cheapest_pool(replayed: Replayed) -> None:
    result = replayed("interruption-relaunch")
    entry = job(result, "resnet50")
    assert entry["state"] == "SUCCEEDED"
    assert pools(entry) == [
        ("g6.xlarge", "us-east-1a", "spot", "INTERRUPTED"),
        ("g6.xlarge", "us-east-1b", "spot", "SUCCEEDED"),
    ]
    # the pool's capacity goes at 1h: the warning at 0:58, the final checkpoint within the grace,
    # Recover sees it committed and Place relaunches at once
    assert hours_after_start(entry["attempts"][1]["start"]) == pytest.approx(58.5 / 60, abs=1 / 120)
    assert entry["lost_work_hours"] < 0.05
    texts = timeline(result, "resnet50")
    assert any(t.startswith("interrupted: spot interruption warning") for t in texts)
    assert any(t.startswith("final checkpoint 1-") and "committed" in t for t in texts)
    assert any(t.startswith("attempt 2 resumed from checkpoint 1-") for t in texts)
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_rebalance_then_interruption(replayed: Replayed) -> None:
    result = replayed("rebalance-then-interruption")
    entry = job(result, "resnet50")
    assert [p[3] for p in pools(entry)] == ["INTERRUPTED", "SUCCEEDED"]
    texts = timeline(result, "resnet50")
    rebalance = next(i for i, t in enumerate(texts) if t.startswith("rebalance checkpoint"))
    warning = next(i for i, t in enumerate(texts) if t.startswith("interrupted:"))
    assert rebalance < warning
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_capacity_outage_waits_then_places(replayed: Replayed) -> None:
    result = replayed("capacity-outage")
    entry = job(result, "resnet50")
    assert pools(entry) == [("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED")]
    assert hours_after_start(entry["attempts"][0]["start"]) >= 4.0  # not before capacity returned
    assert hours_after_start(entry["attempts"][0]["start"]) <= 4.3
    assert result.refusals >= 2
    # The job with a deadline waits out rule 1's band (2.80 h behind the uniform line), catches up on on-demand
    # at Place's next try (every 3 min), and moves back to spot when capacity returns
    due = job(result, "resnet50-due")
    assert pools(due) == [
        ("g6.xlarge", "us-east-1a", "on-demand", "MIGRATED"),
        ("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED"),
    ]
    assert 2.80 <= hours_after_start(due["attempts"][0]["start"]) <= 2.80 + 0.06
    assert hours_after_start(due["attempts"][1]["start"]) >= 4.0
    assert result.to_json()["expectations"] == {"passed": 2, "failed": 0}
    # The printed timeline has a line per refusing pool per job, with the count and the last time, not one
    # per retry; the data keeps every refusal
    refusals = [e for e in result.timeline if e.job == "resnet50" and "g6.xlarge:us-east-1a" in e.text]
    assert len(refusals) > 10
    printed = [line for line in render_text(result).splitlines() if "EC2 refused" in line]
    assert len(printed) == 4
    last = refusals[-1].at - result.scenario.start
    assert any(
        "resnet50 " in line and "us-east-1a" in line and f"(x{len(refusals)}, the last at +0{last}" in line
        for line in printed
    )


def test_a_job_that_caught_up_on_demand_moves_back_to_spot_make_before_break(replayed: Replayed) -> None:
    result = replayed("back-to-spot")
    entry = job(result, "trainer")
    # Spot (lost to the outage; the other spot pool, going at the same time, refuses the relaunch: EC2 is
    # taking its capacity back), on-demand to catch up, then back to spot for the rest
    assert pools(entry) == [
        ("g6.xlarge", "us-east-1a", "spot", "INTERRUPTED"),
        ("g6.xlarge", "us-east-1a", "on-demand", "MIGRATED"),
        ("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED"),
    ]
    on_demand, standby = entry["attempts"][1], entry["attempts"][2]
    # The on-demand catch-up began once the job was behind the line by more than rule 1's band (1.91 h): with
    # 0.92 h of work saved at the outage it falls behind the line (W t / D = t / 2) at 1.84 h, so from 3.75 h,
    # at Place's next try (every 3 min)
    assert 3.74 <= hours_after_start(on_demand["start"]) <= 3.74 + 0.06
    # The spot instance started before the on-demand one stopped (make-before-break), once spot was back
    assert hours_after_start(standby["start"]) >= 5.0
    assert hours_after_start(standby["start"]) < hours_after_start(on_demand["end"])
    # and the job resumed from the checkpoint the on-demand attempt committed when it handed over
    assert any(text.startswith("attempt 3 resumed from checkpoint 2-") for text in timeline(result, "trainer"))
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_price_above_the_cap_moves_the_job(replayed: Replayed) -> None:
    entry = job(replayed("price-above-cap"), "capped")
    assert pools(entry) == [
        ("g6.xlarge", "us-east-1a", "spot", "INTERRUPTED"),
        ("g6.xlarge", "us-east-1b", "spot", "SUCCEEDED"),
    ]
    assert hours_after_start(entry["attempts"][0]["end"]) < 1.0  # before the $0.90 price took effect


def test_a_spot_price_rise_mid_run_is_billed_at_the_price_in_effect(replayed: Replayed) -> None:
    # Given a job without a price cap on g6.xlarge in us-east-1a at $0.35/h, whose price doubles an hour in
    result = replayed("price-rise-mid-run")
    entry = job(result, "steady")
    assert pools(entry) == [("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED")]  # EC2 kept the instance
    (attempt,) = entry["attempts"]
    assert attempt["start"] == "2026-11-30T00:00:00Z"
    # Then the report bills its instance from its launch to its `shutting-down` state change (which EC2
    # sends at once on Finalize's TerminateInstances; `terminated` follows TERMINATED_AFTER later and
    # bills nothing more): an hour at $0.35, the rest at $0.70
    billed_hours = hours_after_start(attempt["end"])
    assert entry["cost"] == pytest.approx(0.35 * 1 + 0.70 * (billed_hours - 1), abs=0.001)
    assert entry["cost"] > 0.35 * billed_hours + 0.3  # not its hours at the launch price
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_deadline_nearly_spent_falls_back_to_on_demand(replayed: Replayed) -> None:
    result = replayed("deadline-on-demand")
    entry = job(result, "deadline")
    assert entry["state"] == "SUCCEEDED"
    assert entry["attempts"][-1]["market"] == "on-demand"
    assert all(a["market"] == "spot" for a in entry["attempts"][:-1])
    assert hours_after_start(entry["attempts"][-1]["end"]) <= 3.6
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_burst_is_admitted_by_priority_within_the_quota(replayed: Replayed) -> None:
    # burst-12, burst-50 made small (`make scenarios` and `make bench-replay` replay burst-50 itself)
    result = replayed("burst-12")
    document = result.to_json()
    assert len(document["jobs"]) == 12
    assert all(j["state"] == "SUCCEEDED" for j in document["jobs"])
    first_start = {j["name"]: hours_after_start(j["attempts"][0]["start"]) for j in document["jobs"]}
    high = sorted(v for k, v in first_start.items() if k.startswith("high-"))
    low_started_late = sorted(v for k, v in first_start.items() if k.startswith("low-") and v > 5 / 60)
    # the quota admits 2 at once; the high-priority jobs, submitted after 9 low ones, go before the
    # low ones still queued
    assert max(high) <= min(low_started_late)
    assert document["expectations"] == {"passed": 3, "failed": 0}


def test_duplicate_and_reordered_events_count_once(replayed: Replayed) -> None:
    result = replayed("duplicate-reordered")
    entry = job(result, "resnet50")
    assert [p[3] for p in pools(entry)] == ["INTERRUPTED", "SUCCEEDED"]
    assert result.events_injected == 7
    assert result.to_json()["expectations"] == {"passed": 1, "failed": 0}


def test_invalid_job_messages_fail_with_their_reason_in_the_dlq(replayed: Replayed) -> None:
    result = replayed("invalid-job")
    reports = {j.name: j for j in result.jobs}
    for name in ("not-json", "zero-gpus"):
        assert reports[name].state == "FAILED"
        assert reports[name].attempts == ()
        assert reports[name].in_dlq
        assert (reports[name].failure_reason or "").startswith("InvalidJob: ")
    assert "resources.gpus" in (reports["zero-gpus"].failure_reason or "")
    assert reports["resnet50"].state == "SUCCEEDED"
    assert not reports["resnet50"].in_dlq
    assert result.to_json()["expectations"] == {"passed": 3, "failed": 0}


def test_flagship(replayed: Replayed) -> None:
    result = replayed("flagship")
    document = result.to_json()
    assert all(j["state"] == "SUCCEEDED" for j in document["jobs"])
    assert sum(len(j["attempts"]) > 1 for j in document["jobs"]) >= 2  # jobs survived interruptions
    assert document["expectations"]["failed"] == 0
    # The timeline reads as cause then effect: a refused pool comes before the launch on the next one
    texts = timeline(result, "bert-finetune")
    refused = next(i for i, text in enumerate(texts) if text.startswith("EC2 refused"))
    assert texts[refused + 1].startswith("relaunched (attempt ")
    # and the agents did it: the notice seen, the final checkpoint, the restore (one replay: it is long)
    flagship_resnet50_agents(result)


def events_of(attempt: dict, kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in attempt["agent"] if e["event"] == kind]


def flagship_resnet50_agents(result: ReplayResult) -> None:
    """The flagship's resnet50 (its pool loses its capacity at 1h), as its real agents saw it."""
    entry = job(result, "resnet50")
    first, second = entry["attempts"]
    # then the first attempt's agent saw the notice at its next IMDS poll (every 5 s), sent SIGTERM, and
    # committed its final checkpoint once the job saved (20 s), well inside the two minutes
    (seen,) = events_of(first, "notice-seen")
    assert seen["action_time"] == "2026-11-30T01:00:00Z"
    assert seen["at"] == "2026-11-30T00:58:05Z"
    assert events_of(first, "sigterm")[0]["at"] == seen["at"]
    (final,) = [c for c in events_of(first, "checkpoint") if c["reason"] == "final"]
    assert final["committed"]
    assert final["at"] == "2026-11-30T00:58:25Z"
    assert first["notice_to_final_checkpoint_seconds"] == 25
    assert events_of(first, "reported")[0] | {"at": None} == {
        "at": None,
        "event": "reported",
        "outcome": "interrupted",
        "error": "SpotInterrupted",
        "exit_code": 0,  # the job saved at SIGTERM and exited
        "accepted": False,  # ec2_events had failed the task at the warning: Step Functions answers TaskTimedOut
    }
    periodic = [c for c in events_of(first, "checkpoint") if c["reason"] == "periodic"]
    assert len(periodic) == 3
    assert all(c["committed"] for c in periodic)
    # one every 225 s from the start to the report: a quarter of the Run task's 900 s heartbeat timeout
    heartbeats = events_of(first, "heartbeats")[0]
    assert heartbeats["count"] >= 15
    assert (datetime.fromisoformat(heartbeats["at"]) - datetime.fromisoformat(heartbeats["first"])).total_seconds() == (
        225 * (heartbeats["count"] - 1)
    )
    # and the second attempt's agent restored exactly that checkpoint
    (restored,) = events_of(second, "restored")
    assert restored["checkpoint"] == f"1-{final['seq']}"
    assert restored["work_done_hours"] == pytest.approx(final["work_done_hours"])
    assert events_of(second, "reported")[0]["outcome"] == "succeeded"


def test_agent_faults_are_survived(replayed: Replayed) -> None:
    result = replayed("agent-faults")
    assert result.to_json()["expectations"] == {"passed": 4, "failed": 0}
    # an agent that dies says nothing more: the Run task's heartbeat times out, 15 minutes after the last
    # heartbeat before the death at 40 minutes (they come every 225 s), and the job is relaunched
    dies = job(result, "dies")
    assert [a["outcome"] for a in dies["attempts"]] == ["LOST", "SUCCEEDED"]
    last_heartbeat = hours_after_start(events_of(dies["attempts"][0], "heartbeats")[0]["at"])
    assert 40 / 60 - 225 / 3600 <= last_heartbeat <= 40 / 60
    assert hours_after_start(dies["attempts"][1]["start"]) == pytest.approx(last_heartbeat + 15 / 60, abs=1 / 60)
    assert events_of(dies["attempts"][0], "reported") == []
    # a restarted agent re-attaches to the running job through its state file
    restarts = job(result, "restarts")["attempts"]
    assert len(restarts) == 1
    assert [e["event"] for e in restarts[0]["agent"]][3:6] == ["agent-killed", "agent-restarted", "reattached"]
    # IMDS answering 503 is logged (once a minute per error) and S3 refusing an upload loses one periodic
    # checkpoint, not the job
    flaky = job(result, "flaky-deps")["attempts"][0]
    (unanswered,) = events_of(flaky, "imds-unanswered")  # 20 minutes of it: one entry
    assert unanswered["count"] == 2 * 20  # each of the two paths polled, logged once a minute
    assert [e.rsplit(": ", 1)[-1] for e in unanswered["errors"]] == ["HTTP 503", "HTTP 503"]
    assert (unanswered["at"], unanswered["until"]) == ("2026-11-30T00:20:00Z", "2026-11-30T00:39:00Z")
    assert len(events_of(flaky, "checkpoint-failed")) == 1
    # a job that ignores SIGTERM is killed at its grace; the final checkpoint is still committed
    (stubborn, _) = job(result, "stubborn")["attempts"]
    assert events_of(stubborn, "sigkill")[0]["at"] == "2026-11-30T00:58:35Z"  # SIGTERM at 58:05 + 30 s
    assert [c["committed"] for c in events_of(stubborn, "checkpoint") if c["reason"] == "final"] == [True]


def test_expectations_can_fail(replayed: Replayed) -> None:
    # Given the happy path's replay, When it is held to expectations it does not meet
    result = replayed("happy-path")
    spans: list[tuple[datetime, datetime]] = []
    wrong = [
        Expectation(job="resnet50", state="FAILED"),  # type: ignore[arg-type]
        Expectation(job="resnet50", min_attempts=2),
        Expectation(job="resnet50", max_cost=0.01),
        Expectation(job="resnet50", last_pool="g5.xlarge:us-east-1a"),
        Expectation(job="nobody", state="SUCCEEDED"),  # type: ignore[arg-type]
    ]
    # Then each one fails and says why
    verdicts = [check(e, result, spans) for e in wrong]
    assert [v.passed for v in verdicts] == [False] * len(wrong)
    assert "state SUCCEEDED, expected FAILED" in verdicts[0].detail
    assert "no job named nobody" in verdicts[4].detail


def test_an_expectation_about_a_job_the_scenario_never_submits_is_refused_before_the_replay(
    synthesized_template: Path,
) -> None:
    # Given the happy path with an expectation about a job it does not have (a typo)
    scenario = load_scenario(SCENARIOS / "happy-path.yaml")
    wrong = scenario.model_copy(update={"expect": [*scenario.expect, Expectation(job="resnet5O")]})
    # When it is replayed, Then it is refused at once, naming the job and the ones it has
    with pytest.raises(ScenarioError, match=r"expect names no job it submits: resnet5O \(its jobs: resnet50\)"):
        replay(wrong, template=synthesized_template)


def test_an_event_bound_to_a_job_the_scenario_never_submits_is_refused_before_the_replay(
    synthesized_template: Path,
) -> None:
    # Given a scenario with its interruption bound to a misspelt job
    scenario = load_scenario(SCENARIOS / "rebalance-then-interruption.yaml")
    event = scenario.events[1]
    assert event.instance is not None
    misspelt = event.model_copy(update={"instance": event.instance.model_copy(update={"job": "resnet5O"})})
    wrong = scenario.model_copy(update={"events": [misspelt]})
    # When it is replayed, Then it is refused at once, naming the event, the job and the ones it has
    with pytest.raises(
        ScenarioError,
        match=r"events bound to a job it never submits: .*spot-interruption-warning.json to resnet5O "
        r"\(its jobs: resnet50\)",
    ):
        replay(wrong, template=synthesized_template)


@pytest.mark.parametrize("text", ['{"foo": 1}', '{"source": "aws.ec2", "detail-type": "x", "detail": 3}', "[1]"])
def test_an_event_file_that_is_json_but_not_an_event_is_one_error_naming_it(tmp_path: Path, text: str) -> None:
    # Given a scenario whose event file holds JSON that is not an EventBridge event
    scenario = load_scenario(SCENARIOS / "rebalance-then-interruption.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    event = scenario.events[0]
    wrong = scenario.model_copy(update={"events": [event.model_copy(update={"file": str(bad)})]})
    # When its events are read, Then it is refused, naming the entry and the file
    with pytest.raises(ScenarioError, match=rf"^events\[0\]\.file: {bad} is not an (EventBridge )?event"):
        injections(wrong)


def test_the_control_plane_down_for_30_minutes_loses_no_job(replayed: Replayed) -> None:
    # Given every function failing from 30m to 60m, resnet50's instance interrupted at 43-45m meanwhile,
    # bert submitted at 50m, and the operator's redrive and archive replay at 70m
    result = replayed("control-plane-down")
    # Then every job ended SUCCEEDED, resnet50 relaunched once, and no invariant broke
    assert result.passed, [e.detail for e in result.expectations if not e.passed]
    assert not result.violations
    assert {j["name"]: j["state"] for j in result.to_json()["jobs"]} == {"resnet50": "SUCCEEDED", "bert": "SUCCEEDED"}
    assert [a["outcome"] for a in job(result, "resnet50")["attempts"]] == ["INTERRUPTED", "SUCCEEDED"]
    # And the outage failed invocations of the functions, and ec2_events' events went to its DLQ after
    # Lambda's retries: the warning and the `shutting-down` and `terminated` state changes
    assert result.failed_by_outage
    assert result.dead_lettered == {"ec2_events": 3}
    # And nothing was launched while the functions were down
    for entry in result.to_json()["jobs"]:
        for attempt in entry["attempts"]:
            assert not 0.5 <= hours_after_start(attempt["start"]) < 1.0
    # And the redrive (ec2_events' DLQ, then the rule targets', as `spotrelay admin redrive`) found the three
    # events, handled them, and left the DLQ empty; EventBridge gave up on no delivery
    redrive, targets = [o for o in result.operator if o.run == "redrive-dlq"]
    assert (targets.detail["function"], targets.detail["found"], targets.detail["depth_after"]) == (
        "event targets",
        0,
        0,
    )
    assert redrive.detail["depth_before"] == 3
    assert redrive.detail["found"] == redrive.detail["handled"] == 3
    assert redrive.detail["failed"] == 0
    assert redrive.detail["depth_after"] == 0
    # And the archive replay delivered the window's EC2 events again, every one handled
    [archive] = [o for o in result.operator if o.run == "replay-archive"]
    assert archive.detail["events"] == 3
    assert archive.detail["failed"] == 0
    assert result.to_json()["operator"][0]["run"] == "redrive-dlq"
    assert any("control plane back" in e.text for e in result.timeline)


def test_a_job_that_crashes_on_spot_restarts_in_the_same_pool_and_counts_no_interruption(replayed: Replayed) -> None:
    # Given a spot job whose code exits 3 twenty minutes in (Recover terminates its instance, whose
    # `shutting-down` is handled while Recover goes on)
    result = replayed("job-crash-restarts")
    entry = job(result, "crashy")
    # Then it restarts in the same cheapest pool: its own crash blocked nothing
    assert pools(entry) == [
        ("g6.xlarge", "us-east-1a", "spot", "FAILED"),
        ("g6.xlarge", "us-east-1a", "spot", "SUCCEEDED"),
    ]
    # And the job counts no interruption
    [crashy] = [j for j in result.jobs if j.name == "crashy"]
    assert crashy.interruptions == 0
