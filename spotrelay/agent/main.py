"""`spotrelay agent`: wire the agent to IMDS, DynamoDB, S3 and Step Functions, and run it.

Identity: `--job-id`/`--attempt`, or the instance's tags `spotrelay:job-id` / `spotrelay:attempt`
read from IMDS (the launch template enables instance tags in metadata). Names: `--bucket`/`--table`
or `SPOTRELAY_BUCKET`/`SPOTRELAY_TABLE` (the unit's environment; not secrets). Region: `--region`,
`AWS_REGION`/`AWS_DEFAULT_REGION`, else IMDS `placement/region`. The task token is read from the
attempt record in DynamoDB, never from user data. Credentials: with `--vend-function`
(`SPOTRELAY_VEND_FUNCTION`, the unit's), the job's own, from the vend function (spotrelay.aws.vend;
asked again for a minute or two while Launch has not recorded the instance yet, and refreshed by botocore
before they expire) for DynamoDB, S3, Step Functions and the log lines (vend creates the attempt's
stream; the lines logged before vend answered are kept and shipped then); the instance profile's
(boto3's default chain) only for asking vend. Without it, the default chain for everything (local runs).
`AWS_ENDPOINT_URL` points every client at another endpoint (moto in tests). With `--job-user` (the
unit's `spotrelay-job`) an agent running as root runs the job as that user, and refuses to start if
there is no such user; an agent that is not root runs the job as itself. Logs:
JSON lines on stdout, and with `--log-group` (`SPOTRELAY_AGENT_LOG_GROUP`) in CloudWatch Logs as well,
in the attempt's stream (spotrelay.agent.logs).
"""

from __future__ import annotations

import logging
import os
import pwd
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from spotrelay.agent.agent import STANDBY_WAIT_SECONDS, Agent, AgentError, AgentSettings
from spotrelay.agent.imds import DEFAULT_ENDPOINT, ImdsClient, ImdsError
from spotrelay.agent.logs import AGENT_DONE, EarlyLines, JobLogger, configure_json_logging, ship_to_cloudwatch
from spotrelay.agent.runner import JobUser
from spotrelay.agent.state import DEFAULT_STATE_DIR
from spotrelay.clock import SYSTEM_CLOCK, WaitingClock
from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.control.vend import attempt_log_stream

if TYPE_CHECKING:
    import boto3
    from botocore.config import Config

IDENTITY_WAIT_SECONDS = 60.0
CREDENTIALS_WAIT_SECONDS = 120.0


class AgentOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str | None = None
    attempt: int | None = None
    bucket: str
    table: str
    imds_endpoint: str = DEFAULT_ENDPOINT
    region: str | None = None
    poll_seconds: float = 5.0
    heartbeat_seconds: float | None = None  # None: paced by the Run task's heartbeat timeout (the attempt record)
    migrate_poll_seconds: float = 60.0
    standby_wait_seconds: float = STANDBY_WAIT_SECONDS
    state_dir: Path = DEFAULT_STATE_DIR
    checkpoint_dir: Path | None = None
    previous_checkpoint_wait_seconds: float = 150.0
    log_group: str | None = None  # CloudWatch Logs group for the agent's lines (spotrelay.agent.logs)
    vend_function: str | None = None  # where the job's credentials come from (None: the default chain)
    job_user: str | None = None  # who the job runs as, when the agent is root (the unit: JOB_USER)


class IdentityError(Exception):
    pass


def resolve_job_user(
    name: str | None, *, geteuid: Callable[[], int] = os.geteuid, getpwnam: Callable[[str], Any] = pwd.getpwnam
) -> JobUser | None:
    """The job's user when the agent is root; None otherwise (nothing to drop). Raises IdentityError if the
    agent is root and the user does not exist (a job must not run as root by accident)."""
    if name is None or geteuid() != 0:
        return None
    try:
        entry = getpwnam(name)
    except KeyError:
        raise IdentityError(f"no user {name!r} to run the job as (user data creates it)") from None
    if entry.pw_uid == 0:
        raise IdentityError(f"the job user {name!r} is root")
    return JobUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def wait_for_credentials(
    fetch: Callable[[], dict[str, str]],
    wait_seconds: float = CREDENTIALS_WAIT_SECONDS,
    clock: WaitingClock = SYSTEM_CLOCK,
) -> dict[str, str]:
    """The job's first credentials from vend, asked again while it says "not yet" (or cannot be reached)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.control.vend import VendNotYet

    deadline = clock.monotonic() + wait_seconds
    while True:
        try:
            return fetch()
        except (VendNotYet, BotoCoreError, ClientError):
            if clock.monotonic() >= deadline:
                raise
        clock.sleep(5.0)


def identity_from_tags(
    imds: ImdsClient, wait_seconds: float = IDENTITY_WAIT_SECONDS, clock: WaitingClock = SYSTEM_CLOCK
) -> tuple[str, int]:
    """(job id, attempt) from the instance's tags; retried for a while (IMDS may lag at boot)."""
    deadline = clock.monotonic() + wait_seconds
    while True:
        problem: str
        try:
            job_id, attempt = imds.instance_tag(TAG_JOB_ID), imds.instance_tag(TAG_ATTEMPT)
            if job_id and attempt and attempt.strip().isdigit():
                return job_id.strip(), int(attempt)
            problem = f"instance tags {TAG_JOB_ID}={job_id!r}, {TAG_ATTEMPT}={attempt!r}"
        except ImdsError as e:
            problem = str(e)
        if clock.monotonic() >= deadline:
            raise IdentityError(f"no job identity in IMDS ({problem}); pass --job-id and --attempt")
        clock.sleep(2.0)


