"""The JobLifecycle definition: states, transitions, Retry and Catch, as the functions rely on them."""

from __future__ import annotations

from typing import Any

import pytest

from infrastructure.synth import Synthesized, state_machine_definition
from spotrelay.control import lifecycle
from stacks import lifecycle_construct as lc

SERVICE_ERRORS = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
]
# Every task's first Retry: a Lambda service error, the control plane down, waited out for 55 minutes
SERVICE_RETRY = {
    "ErrorEquals": SERVICE_ERRORS,
    "IntervalSeconds": 1,
    "BackoffRate": 2,
    "MaxAttempts": 60,
    "MaxDelaySeconds": 60,
}
# ... and its second: an AWS call of the function throttled past the SDK's retries (spotrelay.aws.errors),
# about two minutes of backoff before the error is the step's failure
THROTTLED_RETRY = {
    "ErrorEquals": ["AwsThrottled"],
    "IntervalSeconds": 1,
    "BackoffRate": 2,
    "MaxAttempts": 8,
    "MaxDelaySeconds": 30,
}
DECISION_SELECTOR = {
    "action.$": "$.Payload.action",
    "wait_seconds.$": "$.Payload.wait_seconds",
    "error.$": "$.Payload.error",
    "cause.$": "$.Payload.cause",
}


@pytest.fixture(scope="module")
def states(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    definition = state_machine_definition(synthesized)
    assert definition["StartAt"] == lc.PLACE
    assert "QueryLanguage" not in definition or definition["QueryLanguage"] == "JSONPath"
    result: dict[str, dict[str, Any]] = definition["States"]
    return result


def _invokes(synthesized: Synthesized, state: dict[str, Any], function: str) -> None:
    assert state["Type"] == "Task"
    assert state["Parameters"]["FunctionName"] == f"<{synthesized.function_ids()[function]}.Arn>"


def _choices(state: dict[str, Any], variable: str) -> dict[str, str]:
    assert state["Type"] == "Choice"
    assert {c["Variable"] for c in state["Choices"]} == {variable}
    return {c["StringEquals"]: c["Next"] for c in state["Choices"]}


def test_the_definition_has_exactly_the_exported_states(states: dict[str, dict[str, Any]]) -> None:
    assert set(states) == set(lc.STATE_NAMES)


def test_place_invokes_place_selects_the_decision_and_retries_service_errors_and_conflicts(
    synthesized: Synthesized, states: dict[str, dict[str, Any]]
) -> None:
    place = states[lc.PLACE]
    _invokes(synthesized, place, "place")
    assert place["Resource"] == "arn:<AWS::Partition>:states:::lambda:invoke"
    assert place["Parameters"]["Payload"] == {"job_id.$": "$.job_id"}
    assert place["ResultSelector"] == DECISION_SELECTOR
    assert place["ResultPath"] == "$.place"
    assert place["Retry"] == [
        SERVICE_RETRY,
        THROTTLED_RETRY,
        {"ErrorEquals": ["ConflictError"], "IntervalSeconds": 1, "BackoffRate": 2, "MaxAttempts": 5},
    ]
    assert place["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": lc.FINALIZE_FAILED}]
    assert place["Next"] == lc.PLACE_CHOICE


def test_place_choice_launches_waits_or_fails(states: dict[str, dict[str, Any]]) -> None:
    choice = states[lc.PLACE_CHOICE]
    assert _choices(choice, "$.place.action") == {
        "launch": lc.RUN,
        "wait": lc.WAIT_FOR_CAPACITY,
        "fail": lc.PLACE_FAILED,
    }
    # An action the definition does not know also ends in Finalize (which terminates any worker)
    assert choice["Default"] == lc.PLACE_FAILED
    assert states[lc.WAIT_FOR_CAPACITY] == {"Type": "Wait", "SecondsPath": "$.place.wait_seconds", "Next": lc.PLACE}
    assert states[lc.PLACE_FAILED] == {
        "Type": "Pass",
        "Parameters": {"outcome": "FAILED", "error": {"Error.$": "$.place.error", "Cause.$": "$.place.cause"}},
        "ResultPath": "$.final",
        "Next": lc.FINALIZE,
    }


