"""The instance metadata service (IMDSv2), as the agent needs it: tags, spot notices, the region.

IMDSv2 is a session protocol: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
returns a token, which every `GET` sends back as `X-aws-ec2-metadata-token`. The worker launch
template requires it (`HttpTokens: required`), so a GET without a valid token answers 401. The client
keeps one token, fetches a new one when 80 % of its TTL has passed, and once more on a 401 (the
service may forget tokens, e.g. across a stop/start).

Plain urllib with proxies disabled (an `http_proxy` in the environment must never see IMDS traffic)
and short timeouts: IMDS answers in milliseconds or not at all. The endpoint is configurable so
that tests and local runs point it at a stub on the loopback; the transport too (`Transport`: one
request, its status and body), so that a replay's simulated instances reach their IMDS in-process
without urllib's machinery on every poll.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spotrelay.field_problems import field_problems

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL_SECONDS = 21_600  # what IMDS accepts at most (6 h)
REFRESH_AT = 0.8  # fetch a new token when this share of its TTL has passed

INSTANCE_ACTION_PATH = "meta-data/spot/instance-action"
REBALANCE_PATH = "meta-data/events/recommendations/rebalance"
TAGS_PATH = "meta-data/tags/instance/"
REGION_PATH = "meta-data/placement/region"
INSTANCE_ID_PATH = "meta-data/instance-id"


class ImdsError(Exception):
    """IMDS did not answer, or answered something other than a value or 404."""


class InstanceAction(BaseModel):
    """`spot/instance-action`: the two-minute notice. `action` is terminate, stop or hibernate."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    action: str
    time: str = Field(description="when the action happens, ISO 8601 UTC")


class RebalanceRecommendation(BaseModel):
    """`events/recommendations/rebalance`: an elevated risk of interruption (no deadline)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    notice_time: str = Field(alias="noticeTime")


_Notice = TypeVar("_Notice", InstanceAction, RebalanceRecommendation)


class Transport(Protocol):
    """One HTTP request to IMDS: (status, body). Raises OSError when nothing answers in `timeout` (None: no
    bound)."""

    def __call__(self, method: str, url: str, headers: dict[str, str], timeout: float | None) -> tuple[int, str]: ...


def urllib_transport(opener: urllib.request.OpenerDirector) -> Transport:
    """A transport through a urllib opener (urllib's errors as statuses, or OSError)."""

    def send(method: str, url: str, headers: dict[str, str], timeout: float | None) -> tuple[int, str]:
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with opener.open(request, timeout=timeout) as response:
                return int(response.status), str(response.read().decode())
        except urllib.error.HTTPError as e:
            return e.code, ""
        except urllib.error.URLError as e:
            raise OSError(str(e.reason)) from e

    return send


class ImdsClient:
    """An IMDSv2 client: `get(path)` answers the value, or None for 404."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        token_ttl_seconds: int = MAX_TOKEN_TTL_SECONDS,
        timeout_seconds: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        transport: Transport | None = None,
    ) -> None:
        if not 1 <= token_ttl_seconds <= MAX_TOKEN_TTL_SECONDS:
            raise ValueError(f"token TTL must be 1..{MAX_TOKEN_TTL_SECONDS} seconds")
        self.endpoint = endpoint.rstrip("/")
        self.token_ttl_seconds = token_ttl_seconds
        self.timeout_seconds = timeout_seconds
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_fetched_at = 0.0
        # No proxy handler: IMDS is link-local and must never go through a proxy from the environment.
        # `transport`: another way there (the local runtime serves each simulated instance's IMDS in-process).
        self._send = transport or urllib_transport(urllib.request.build_opener(urllib.request.ProxyHandler({})))

    # --- the token ----------------------------------------------------------------------------------

    def token(self) -> str:
        """The current session token, fetched anew when 80 % of its TTL has passed."""
        age = self._monotonic() - self._token_fetched_at
        if self._token is None or age >= self.token_ttl_seconds * REFRESH_AT:
            self._token = self._fetch_token()
            self._token_fetched_at = self._monotonic()
        return self._token

    def _fetch_token(self) -> str:
        headers = {TTL_HEADER: str(self.token_ttl_seconds)}
        try:
            status, body = self._send("PUT", self.endpoint + TOKEN_PATH, headers, self.timeout_seconds)
        except OSError as e:
            raise ImdsError(f"IMDS token request to {self.endpoint} failed: {e}") from e
        if status != 200:
            raise ImdsError(f"IMDS token request to {self.endpoint} failed: HTTP {status}")
        return body

    # --- reads --------------------------------------------------------------------------------------

    def get(self, path: str) -> str | None:
        """GET `/latest/<path>`; None when IMDS answers 404 (no such value, e.g. no notice)."""
        url = f"{self.endpoint}/latest/{path.lstrip('/')}"
        for retry in (False, True):
            try:
                status, body = self._send("GET", url, {TOKEN_HEADER: self.token()}, self.timeout_seconds)
            except OSError as e:
                raise ImdsError(f"IMDS GET {path} failed: {e}") from e
            if status == 200:
                return body
            if status == 404:
                return None
            if status == 401 and not retry:
                self._token = None  # forgotten or expired: one new token, one more try
                continue
            raise ImdsError(f"IMDS GET {path}: HTTP {status}")
        raise ImdsError(f"IMDS GET {path}: 401 with a fresh token")  # pragma: no cover - the loop returns or raises

    def instance_action(self) -> InstanceAction | None:
        """The spot interruption notice, if one was issued."""
        body = self.get(INSTANCE_ACTION_PATH)
        return None if body is None else _parse(InstanceAction, body, INSTANCE_ACTION_PATH)

    def rebalance_recommendation(self) -> RebalanceRecommendation | None:
        body = self.get(REBALANCE_PATH)
        return None if body is None else _parse(RebalanceRecommendation, body, REBALANCE_PATH)

    def instance_tag(self, key: str) -> str | None:
        """An instance tag (the launch template enables instance tags in metadata)."""
        return self.get(TAGS_PATH + urllib.parse.quote(key, safe=":@+=.,_-"))

    def region(self) -> str | None:
        return self.get(REGION_PATH)

    def instance_id(self) -> str | None:
        return self.get(INSTANCE_ID_PATH)


def _parse(model: type[_Notice], body: str, path: str) -> _Notice:
    try:
        return model.model_validate(json.loads(body))
    except json.JSONDecodeError as e:
        raise ImdsError(f"IMDS {path}: not JSON ({e.msg})") from e
    except ValidationError as e:
        raise ImdsError(f"IMDS {path}: unexpected shape ({'; '.join(field_problems(e, at_most=1))})") from e