def run_agent(options: AgentOptions) -> int:
    """Run the agent to the end; the process exit code (non-zero: systemd restarts the agent)."""
    import boto3
    from botocore.config import Config

    configure_json_logging()
    imds = ImdsClient(options.imds_endpoint)
    if options.job_id is not None and options.attempt is not None:
        job_id, attempt = options.job_id, options.attempt
    else:
        try:
            job_id, attempt = identity_from_tags(imds)
        except IdentityError as e:
            logging.getLogger("spotrelay.agent").error("no job identity", extra={"error": str(e)})
            return 2
    log = JobLogger(job_id, attempt)
    try:
        job_user = resolve_job_user(options.job_user)
    except IdentityError as e:
        log.error("not starting the job", extra={"reason": str(e)})
        return 2
    region = options.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region is None:
        try:
            region = imds.region()
        except ImdsError as e:
            log.warning("no region from IMDS", extra={"error": str(e)})
    config = Config(region_name=region, retries={"mode": "standard", "max_attempts": 10})
    session = boto3.session.Session()
    early = EarlyLines.attach() if options.log_group else None
    shipper = None
    try:
        job_session = _job_session(options, log, region, session, config)
        if job_session is None:
            return 1  # the lines so far stay in the journal: without the job's credentials none ships
        if options.log_group:
            stream = attempt_log_stream(job_id, attempt)
            try:
                # One quick attempt per call: watchtower retries a batch itself (5 times), and a batch that
                # blocked for minutes would queue the lines in memory next to the training process.
                quick = Config(connect_timeout=3, read_timeout=5, retries={"mode": "standard", "max_attempts": 1})
                logs = job_session.client("logs", config=config.merge(quick))
                # With vend the stream is vend's to create: the job's credentials may only write to it
                shipper = ship_to_cloudwatch(
                    logs, options.log_group, stream, create_stream=options.vend_function is None
                )
            except ImportError as e:  # an agent installed without the [agent] extra still runs the job
                log.warning("log lines stay in the journal: no watchtower", extra={"error": str(e)})
        if early is not None:
            early.hand_to(shipper)
            early = None
        return _run(options, log, imds, job_id, attempt, region, job_session, config, job_user)
    finally:
        if early is not None:
            early.hand_to(None)
        if shipper is not None:
            shipper.close()  # what is still queued goes out before the agent exits


def _job_session(
    options: AgentOptions, log: JobLogger, region: str | None, session: boto3.session.Session, config: Config
) -> boto3.session.Session | None:
    """The session the job's records, checkpoints and task token are reached with (None: refused)."""
    if options.vend_function is None:
        return session
    from botocore.exceptions import BotoCoreError, ClientError

    from spotrelay.aws.vend import VendClient, vended_session
    from spotrelay.control.vend import VendRefused

    if region is None:
        log.error("no region: cannot ask vend for the job's credentials")
        return None
    vend = VendClient(
        instance_session=session,
        lambda_client=session.client("lambda", config=config),
        function_name=options.vend_function,
        region=region,
        sts_endpoint_url=os.environ.get("AWS_ENDPOINT_URL"),
    )
    try:
        first = wait_for_credentials(vend.fetch)
    except (VendRefused, BotoCoreError, ClientError) as e:
        log.error("no credentials for the job", extra={"refusal": type(e).__name__, "error": str(e)[:500]})
        return None
    log.info("job credentials vended", extra={"expires": first.get("expiry_time")})
    return vended_session(vend.fetch, region, first, models_from=session)


def _run(
    options: AgentOptions,
    log: JobLogger,
    imds: ImdsClient,
    job_id: str,
    attempt: int,
    region: str | None,
    session: boto3.session.Session,
    config: Config,
    job_user: JobUser | None,
) -> int:
    from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
    from spotrelay.aws.store import DynamoJobStore
    from spotrelay.aws.task_tokens import StepFunctionsTaskTokens

    agent = Agent(
        job_id=job_id,
        attempt=attempt,
        store=DynamoJobStore(options.table, session.client("dynamodb", config=config)),
        storage=S3CheckpointStorage(session.client("s3", config=config), options.bucket),
        tokens=StepFunctionsTaskTokens(session.client("stepfunctions", config=config)),
        metadata=imds,
        settings=AgentSettings(
            state_dir=options.state_dir,
            poll_seconds=options.poll_seconds,
            heartbeat_seconds=options.heartbeat_seconds,
            migrate_poll_seconds=options.migrate_poll_seconds,
            standby_wait_seconds=options.standby_wait_seconds,
            checkpoint_dir=options.checkpoint_dir,
            previous_checkpoint_wait_seconds=options.previous_checkpoint_wait_seconds,
            job_user=job_user,
        ),
    )

    # The handler only writes the signal to a pipe: it interrupts the main thread anywhere, maybe inside a
    # lock that logging (the CloudWatch handler's queue), an Event or Thread.start needs, and those locks
    # are not reentrant. A thread started now does the rest.
    readable, writable = os.pipe()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        os.write(writable, bytes([signum]))

    def stop_on_signal() -> None:
        signum = os.read(readable, 1)[0]
        log.info("agent signalled: leaving the job running", extra={"signal": signal.Signals(signum).name})
        agent.stop()

    threading.Thread(target=stop_on_signal, name="agent-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "agent starting",
        extra={"bucket": options.bucket, "table": options.table, "region": region, "state_dir": str(options.state_dir)},
    )
    try:
        result = agent.run()
    except AgentError as e:
        log.error("agent cannot go on", extra={"error": str(e)})
        return 1
    except Exception:
        log.exception("agent failed")
        return 1
    log.info(
        AGENT_DONE,
        extra={
            "outcome": result.outcome.kind if result.outcome is not None else "detached",
            "already_reported": result.already_reported,
        },
    )
    return 0
