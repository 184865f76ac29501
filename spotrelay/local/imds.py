"""The instance metadata service of every simulated instance, as amazon-ec2-metadata-mock serves one.

Each instance the local market starts is registered here with its id, type, zone, region and tags; the
replay posts its spot notices and rebalance recommendations here, and the instance's agent reads them
with the real `ImdsClient` (spotrelay.agent.imds) through `opener(instance_id)`: a urllib opener
whose handler answers in-process, so the client's IMDSv2 session (PUT a token, send it back, a new
one on 401) and its parsing run as on EC2, at no socket's cost.

What it answers (IMDSv2 only, as the worker launch template requires, `HttpTokens: required`):

    PUT /latest/api/token                        a token for the TTL asked (1..21600 s), else 400
    GET /latest/meta-data/instance-id            i-...
    GET /latest/meta-data/instance-type          g6.xlarge
    GET /latest/meta-data/placement/region       us-east-1
    GET /latest/meta-data/placement/availability-zone
    GET /latest/meta-data/tags/instance/<key>    an instance tag (tags in metadata are on)
    GET /latest/meta-data/spot/instance-action   {"action": "terminate", "time": "..."} once noticed, else 404
    GET /latest/meta-data/events/recommendations/rebalance   {"noticeTime": "..."} once recommended, else 404

A GET without a token, or with one that expired or belongs to another instance, is 401. Faults a
scenario injects (spotrelay.local.faults): answers `delay_seconds` late on the instance's clock (a
a client timeout when that is as long as the client's timeout or longer), or with HTTP `status` (a 5xx) instead.
Shapes: the EC2 User Guide, "Instance metadata categories" and "Spot Instance interruption notices".
"""

from __future__ import annotations

import email.message
import io
import itertools
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
import urllib.response
from dataclasses import dataclass, field
from datetime import datetime

from spotrelay.agent.imds import MAX_TOKEN_TTL_SECONDS, TOKEN_HEADER, TTL_HEADER, Transport
from spotrelay.clock import WaitingClock

ENDPOINT = "http://169.254.169.254"  # what the agent's client is told; nothing listens there


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ImdsFault:
    """IMDS answers late, or with an error status, from `start` until `end` (clock.monotonic())."""

    start: float
    end: float
    delay_seconds: float = 0.0
    status: int | None = None


@dataclass
class InstanceMetadataRecord:
    instance_id: str
    instance_type: str
    availability_zone: str
    region: str
    tags: dict[str, str]
    instance_action: dict[str, str] | None = None
    rebalance: dict[str, str] | None = None
    faults: list[ImdsFault] = field(default_factory=list)


