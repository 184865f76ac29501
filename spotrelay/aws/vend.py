"""Both ends of the token vending machine (spotrelay.control.vend) on boto3.

The agent's end: `signed_identity(credentials, region, audience)` signs the fixed request
`POST / Action=GetCallerIdentity&Version=2011-06-15` to the regional STS endpoint with the instance
profile's credentials (SigV4, which signs every header it is given, the audience header
`X-Spotrelay-Vend: <Vend function name>` too) and returns its headers. `vended_session(...)` invokes
Vend with them and gives a boto3 session whose credentials are the job's, refreshed by botocore
(`RefreshableCredentials`: 15 minutes before they expire, and at the latest 10) by asking Vend again.

Vend's end: `StsCallerIdentity.caller_arn(headers)` checks the headers (only the names SigV4 needs,
bounded, the audience header signed and equal to this function's name) and sends the same body with
them to STS through its own client, which names the one endpoint it goes to: the caller chooses
neither the host nor the action. STS checks the signature and answers with the signer's ARN. A signed
request lives 15 minutes (SigV4), and only ever proves the identity of whoever signed it.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import TYPE_CHECKING, Any

import boto3
import botocore.session
from botocore import UNSIGNED
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import CredentialProvider, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import ClientError

from spotrelay.control.vend import JobGrant, VendNotYet, VendRefused, attempt_log_stream

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

AUDIENCE_HEADER = "X-Spotrelay-Vend"
IDENTITY_BODY = "Action=GetCallerIdentity&Version=2011-06-15"
CONTENT_TYPE = "application/x-www-form-urlencoded; charset=utf-8"
SIGNED_HEADER_NAMES = frozenset(
    name.lower() for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token", "Content-Type", AUDIENCE_HEADER)
)
MAX_HEADER_CHARS = 8192  # an instance profile's session token is ~1.3 KB
_SIGNED_HEADERS = re.compile(r"SignedHeaders=([a-z0-9;-]+)")
REFUSALS = {cls.__name__: cls for cls in (VendRefused, VendNotYet)}


def sts_endpoint(region: str) -> str:
    return f"https://sts.{region}.amazonaws.com"


def signed_identity(
    credentials: ReadOnlyCredentials, region: str, audience: str, endpoint: str | None = None
) -> dict[str, str]:
    """The headers of a GetCallerIdentity request signed with `credentials`, for Vend `audience`."""
    request = AWSRequest(
        method="POST",
        url=(endpoint or sts_endpoint(region)).rstrip("/") + "/",
        data=IDENTITY_BODY,
        headers={"Content-Type": CONTENT_TYPE, AUDIENCE_HEADER: audience},
    )
    SigV4Auth(credentials, "sts", region).add_auth(request)
    return {name: str(value) for name, value in request.headers.items()}


def checked_identity_headers(headers: Any, audience: str) -> dict[str, str]:
    """The caller's signed headers, if they are only what a signed GetCallerIdentity for `audience` needs."""
    if not isinstance(headers, Mapping) or len(headers) > len(SIGNED_HEADER_NAMES):
        raise VendRefused("the identity is not a map of the signed request's headers")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or name.lower() not in SIGNED_HEADER_NAMES:
            raise VendRefused(f"unexpected header in the identity: {str(name)[:40]!r}")
        if not isinstance(value, str) or len(value) > MAX_HEADER_CHARS:
            raise VendRefused(f"header {name} of the identity is not a short text")
        checked[name.lower()] = value
    signed = _SIGNED_HEADERS.search(checked.get("authorization", ""))
    if signed is None or AUDIENCE_HEADER.lower() not in signed[1].split(";"):
        raise VendRefused(f"the identity is not signed for Vend (no signed {AUDIENCE_HEADER} header)")
    if checked.get(AUDIENCE_HEADER.lower()) != audience:
        raise VendRefused("the identity was signed for another Vend function")
    return checked


class StsCallerIdentity:
    """Vend's side: who signed a GetCallerIdentity request, according to STS."""

    def __init__(self, region: str, client: Any = None, endpoint_url: str | None = None) -> None:
        # Unsigned: the request goes out with the caller's signature, never this function's own. The regional
        # endpoint, which the agent signs for (`AWS_ENDPOINT_URL` instead, when both point at moto).
        self.client = client or boto3.client(
            "sts",
            region_name=region,
            endpoint_url=endpoint_url or sts_endpoint(region),
            config=Config(signature_version=UNSIGNED),
        )

    def caller_arn(self, headers: Mapping[str, str]) -> str:
        def as_signed(request: AWSRequest, **kwargs: Any) -> None:
            for name in list(request.headers.keys()):
                del request.headers[name]
            for name, value in headers.items():
                request.headers[name] = value
            request.data = IDENTITY_BODY.encode()

        handler_id = f"spotrelay-vend-{id(headers)}"
        event = "request-created.sts.GetCallerIdentity"
        self.client.meta.events.register(event, as_signed, unique_id=handler_id)
        try:
            answer = self.client.get_caller_identity()
        except ClientError as e:
            raise VendRefused(f"STS did not accept the identity: {e.response.get('Error', {}).get('Code')}") from None
        finally:
            self.client.meta.events.unregister(event, unique_id=handler_id)
        return str(answer["Arn"])


