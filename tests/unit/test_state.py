"""The job state machine: a realistic lifecycle walks through, redelivered events are harmless,
terminal states are final, and any live job can fail or be cancelled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotrelay.models import TERMINAL_STATES, InvalidTransition, JobState, ensure_transition
from spotrelay.models.state import allowed_next

LIVE_STATES = [s for s in JobState if s not in TERMINAL_STATES]

# A job placed, launched and run; interrupted, recovered onto another pool, and finished there.
INTERRUPTED_THEN_FINISHED = [
    JobState.QUEUED,
    JobState.PLACING,
    JobState.LAUNCHING,
    JobState.RUNNING,
    JobState.RECOVERING,
    JobState.PLACING,
    JobState.LAUNCHING,
    JobState.RUNNING,
    JobState.SUCCEEDED,
]


def test_terminal_states_are_succeeded_failed_and_cancelled() -> None:
    # Given the state enum
    # When its terminal states are listed
    # Then they are exactly the three a job ends in
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == TERMINAL_STATES
    assert all(s.is_terminal for s in TERMINAL_STATES)
    assert not any(s.is_terminal for s in LIVE_STATES)


def test_interrupted_job_walks_its_lifecycle_to_success() -> None:
    # Given a job that is queued
    state = INTERRUPTED_THEN_FINISHED[0]

    # When each step of an interrupted-then-recovered run is applied
    for target in INTERRUPTED_THEN_FINISHED[1:]:
        state = ensure_transition(state, target)

    # Then every step is allowed and the job ends succeeded
    assert state is JobState.SUCCEEDED


@pytest.mark.parametrize(
    ("current", "target"),
    [
        pytest.param(JobState.PLACING, JobState.WAITING, id="no-feasible-pool"),
        pytest.param(JobState.WAITING, JobState.PLACING, id="retry-after-backoff"),
        pytest.param(JobState.LAUNCHING, JobState.PLACING, id="insufficient-capacity"),
        pytest.param(JobState.LAUNCHING, JobState.RECOVERING, id="lost-before-running"),
        pytest.param(JobState.RUNNING, JobState.PLACING, id="restart-after-user-code-failed"),
    ],
)
def test_other_documented_paths_are_allowed(current: JobState, target: JobState) -> None:
    # Given a job in `current`
    # When the scheduler moves it along a documented side path
    # Then the move is allowed
    assert ensure_transition(current, target) is target


@pytest.mark.parametrize("state", list(JobState), ids=str)
def test_repeated_transition_is_allowed(state: JobState) -> None:
    # Given a job already in `state` (including a terminal one)
    # When the same event is delivered again
    # Then applying it again is a no-op, not an error
    assert ensure_transition(state, state) is state


def test_succeeded_job_cannot_run_again() -> None:
    # Given a job that succeeded
    # When a late "running" event tries to move it back
    with pytest.raises(InvalidTransition) as caught:
        ensure_transition(JobState.SUCCEEDED, JobState.RUNNING)

    # Then the error says which move was refused and that nothing is allowed from there
    assert str(caught.value) == "job state SUCCEEDED cannot become RUNNING; allowed from SUCCEEDED: none (terminal)"
    assert caught.value.current is JobState.SUCCEEDED
    assert caught.value.target is JobState.RUNNING


def test_refused_move_from_a_live_state_lists_what_is_allowed() -> None:
    # Given a queued job
    # When something tries to mark it running without placing it
    with pytest.raises(InvalidTransition) as caught:
        ensure_transition(JobState.QUEUED, JobState.RUNNING)

    # Then the error lists the states a queued job may move to
    assert (
        str(caught.value) == "job state QUEUED cannot become RUNNING; allowed from QUEUED: CANCELLED, FAILED, PLACING"
    )


@pytest.mark.parametrize("end", [JobState.FAILED, JobState.CANCELLED], ids=str)
@pytest.mark.parametrize("state", LIVE_STATES, ids=str)
def test_any_live_job_can_fail_or_be_cancelled(state: JobState, end: JobState) -> None:
    # Given a live job
    # When it fails or is cancelled
    # Then the move is allowed
    assert ensure_transition(state, end) is end


@pytest.mark.parametrize("state", [s for s in LIVE_STATES if s is not JobState.RUNNING], ids=str)
def test_only_a_running_job_can_succeed(state: JobState) -> None:
    # Given a live job that is not running
    # When a success is reported for it
    # Then it is refused: nothing ran to succeed
    with pytest.raises(InvalidTransition):
        ensure_transition(state, JobState.SUCCEEDED)


@pytest.mark.parametrize("target", list(JobState), ids=str)
@pytest.mark.parametrize("terminal", sorted(TERMINAL_STATES), ids=str)
def test_nothing_leaves_a_terminal_state(terminal: JobState, target: JobState) -> None:
    # Given a finished job
    # When any other state is applied
    # Then it is refused; only the same state (a redelivery) passes
    if target is terminal:
        assert ensure_transition(terminal, target) is terminal
    else:
        with pytest.raises(InvalidTransition):
            ensure_transition(terminal, target)


@given(current=st.sampled_from(JobState), target=st.sampled_from(JobState))
def test_every_pair_either_moves_to_target_or_raises(current: JobState, target: JobState) -> None:
    # Given any pair of states
    # When the transition is checked
    outcome: JobState | InvalidTransition
    try:
        outcome = ensure_transition(current, target)
    except InvalidTransition as refused:
        outcome = refused

    if isinstance(outcome, InvalidTransition):
        # Then a refusal names the pair, was not a repeat, and is not in the allowed set
        assert (outcome.current, outcome.target) == (current, target)
        assert current != target
        assert target not in allowed_next(current)
    else:
        # Then an acceptance returns the target, is a repeat or an allowed move, and never moves a terminal state
        assert outcome is target
        assert current == target or target in allowed_next(current)
        if current.is_terminal:
            assert outcome is current


@given(path=st.lists(st.sampled_from(JobState), max_size=20))
def test_no_sequence_of_events_revives_a_finished_job(path: list[JobState]) -> None:
    # Given a job driven by any sequence of events, refused ones ignored
    state = JobState.QUEUED
    finished_as: JobState | None = None
    for target in path:
        # When each event is applied
        try:
            state = ensure_transition(state, target)
        except InvalidTransition:
            continue
        if finished_as is None and state.is_terminal:
            finished_as = state
    # Then once it reached a terminal state it stayed there
    if finished_as is not None:
        assert state is finished_as