class InstanceMetadataService:
    """IMDS for every simulated instance (see the module docstring)."""

    def __init__(self, clock: WaitingClock) -> None:
        self.clock = clock
        self.instances: dict[str, InstanceMetadataRecord] = {}
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (instance id, expires at monotonic)
        self._serial = itertools.count(1)

    # --- what the replay does ------------------------------------------------------------------------

    def register(
        self, instance_id: str, *, instance_type: str, availability_zone: str, region: str, tags: dict[str, str]
    ) -> InstanceMetadataRecord:
        record = InstanceMetadataRecord(instance_id, instance_type, availability_zone, region, dict(tags))
        self.instances[instance_id] = record
        return record

    def notice(self, instance_id: str, action_time: datetime, action: str = "terminate") -> None:
        """The two-minute warning: `spot/instance-action` answers from now on (the first notice stays)."""
        record = self.instances.get(instance_id)
        if record is not None and record.instance_action is None:
            record.instance_action = {"action": action, "time": _iso(action_time)}

    def recommend_rebalance(self, instance_id: str, notice_time: datetime) -> None:
        record = self.instances.get(instance_id)
        if record is not None:
            record.rebalance = {"noticeTime": _iso(notice_time)}

    def add_fault(self, instance_id: str, fault: ImdsFault) -> None:
        record = self.instances.get(instance_id)
        if record is not None:
            record.faults.append(fault)

    def transport(self, instance_id: str) -> Transport:
        """This instance's IMDS in-process, for `ImdsClient(transport=...)`: what `request` answers."""

        def send(method: str, url: str, headers: dict[str, str], timeout: float | None) -> tuple[int, str]:
            lowered = {k.lower(): v for k, v in headers.items()}
            return self.request(instance_id, method, urllib.parse.urlsplit(url).path, lowered, timeout)

        return send

    def request(
        self, instance_id: str, method: str, path: str, headers: dict[str, str], timeout: float | None
    ) -> tuple[int, str]:
        """One request from the instance, after any injected delay: (HTTP status, body). TimeoutError, on
        the clock, when the delay reaches `timeout`."""
        delay = self.delay(instance_id)
        if delay > 0:
            if timeout is not None and delay >= timeout:
                self.clock.sleep(timeout)
                raise TimeoutError("timed out")
            self.clock.sleep(delay)
        return self.answer(instance_id, method, path, headers)

    def opener(self, instance_id: str) -> urllib.request.OpenerDirector:
        """A urllib opener that reaches this instance's IMDS (what `transport` answers, through urllib)."""
        opener = urllib.request.OpenerDirector()
        opener.add_handler(_Handler(self, instance_id))
        opener.add_handler(urllib.request.HTTPErrorProcessor())
        opener.add_handler(urllib.request.HTTPDefaultErrorHandler())
        return opener

    # --- answering -----------------------------------------------------------------------------------

    def answer(self, instance_id: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        """(HTTP status, body) of one request from the instance."""
        record = self.instances.get(instance_id)
        if record is None:
            return 404, ""
        now = self.clock.monotonic()
        fault = next((f for f in record.faults if f.start <= now < f.end and f.status is not None), None)
        if fault is not None and fault.status is not None:
            return fault.status, "simulated IMDS error"
        if path == "/latest/api/token":
            if method != "PUT":
                return 405, ""
            try:
                ttl = int(headers.get(TTL_HEADER.lower(), ""))
            except ValueError:
                return 400, ""
            if not 1 <= ttl <= MAX_TOKEN_TTL_SECONDS:
                return 400, ""
            # unguessable, as IMDS's are (`local up` serves every instance on one port); expired ones forgotten
            token = f"{next(self._serial)}-{secrets.token_urlsafe(24)}"
            self._tokens = {t: owner for t, owner in self._tokens.items() if owner[1] > now}
            self._tokens[token] = (instance_id, now + ttl)
            return 200, token
        owner = self._tokens.get(headers.get(TOKEN_HEADER.lower(), ""))
        if method != "GET" or owner is None or owner[0] != instance_id or owner[1] <= now:
            return 401, ""
        value = self._value(record, path.removeprefix("/latest/"))
        return (404, "") if value is None else (200, value)

    def delay(self, instance_id: str) -> float:
        record = self.instances.get(instance_id)
        if record is None:
            return 0.0
        now = self.clock.monotonic()
        return max((f.delay_seconds for f in record.faults if f.start <= now < f.end), default=0.0)

    @staticmethod
    def _value(record: InstanceMetadataRecord, path: str) -> str | None:
        fixed = {
            "meta-data/instance-id": record.instance_id,
            "meta-data/instance-type": record.instance_type,
            "meta-data/placement/region": record.region,
            "meta-data/placement/availability-zone": record.availability_zone,
        }
        if path in fixed:
            return fixed[path]
        if path.startswith("meta-data/tags/instance/"):
            return record.tags.get(urllib.parse.unquote(path.removeprefix("meta-data/tags/instance/")))
        if path == "meta-data/spot/instance-action" and record.instance_action is not None:
            return json.dumps(record.instance_action)
        if path == "meta-data/events/recommendations/rebalance" and record.rebalance is not None:
            return json.dumps(record.rebalance)
        return None


class _Handler(urllib.request.BaseHandler):
    def __init__(self, service: InstanceMetadataService, instance_id: str) -> None:
        self.service = service
        self.instance_id = instance_id

    def http_open(self, request: urllib.request.Request) -> urllib.response.addinfourl:
        send = self.service.transport(self.instance_id)
        try:
            status, body = send(
                request.get_method(), request.full_url, dict(request.header_items()), getattr(request, "timeout", None)
            )
        except TimeoutError as e:
            raise urllib.error.URLError(e) from e
        message = email.message.Message()
        message["Content-Type"] = "text/plain"
        response = urllib.response.addinfourl(io.BytesIO(body.encode()), message, request.full_url, status)
        response.msg = "OK" if status == 200 else "error"  # type: ignore[attr-defined]
        return response
