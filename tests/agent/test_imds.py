"""The IMDSv2 client against the stub: tokens, refresh, 404s, tags, notices."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from spotrelay.agent.imds import (
    INSTANCE_ACTION_PATH,
    TOKEN_HEADER,
    TTL_HEADER,
    ImdsClient,
    ImdsError,
    InstanceAction,
    RebalanceRecommendation,
)
from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID

from .imds_stub import ImdsStub


def status(request: urllib.request.Request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_stub_enforces_imdsv2(imds: ImdsStub) -> None:
    # A token request without its TTL header is refused, a GET without a token is 401, with one it is 200
    assert status(urllib.request.Request(f"{imds.endpoint}/latest/api/token", method="PUT")) == 400
    assert status(urllib.request.Request(f"{imds.endpoint}/latest/meta-data/instance-id")) == 401
    token_request = urllib.request.Request(
        f"{imds.endpoint}/latest/api/token", method="PUT", headers={TTL_HEADER: "60"}
    )
    with urllib.request.urlopen(token_request, timeout=2) as response:
        token = response.read().decode()
    assert (
        status(urllib.request.Request(f"{imds.endpoint}/latest/meta-data/instance-id", headers={TOKEN_HEADER: token}))
        == 200
    )


def test_the_client_reads_tags_and_notices_with_one_token(imds: ImdsStub) -> None:
    # Given an instance with its job's tags and no notice yet
    imds.tags = {TAG_JOB_ID: "job-7", TAG_ATTEMPT: "3"}
    client = ImdsClient(imds.endpoint)

    # Then the tags are read, the notices are absent (404), the region is known
    assert (client.instance_tag(TAG_JOB_ID), client.instance_tag(TAG_ATTEMPT)) == ("job-7", "3")
    assert client.instance_tag("spotrelay:missing") is None
    assert client.instance_action() is None
    assert client.rebalance_recommendation() is None
    assert client.region() == "us-east-1"

    # When the notices arrive, Then they are parsed
    imds.arm_interruption("stop", "2026-11-30T12:02:00Z")
    imds.arm_rebalance("2026-11-30T11:59:00Z")
    assert client.instance_action() == InstanceAction(action="stop", time="2026-11-30T12:02:00Z")
    assert client.rebalance_recommendation() == RebalanceRecommendation(notice_time="2026-11-30T11:59:00Z")
    # and all of it took one token, and no request was refused
    assert imds.token_requests == 1
    assert imds.rejected == []


def test_the_token_is_renewed_before_its_ttl_runs_out(imds: ImdsStub) -> None:
    # Given a client with 100 s tokens and a clock the test moves
    now = [1000.0]
    client = ImdsClient(imds.endpoint, token_ttl_seconds=100, monotonic=lambda: now[0])
    client.instance_action()

    # When 70 s pass, Then the token is still used; after 80 s (80 % of its TTL), a new one is fetched
    now[0] += 70
    client.instance_action()
    assert imds.token_requests == 1
    now[0] += 10
    client.instance_action()
    assert imds.token_requests == 2


def test_a_forgotten_token_is_replaced_once(imds: ImdsStub) -> None:
    # Given a client whose token IMDS no longer knows
    client = ImdsClient(imds.endpoint)
    client.instance_action()
    imds.revoke_tokens()

    # When it reads again, Then the 401 makes it fetch a new token and the read succeeds
    assert client.get(INSTANCE_ACTION_PATH) is None
    assert imds.token_requests == 2
    assert (f"/latest/{INSTANCE_ACTION_PATH}", 401) in imds.rejected


def test_an_unreachable_or_garbled_imds_is_an_imds_error(imds: ImdsStub) -> None:
    with pytest.raises(ImdsError):
        ImdsClient("http://127.0.0.1:9", timeout_seconds=0.5).instance_action()
    client = ImdsClient(imds.endpoint)
    imds.instance_action = {"no": "action"}
    with pytest.raises(ImdsError, match="unexpected shape"):
        client.instance_action()


def test_a_token_ttl_outside_what_imds_accepts_is_refused() -> None:
    with pytest.raises(ValueError, match=r"1\.\.21600"):
        ImdsClient(token_ttl_seconds=21601)
