"""Recover reads the Cause of the error that ended a Run task (the agent's `{"exit_code": n, "log_tail": ...}`).
A worker fails its own task with any Cause it likes: whatever it sends, Recover closes the attempt and
decides, parses no more than Step Functions would pass on, and any reason it derives stays one bounded line."""

from __future__ import annotations

import json

import pytest
from control_builders import World, error

from spotrelay.control.causes import MAX_CAUSE_CHARS_PARSED, parsed_cause
from spotrelay.control.decisions import MAX_FAILURE_REASON_CHARS
from spotrelay.models import AttemptOutcome, JobState

DEEP = '{"exit_code": 3, "log_tail": ' + "[" * 16_000 + "]" * 16_000 + "}"  # 32,025 characters: within the bound
HOSTILE_CAUSES = {
    # json.loads recurses once per level: RecursionError
    "deeply-nested": DEEP,
    "deeply-nested-unclosed": "{" + '"a":[' * 6_000,
    # over Step Functions' 32,768 characters: nothing Step Functions passes on, not worth the memory
    "huge": json.dumps({"exit_code": 3, "log_tail": "x" * 1_000_000}),
    # an integer of more than 4,300 digits: ValueError (not a JSONDecodeError)
    "integer-too-long": '{"exit_code": 1' + "0" * 5_000 + "}",
    # not JSON at all, on many lines, with control characters
    "text": "Traceback (most recent call last):\n\x1b[31m  boom\r\n\u2028" * 2_000,
    "not-an-object": "[3, 4]",
}


@pytest.mark.parametrize("cause", HOSTILE_CAUSES.values(), ids=HOSTILE_CAUSES.keys())
def test_recover_closes_the_attempt_and_decides_whatever_the_cause(cause: str) -> None:
    # Given a running job whose worker failed its task with a hostile Cause
    world = World()
    running = world.running()
    world.advance(hours=1)
    # When Recover runs with it
    result = world.recover(failure={"Error": "JobFailed", "Cause": cause})
    # Then the cause is opaque (no exit code read from it): the attempt is closed and the job restarts
    assert result.action == "relaunch"
    assert result.cause == "job exited with code None: restart"
    assert world.attempt().outcome is AttemptOutcome.FAILED
    assert world.compute.instances[str(running.instance_id)].state == "terminated"
    assert (world.job().restarts, world.job().state) == (1, JobState.RECOVERING)


def test_an_exit_code_no_process_has_is_no_exit_code_and_the_reason_stays_one_bounded_line() -> None:
    # Given a job that may not restart, whose worker reports an exit code of 4,000 digits
    world = World()
    world.running(limits={"max_restarts": 0})
    world.advance(hours=1)
    # When Recover runs with it
    result = world.recover(failure={"Error": "JobFailed", "Cause": '{"exit_code": ' + "9" * 4_000 + "}"})
    # Then the job fails, and the reason it gives is one short line without that number
    assert (result.action, result.error) == ("fail", "JobFailed")
    assert result.cause is not None
    assert len(result.cause) <= MAX_FAILURE_REASON_CHARS
    assert result.cause.isprintable()
    assert result.cause.startswith("the job exited with code None on attempt 1")


@pytest.mark.parametrize("exit_code", [True, 3.5, "3", None])
def test_an_exit_code_that_is_not_an_integer_is_none(exit_code: object) -> None:
    world = World()
    world.running(limits={"max_restarts": 0})
    result = world.recover(failure=error("JobFailed", exit_code=exit_code))
    assert result.cause is not None
    assert result.cause.startswith("the job exited with code None")


def test_the_agents_cause_still_gives_its_exit_code() -> None:
    # Given the agent's Cause, with its log tail (within the bound, nested one level)
    world = World()
    world.running(limits={"max_restarts": 0})
    cause = json.dumps({"exit_code": 137, "log_tail": "Killed\n" * 500})
    # When Recover runs / Then it fails the job with that exit code
    result = world.recover(failure={"Error": "JobFailed", "Cause": cause})
    assert result.cause is not None
    assert result.cause.startswith("the job exited with code 137 on attempt 1")


@pytest.mark.parametrize("cause", HOSTILE_CAUSES.values(), ids=HOSTILE_CAUSES.keys())
def test_with_no_attempt_to_close_the_error_is_passed_on_as_one_bounded_line(cause: str) -> None:
    # Given an admitted job with no attempt (nothing was launched), and a Run task failed with a hostile Cause
    world = World()
    world.admitted()
    # When Recover runs
    result = world.recover(failure={"Error": "JobFailed" + "!" * 1_000, "Cause": cause})
    # Then it fails the job with the error's name and its cause, each bounded, the cause one printable line
    assert result.action == "fail"
    assert result.error is not None
    assert result.error.startswith("JobFailed")
    assert len(result.error) <= 256
    assert result.cause is not None
    assert len(result.cause) <= MAX_FAILURE_REASON_CHARS
    assert result.cause.isprintable()
    # And the job's failure reason, from Finalize, is one bounded line too
    world.finalize(outcome="FAILED", error={"Error": result.error, "Cause": result.cause})
    reason = str(world.job().failure_reason)
    assert len(reason) <= MAX_FAILURE_REASON_CHARS
    assert reason.isprintable()


def test_parsed_cause_bounds_size_and_depth_before_parsing() -> None:
    # Within the bounds: parsed, brackets inside strings not counted
    assert parsed_cause('{"exit_code": 3, "log_tail": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"{"}') == {
        "exit_code": 3,
        "log_tail": '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["{',
    }
    assert parsed_cause('{"a": ' + "[" * 31 + "]" * 31 + "}") is not None  # 32 levels, the object's included
    # Beyond them: opaque
    assert parsed_cause('{"a": ' + "[" * 32 + "]" * 32 + "}") is None
    assert parsed_cause('{"a": "' + "x" * MAX_CAUSE_CHARS_PARSED + '"}') is None
    assert parsed_cause(DEEP) is None
    assert parsed_cause("not json") is None
