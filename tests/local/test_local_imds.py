"""The replay's IMDS (spotrelay.local.imds) as an instance's agent sees it: through the real IMDSv2
client (spotrelay.agent.imds.ImdsClient) on a virtual clock. Calls that answer at once are made from
the test (the driver); a call that waits (a slow IMDS) runs as a process of the clock."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta

import pytest

from spotrelay.agent.imds import (
    MAX_TOKEN_TTL_SECONDS,
    TOKEN_HEADER,
    TTL_HEADER,
    ImdsClient,
    ImdsError,
    InstanceAction,
    RebalanceRecommendation,
)
from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.local.clock import VirtualClock
from spotrelay.local.imds import ENDPOINT, ImdsFault, InstanceMetadataService

from .conftest import START

INSTANCE = "i-0aaaaaaaaaaaaaaa1"
OTHER_INSTANCE = "i-0bbbbbbbbbbbbbbb2"


@pytest.fixture
def imds(clock: VirtualClock) -> InstanceMetadataService:
    """IMDS with two running instances: the job's (tagged with its job and attempt) and another one."""
    service = InstanceMetadataService(clock)
    service.register(
        INSTANCE,
        instance_type="g6.xlarge",
        availability_zone="us-east-1a",
        region="us-east-1",
        tags={TAG_JOB_ID: "job-7", TAG_ATTEMPT: "2"},
    )
    service.register(
        OTHER_INSTANCE, instance_type="g5.xlarge", availability_zone="us-east-1b", region="us-east-1", tags={}
    )
    return service


def client_of(
    imds: InstanceMetadataService,
    clock: VirtualClock,
    instance_id: str = INSTANCE,
    *,
    token_ttl_seconds: int = MAX_TOKEN_TTL_SECONDS,
) -> ImdsClient:
    """The instance's agent's client, as InstanceWorker builds it (its default 2 s timeout)."""
    return ImdsClient(
        ENDPOINT, token_ttl_seconds=token_ttl_seconds, monotonic=clock.monotonic, transport=imds.transport(instance_id)
    )