class StsJobRole:
    """Sessions of JobRole, each narrowed to one job (spotrelay.control.vend.JobGrant)."""

    def __init__(self, role_arn: str, client: Any = None) -> None:
        self.role_arn = role_arn
        self.client = client or boto3.client("sts")

    def assume(self, grant: JobGrant) -> dict[str, str]:
        """The job's credentials, as botocore's credential metadata (`expiry_time` in ISO 8601)."""
        answer = self.client.assume_role(
            RoleArn=self.role_arn,
            RoleSessionName=grant.session_name,
            DurationSeconds=grant.duration_seconds,
            Policy=json.dumps(grant.session_policy, separators=(",", ":")),
            Tags=[{"Key": key, "Value": value} for key, value in sorted(grant.session_tags.items())],
        )
        credentials = answer["Credentials"]
        return {
            "access_key": credentials["AccessKeyId"],
            "secret_key": credentials["SecretAccessKey"],
            "token": credentials["SessionToken"],
            "expiry_time": credentials["Expiration"].astimezone(UTC).isoformat(),
        }


class AgentLogStreams:
    """The attempts' streams in the agents' log group: vend makes each before the agent writes to it (the
    job's credentials may write to their job's streams, not create them)."""

    def __init__(self, log_group_arn: str, client: Any = None) -> None:
        # arn:<partition>:logs:<region>:<account>:log-group:<name>
        self.log_group = log_group_arn.split(":log-group:", 1)[1]
        self.client = client or boto3.client("logs")

    def ensure(self, job_id: str, attempt: int) -> str:
        """The attempt's stream, made if it is not there yet; returns its name."""
        stream = attempt_log_stream(job_id, attempt)
        # A refresh, or a restarted agent: the same stream, there already
        with contextlib.suppress(self.client.exceptions.ResourceAlreadyExistsException):
            self.client.create_log_stream(logGroupName=self.log_group, logStreamName=stream)
        return stream


# --- the agent's end ---------------------------------------------------------------------------------


class VendClient:
    """Asks Vend for this instance's job credentials, proving who it is with the instance's own session."""

    def __init__(
        self,
        *,
        instance_session: boto3.session.Session,
        lambda_client: LambdaClient,
        function_name: str,
        region: str,
        sts_endpoint_url: str | None = None,
    ) -> None:
        self.instance_session = instance_session
        self.lambda_client = lambda_client
        self.function_name = function_name
        self.region = region
        self.sts_endpoint_url = sts_endpoint_url

    def fetch(self) -> dict[str, str]:
        """The job's credential metadata; raises VendNotYet / VendRefused with Vend's reason."""
        own = self.instance_session.get_credentials()
        if own is None:
            raise VendRefused("this instance has no credentials of its own (no instance profile)")
        headers = signed_identity(own.get_frozen_credentials(), self.region, self.function_name, self.sts_endpoint_url)
        answer = self.lambda_client.invoke(
            FunctionName=self.function_name, Payload=json.dumps({"identity": headers}).encode()
        )
        payload = json.loads(answer["Payload"].read() or b"null")
        if answer.get("FunctionError"):
            error = payload if isinstance(payload, dict) else {}
            refusal = REFUSALS.get(str(error.get("errorType")), VendRefused)
            raise refusal(str(error.get("errorMessage", "Vend failed"))[:500])
        credentials: dict[str, str] = payload["credentials"]
        return credentials


class _VendedProvider(CredentialProvider):
    METHOD = "spotrelay-vend"
    CANONICAL_NAME = "spotrelay-vend"

    def __init__(self, credentials: RefreshableCredentials) -> None:
        super().__init__()
        self.credentials = credentials

    def load(self) -> RefreshableCredentials:
        return self.credentials


def vended_session(
    fetch: Callable[[], dict[str, str]],
    region: str | None,
    first: dict[str, str] | None = None,
    models_from: boto3.session.Session | None = None,
) -> boto3.session.Session:
    """A boto3 session on the job's credentials (`first`, else fetched now), refreshed with `fetch`;
    with the service models `models_from` has loaded already (a new session would read and decode them
    again for every client it makes)."""
    credentials = RefreshableCredentials.create_from_metadata(
        metadata=first if first is not None else fetch(), refresh_using=fetch, method=_VendedProvider.METHOD
    )
    core = botocore.session.Session()
    if models_from is not None:
        core.register_component("data_loader", models_from._session.get_component("data_loader"))
    core.get_component("credential_provider").insert_before("env", _VendedProvider(credentials))
    return boto3.session.Session(botocore_session=core, region_name=region)