def test_run_waits_for_the_task_token_with_a_heartbeat_and_catches_in_order(
    synthesized: Synthesized, states: dict[str, dict[str, Any]]
) -> None:
    run = states[lc.RUN]
    _invokes(synthesized, run, "launch")
    assert run["Resource"] == "arn:<AWS::Partition>:states:::lambda:invoke.waitForTaskToken"
    # the heartbeat timeout goes to Launch too: recorded with the attempt, it paces the agent's heartbeats
    assert run["Parameters"]["Payload"] == {
        "job_id.$": "$.job_id",
        "task_token.$": "$$.Task.Token",
        "heartbeat_seconds.$": "$.heartbeat_seconds",
    }
    assert run["HeartbeatSecondsPath"] == "$.heartbeat_seconds"
    # A run's own timeout is explicit and as long as an execution may last: without it, moto (and the States
    # Language) time the task out after 60 s, and `spotrelay local up` lost every job after a minute
    assert run["TimeoutSeconds"] == 365 * 24 * 3600
    assert run["ResultPath"] == "$.run"
    # A throttled launch, once its retries are spent, goes back to Place as a refused one does: never FAILED
    assert run["Catch"] == [
        {
            "ErrorEquals": ["InsufficientInstanceCapacity", "LaunchThrottled"],
            "ResultPath": "$.error",
            "Next": lc.PLACE,
        },
        {"ErrorEquals": ["JobCancelled"], "ResultPath": "$.error", "Next": lc.FINALIZE_CANCELLED},
        {
            "ErrorEquals": [
                "SpotInterrupted",
                "Migrating",
                "InstanceLost",
                "JobFailed",
                "States.HeartbeatTimeout",
                "States.Timeout",
            ],
            "ResultPath": "$.error",
            "Next": lc.RECOVER,
        },
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": lc.FINALIZE_FAILED},
    ]
    # Only a failed *invocation* of launch is retried, and a launch EC2 throttled (with a longer backoff:
    # 2, 4, 8, 16, 30, 30 s), never what the worker reported
    assert run["Retry"] == [
        SERVICE_RETRY,
        THROTTLED_RETRY,
        {
            "ErrorEquals": ["LaunchThrottled"],
            "IntervalSeconds": 2,
            "BackoffRate": 2,
            "MaxAttempts": 6,
            "MaxDelaySeconds": 30,
        },
    ]
    assert run["Next"] == lc.FINALIZE_SUCCEEDED


def test_recover_invokes_recover_with_the_error_and_chooses_how_to_go_on(
    synthesized: Synthesized, states: dict[str, dict[str, Any]]
) -> None:
    recover = states[lc.RECOVER]
    _invokes(synthesized, recover, "recover")
    assert recover["Parameters"]["Payload"] == {"job_id.$": "$.job_id", "error.$": "$.error"}
    assert recover["ResultSelector"] == DECISION_SELECTOR
    assert recover["ResultPath"] == "$.recover"
    assert recover["Retry"] == states[lc.PLACE]["Retry"]
    assert recover["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": lc.FINALIZE_FAILED}]
    choice = states[recover["Next"]]
    assert recover["Next"] == lc.RECOVER_CHOICE
    assert _choices(choice, "$.recover.action") == {
        "relaunch": lc.PLACE,
        "wait_checkpoint": lc.WAIT_FOR_CHECKPOINT,
        "fail": lc.RECOVER_FAILED,
    }
    assert choice["Default"] == lc.RECOVER_FAILED
    assert states[lc.WAIT_FOR_CHECKPOINT] == {
        "Type": "Wait",
        "SecondsPath": "$.recover.wait_seconds",
        "Next": lc.RECOVER,
    }
    assert states[lc.RECOVER_FAILED]["Parameters"] == {
        "outcome": "FAILED",
        "error": {"Error.$": "$.recover.error", "Cause.$": "$.recover.cause"},
    }
    assert states[lc.RECOVER_FAILED]["Next"] == lc.FINALIZE


def test_the_three_finalize_passes_record_the_outcome_in_final(states: dict[str, dict[str, Any]]) -> None:
    assert states[lc.FINALIZE_SUCCEEDED] == {
        "Type": "Pass",
        "Result": {"outcome": "SUCCEEDED"},
        "ResultPath": "$.final",
        "Next": lc.FINALIZE,
    }
    assert states[lc.FINALIZE_FAILED] == {
        "Type": "Pass",
        "Parameters": {"outcome": "FAILED", "error.$": "$.error"},
        "ResultPath": "$.final",
        "Next": lc.FINALIZE,
    }
    assert states[lc.FINALIZE_CANCELLED] == {
        "Type": "Pass",
        "Parameters": {"outcome": "CANCELLED", "error.$": "$.error"},
        "ResultPath": "$.final",
        "Next": lc.FINALIZE,
    }