def raw(
    imds: InstanceMetadataService,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    instance_id: str = INSTANCE,
) -> tuple[int, str]:
    """(status, body) of one hand-made request from the instance, for what the client never sends."""
    request = urllib.request.Request(f"{ENDPOINT}{path}", method=method, headers=headers or {})
    try:
        with imds.opener(instance_id).open(request, timeout=2) as response:
            return int(response.status), str(response.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, ""


def token_for(imds: InstanceMetadataService, ttl: int, instance_id: str = INSTANCE) -> str:
    status, token = raw(imds, "PUT", "/latest/api/token", {TTL_HEADER: str(ttl)}, instance_id=instance_id)
    assert status == 200
    return token


# --- what an instance reads ----------------------------------------------------------------------------


def test_the_agent_reads_its_instance_and_its_tags(imds: InstanceMetadataService, clock: VirtualClock) -> None:
    # Given the job's instance
    client = client_of(imds, clock)
    # When its agent reads who it is, Then it gets its own id, region, placement and tags (keys with ':')
    assert client.instance_id() == INSTANCE
    assert client.region() == "us-east-1"
    assert client.get("meta-data/instance-type") == "g6.xlarge"
    assert client.get("meta-data/placement/availability-zone") == "us-east-1a"
    assert (client.instance_tag(TAG_JOB_ID), client.instance_tag(TAG_ATTEMPT)) == ("job-7", "2")
    # and a tag it does not have, or a path IMDS does not serve, is absent (404), not an error
    assert client.instance_tag("team") is None
    assert client.get("meta-data/no-such-thing") is None
    # and the other instance sees its own values, not these
    other = client_of(imds, clock, OTHER_INSTANCE)
    assert (other.instance_id(), other.get("meta-data/instance-type")) == (OTHER_INSTANCE, "g5.xlarge")
    assert other.instance_tag(TAG_JOB_ID) is None


def test_no_notice_until_the_market_gives_one_then_the_first_one_stays(
    imds: InstanceMetadataService, clock: VirtualClock
) -> None:
    # Given an instance with no notice: both notice paths answer 404 (the client's None)
    client = client_of(imds, clock)
    assert client.instance_action() is None
    assert client.rebalance_recommendation() is None
    assert raw(imds, "GET", "/latest/meta-data/spot/instance-action", {TOKEN_HEADER: token_for(imds, 60)})[0] == 404

    # When a rebalance recommendation, then the two-minute warning arrive
    imds.recommend_rebalance(INSTANCE, START + timedelta(minutes=10))
    imds.notice(INSTANCE, START + timedelta(minutes=12))
    # Then the agent reads both in the EC2 shapes
    assert client.rebalance_recommendation() == RebalanceRecommendation(notice_time="2026-11-30T00:10:00Z")
    assert client.instance_action() == InstanceAction(action="terminate", time="2026-11-30T00:12:00Z")
    assert raw(imds, "GET", "/latest/meta-data/spot/instance-action", {TOKEN_HEADER: token_for(imds, 60)}) == (
        200,
        '{"action": "terminate", "time": "2026-11-30T00:12:00Z"}',
    )

    # When a second notice comes for the same instance, Then the first one's time stays
    imds.notice(INSTANCE, START + timedelta(hours=1), action="stop")
    assert client.instance_action() == InstanceAction(action="terminate", time="2026-11-30T00:12:00Z")
    # and the other instance was never noticed
    assert client_of(imds, clock, OTHER_INSTANCE).instance_action() is None


def test_an_instance_imds_does_not_know_gets_no_token(imds: InstanceMetadataService, clock: VirtualClock) -> None:
    # Given an instance that was never registered (not running yet)
    client = client_of(imds, clock, "i-0notrunning000000")
    # When its agent reads, Then the token request fails: the agent is told IMDS did not answer
    with pytest.raises(ImdsError, match="token request"):
        client.instance_action()


# --- IMDSv2 sessions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 400),  # no TTL header
        ({TTL_HEADER: "abc"}, 400),
        ({TTL_HEADER: "0"}, 400),
        ({TTL_HEADER: "21601"}, 400),  # above the 6 h IMDS allows
        ({TTL_HEADER: "1"}, 200),
        ({TTL_HEADER: "21600"}, 200),
    ],
)
def test_a_token_is_given_only_for_a_ttl_of_1_to_21600_seconds(
    imds: InstanceMetadataService, headers: dict[str, str], expected: int
) -> None:
    status, body = raw(imds, "PUT", "/latest/api/token", headers)
    assert status == expected
    assert bool(body) is (expected == 200)  # a token only with a 200


def test_a_token_is_asked_for_with_put_only(imds: InstanceMetadataService) -> None:
    assert raw(imds, "GET", "/latest/api/token", {TTL_HEADER: "60"})[0] == 405


def test_a_get_needs_a_live_token_of_its_own_instance(imds: InstanceMetadataService, clock: VirtualClock) -> None:
    path = "/latest/meta-data/instance-id"
    # Given a token of the instance for 60 s
    token = token_for(imds, 60)
    # Then a GET without a token, or with a made-up one, is 401; with the token it is the value
    assert raw(imds, "GET", path)[0] == 401
    assert raw(imds, "GET", path, {TOKEN_HEADER: "not-a-token"})[0] == 401
    assert raw(imds, "GET", path, {TOKEN_HEADER: token}) == (200, INSTANCE)
    # and another instance's token does not open this instance's IMDS (nor this one that instance's)
    assert raw(imds, "GET", path, {TOKEN_HEADER: token_for(imds, 60, OTHER_INSTANCE)})[0] == 401
    assert raw(imds, "GET", path, {TOKEN_HEADER: token}, instance_id=OTHER_INSTANCE)[0] == 401

    # When 59 virtual seconds pass, Then it still opens it; once its 60 s are up, it is 401
    clock.advance_by(59)
    assert raw(imds, "GET", path, {TOKEN_HEADER: token}) == (200, INSTANCE)
    clock.advance_by(1)
    assert raw(imds, "GET", path, {TOKEN_HEADER: token})[0] == 401