def test_finalize_retries_hard_then_the_outcome_ends_the_execution(
    synthesized: Synthesized, states: dict[str, dict[str, Any]]
) -> None:
    finalize = states[lc.FINALIZE]
    _invokes(synthesized, finalize, "finalize")
    assert finalize["Parameters"]["Payload"] == {"job_id.$": "$.job_id", "final.$": "$.final"}
    assert finalize["ResultPath"] == "$.finalized"
    assert finalize["Retry"] == [
        SERVICE_RETRY,
        THROTTLED_RETRY,
        {
            "ErrorEquals": ["ConflictError", "States.TaskFailed"],
            "IntervalSeconds": 1,
            "BackoffRate": 2,
            "MaxAttempts": 6,
        },
    ]
    assert finalize["Next"] == lc.OUTCOME
    outcome = states[lc.OUTCOME]
    assert _choices(outcome, "$.final.outcome") == {"SUCCEEDED": lc.SUCCEEDED, "CANCELLED": lc.CANCELLED}
    assert outcome["Default"] == lc.FAILED
    assert states[lc.SUCCEEDED] == {"Type": "Succeed"}
    assert states[lc.CANCELLED]["Type"] == "Fail"
    assert states[lc.CANCELLED]["Error"] == "JobCancelled"
    assert states[lc.FAILED]["Type"] == "Fail"
    assert states[lc.FAILED]["Error"] == "JobFailed"


def test_every_path_to_the_end_goes_through_finalize(states: dict[str, dict[str, Any]]) -> None:
    # Given the transition graph (Next, Choices, Default, Catch)
    def successors(name: str) -> set[str]:
        state = states[name]
        found = {state[key] for key in ("Next", "Default") if key in state}
        found |= {c["Next"] for c in state.get("Choices", [])}
        found |= {c["Next"] for c in state.get("Catch", [])}
        return found

    # When we remove Finalize, Then no terminal state is reachable from Place
    seen, frontier = set(), [lc.PLACE]
    while frontier:
        name = frontier.pop()
        if name in seen or name == lc.FINALIZE:
            continue
        seen.add(name)
        frontier.extend(successors(name))
    assert not seen & {lc.SUCCEEDED, lc.CANCELLED, lc.FAILED}
    assert all(states[name]["Type"] not in ("Succeed", "Fail") for name in seen)
    # And every state is reachable (nothing is dead)
    reachable, frontier = set(), [lc.PLACE]
    while frontier:
        name = frontier.pop()
        if name not in reachable:
            reachable.add(name)
            frontier.extend(successors(name))
    assert reachable == set(states)


def test_a_task_waits_out_a_control_plane_outage_of_more_than_30_minutes(states: dict[str, dict[str, Any]]) -> None:
    # Given the first Retry of each Lambda task (1 s doubling, capped at MaxDelaySeconds)
    for name in (lc.PLACE, lc.RUN, lc.RECOVER, lc.FINALIZE):
        retry = states[name]["Retry"][0]
        waits = [
            min(retry["IntervalSeconds"] * retry["BackoffRate"] ** n, retry["MaxDelaySeconds"])
            for n in range(retry["MaxAttempts"])
        ]
        # Then its retries span a 30-minute outage with room to spare, and the first after it comes within a minute
        assert sum(waits) >= 45 * 60, name
        assert max(waits) <= 60, name
    assert lc.SERVICE_RETRY_COVERS_SECONDS == sum(lc.service_retry_waits()) == 63 + 54 * 60


def test_the_cores_pacing_of_throttled_launches_is_the_run_tasks_retry_of_them(
    states: dict[str, dict[str, Any]],
) -> None:
    # Given the Run task's Retry of LaunchThrottled, and its Catch back to Place
    [retry] = [r for r in states[lc.RUN]["Retry"] if r["ErrorEquals"] == ["LaunchThrottled"]]
    waits = [
        min(retry["IntervalSeconds"] * retry["BackoffRate"] ** n, retry["MaxDelaySeconds"])
        for n in range(retry["MaxAttempts"])
    ]
    # Then the core's bound on RunInstances calls under throttling counts the same calls and waits (a round: the
    # first call and each retry, 90 s), and Place, which the Catch goes back to, can wait (WaitForCapacity)
    assert waits == lifecycle.launch_throttled_retry_waits() == [2, 4, 8, 16, 30, 30]
    assert 1 + retry["MaxAttempts"] == lifecycle.LAUNCH_CALLS_PER_THROTTLED_ROUND == 7
    assert lifecycle.THROTTLED_LAUNCHES_PER_HOUR == 37  # 7 a round, a round every 90 s + 10 min at most
    [catch] = [c for c in states[lc.RUN]["Catch"] if "LaunchThrottled" in c["ErrorEquals"]]
    assert catch["Next"] == lc.PLACE
    assert _choices(states[lc.PLACE_CHOICE], "$.place.action")["wait"] == lc.WAIT_FOR_CAPACITY