def test_the_client_keeps_reading_across_its_tokens_lifetimes(
    imds: InstanceMetadataService, clock: VirtualClock
) -> None:
    # Given a client that asks for 100 s tokens
    client = client_of(imds, clock, token_ttl_seconds=100)
    assert client.instance_id() == INSTANCE
    first = client.token()
    # When a day of virtual time passes in 50 s polls
    for _ in range(24 * 3600 // 50):
        clock.advance_by(50)
        # Then every poll is answered: the client renews its token before IMDS would refuse it
        assert client.instance_id() == INSTANCE
    assert client.token() != first


# --- faults -----------------------------------------------------------------------------------------------


def test_an_error_fault_answers_its_status_for_its_window_only(
    imds: InstanceMetadataService, clock: VirtualClock
) -> None:
    # Given a client holding a token, and IMDS answering 503 from 60 s to 120 s from now
    client = client_of(imds, clock)
    assert client.instance_action() is None
    now = clock.monotonic()
    imds.add_fault(INSTANCE, ImdsFault(start=now + 60, end=now + 120, status=503))

    # Then before the window it answers; in it, each read is an ImdsError with the status
    clock.advance_by(59)
    assert client.instance_id() == INSTANCE
    clock.advance_by(1)
    with pytest.raises(ImdsError, match="HTTP 503"):
        client.instance_action()
    with pytest.raises(ImdsError, match="token request"):
        client_of(imds, clock).instance_id()  # a new session: even the token request fails
    # and the other instance's IMDS is not affected
    assert client_of(imds, clock, OTHER_INSTANCE).instance_id() == OTHER_INSTANCE
    # When the window ends, Then it answers again, with the same token
    clock.advance_by(60)
    assert client.instance_id() == INSTANCE


Outcome = tuple[str, float]  # (what the read gave, virtual seconds it took)


def read_in_a_process(clock: VirtualClock, read: Callable[[], object]) -> list[Outcome]:
    """Start `read` as a process of the clock (as the agent's loop is one); its outcome and how long it
    took land in the returned list once it ends."""
    outcomes: list[Outcome] = []

    def body() -> None:
        began = clock.monotonic()
        try:
            outcome = repr(read())
        except ImdsError as e:
            outcome = f"ImdsError: {e}"
        outcomes.append((outcome, round(clock.monotonic() - began, 6)))

    with clock.exclusive():
        clock.start_thread("agent", body)
    clock.wait_quiescent()
    return outcomes


def test_a_slow_imds_answers_late_on_the_virtual_clock(imds: InstanceMetadataService, clock: VirtualClock) -> None:
    # Given a client holding a token (client timeout 2 s), and IMDS answering 1.5 s late from now on
    client = client_of(imds, clock)
    client.token()
    imds.add_fault(INSTANCE, ImdsFault(start=clock.monotonic(), end=float("inf"), delay_seconds=1.5))

    # When the agent reads the notice path
    outcomes = read_in_a_process(clock, client.instance_id)
    # Then nothing comes back until 1.5 virtual seconds have passed, and then the value does
    assert outcomes == []
    clock.advance_by(1.4)
    assert outcomes == []
    clock.advance_by(0.1)
    assert outcomes == [(repr(INSTANCE), 1.5)]


def test_an_imds_slower_than_the_client_times_the_read_out(imds: InstanceMetadataService, clock: VirtualClock) -> None:
    # Given a client holding a token (client timeout 2 s), and IMDS answering 5 s late from now on
    client = client_of(imds, clock)
    client.token()
    imds.add_fault(INSTANCE, ImdsFault(start=clock.monotonic(), end=float("inf"), delay_seconds=5))

    # When the agent reads
    outcomes = read_in_a_process(clock, client.instance_id)
    clock.advance_by(10)
    # Then the read fails at the client's timeout (2 s), not when IMDS would have answered
    assert len(outcomes) == 1
    message, took = outcomes[0]
    assert message.startswith("ImdsError: IMDS GET meta-data/instance-id failed")
    assert "timed out" in message
    assert took == 2.0


def test_a_new_session_on_a_slow_imds_waits_for_the_token_too(
    imds: InstanceMetadataService, clock: VirtualClock
) -> None:
    # Given a client with no token yet, and IMDS answering 1 s late
    client = client_of(imds, clock)
    imds.add_fault(INSTANCE, ImdsFault(start=clock.monotonic(), end=float("inf"), delay_seconds=1))
    # When the agent reads, Then the read takes 2 s: the token's PUT and the GET are each 1 s late
    outcomes = read_in_a_process(clock, client.instance_id)
    clock.advance_by(5)
    assert outcomes == [(repr(INSTANCE), 2.0)]
