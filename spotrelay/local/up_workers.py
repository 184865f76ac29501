"""`spotrelay local up`'s instances: a real `spotrelay agent` process on each one the control plane launches.

The stack runs in moto, so an instance is only a record there. For every instance launched with the
job's tags (`spotrelay:job-id`, `spotrelay:attempt`), this starts what its user data starts on EC2, as a
process of this machine: `spotrelay agent` with the instance's IMDS, in a scratch directory that stands
for the instance (`<root>/<instance id>/`: the agent's state dir and the job's checkpoint dir). The agent
learns its job from the instance's tags in IMDS, asks the vend function for the job's credentials with the
instance profile's (an AssumeRole of the worker role named after the instance, as EC2 names the session),
restores the job's newest checkpoint from moto's S3, runs `run.command` through `/bin/sh -c` as a local
process (in the directory `local up` was started in, so a relative path such as
`events/jobs/tiny_train.py` is found), heartbeats, checkpoints, ships its log lines to the stack's agent log
group (`spotrelay logs`), and reports to the state machine: the same code as on an instance, over HTTP to
moto's server. A job with a `run.image` runs the same way if a `docker` command is on the PATH; without
one the agent reports that it cannot start the container (JobFailed, `spotrelay status` says so).

IMDS is served on the same port as moto, under `/_spotrelay/imds/<instance id>` (IMDSv2: tokens, the
instance id, type, zone, region, tags, `spot/instance-action` and the rebalance recommendation once
`interrupt` posts them). `POST /_spotrelay/interrupt` is `spotrelay local interrupt`: as AWS FIS's
`aws:ec2:send-spot-instance-interruptions` does, it may first post a rebalance recommendation, then the
interruption warning with a deadline, both in the instance's IMDS and on EventBridge in AWS's recorded
shapes (events/recorded/); the instance is terminated when the notice runs out.

EC2's part: an instance seen running gets its `running` state change on EventBridge; one the control
plane terminates (or an interruption ends) gets `shutting-down` and then `terminated`, and its processes
(the agent, and the job in its own process group) are killed, as the instance's end kills them. An agent
that exits leaves its instance running until the control plane terminates it, as on EC2.

What stays simulated: the instance itself (no VM, no GPU: the job runs on this machine, as this user,
with no IMDS block for the job), the time EC2 takes to boot one (none), and spot capacity (the market
answers every launch from its prices).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotrelay.agent.runner import RunningJob
from spotrelay.agent.state import AgentState
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import ENV_WORKER_ROLE_ARN, TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.control.ports import NotFoundError
from spotrelay.local.clock import WallClock
from spotrelay.local.deploy import LocalStack
from spotrelay.local.imds import InstanceMetadataService
from spotrelay.local.recorded import instance_event, iso, load_recorded
from spotrelay.local.runtime import LocalRuntime

PREFIX = "/_spotrelay/"
IMDS_PREFIX = PREFIX + "imds/"
INTERRUPT_PATH = PREFIX + "interrupt"
SCAN_SECONDS = 1.0  # how often moto's instances are looked at (a launch's agent starts within this)
DEFAULT_NOTICE_SECONDS = 120.0  # EC2's two-minute warning
MIN_NOTICE_SECONDS, MAX_NOTICE_SECONDS = 1.0, 3600.0  # (AWS FIS's durationBeforeInterruption: 2 to 15 min)
MAX_REQUEST_BYTES = 4096
_GONE = {"shutting-down", "terminated", "stopping", "stopped"}
log = logging.getLogger(__name__)


class InterruptError(Exception):
    """What `local interrupt` asked for cannot be done: `status` 404 (no such instance or running job), 409
    (it already has its warning) or 400 (not a request this answers)."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class LocalInstance:
    instance_id: str
    job_id: str
    attempt: int
    directory: Path
    agent: subprocess.Popen[bytes] | None = None
    gone: bool = False
    notice_timer: threading.Timer | None = None
    notice_deadline: datetime | None = None
    market_timer: threading.Timer | None = None


def kill_processes(instance: LocalInstance) -> None:
    """What the instance's end does to its processes: the agent's group, and the job's (the agent's state
    names it: its supervisor's pid and start time, so that a pid reused since is never signalled)."""
    agent = instance.agent
    if agent is not None and agent.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(agent.pid, signal.SIGKILL)  # its own session, started here: the pid is still ours
    state_file = instance.directory / "state" / f"{instance.job_id}-{instance.attempt}.json"
    with contextlib.suppress(OSError, ValueError):
        state = AgentState.model_validate_json(state_file.read_text())
        if state.process is not None:
            RunningJob(state.process).kill()  # SIGKILL to its group if it is still that process
    if agent is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=5)
        instance.agent = None


@dataclass
class LocalWorkers:
    """The agents of `local up`'s instances (see the module docstring); `wsgi` serves their IMDS."""

    runtime: LocalRuntime
    clock: WallClock  # the runtime's
    stack: LocalStack
    endpoint_url: str
    root: Path  # the instances' scratch directories
    echo: Callable[[str], None] = lambda line: None
    python: str = sys.executable
    # how often an agent asks IMDS for a notice: EC2's agents every 5 s; here every second, so that an
    # interruption sent by hand shows at once (a notice is two minutes either way)
    poll_seconds: float = 1.0
    instances: dict[str, LocalInstance] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.imds = InstanceMetadataService(self.clock)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._recorded = load_recorded()
        vend = self.stack.functions["vend"]
        configuration = self.runtime.client("lambda").get_function_configuration(FunctionName=vend)
        self.worker_role_arn = configuration["Environment"]["Variables"][ENV_WORKER_ROLE_ARN]
        self.log_group = self.stack.outputs.get("AgentLogGroupName")

    # --- running ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch, name="local-instances", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            for instance in self.instances.values():
                if not instance.gone:  # an ended instance's processes were killed when it ended
                    kill_processes(instance)

    def _watch(self) -> None:
        while not self._stopped.wait(SCAN_SECONDS):
            try:
                self.scan()
            except Exception:  # the next scan tries again; one bad answer must not stop the instances
                log.exception("scanning moto's instances failed")

    def scan(self) -> None:
        """Start an agent for each new instance of a job; end what the instances' end ends."""
        for instance in self._described():
            instance_id, state = instance["InstanceId"], instance["State"]["Name"]
            with self._lock:
                known = self.instances.get(instance_id)
                if known is None and state in {"pending", "running"}:
                    self._launched(instance)
                elif known is not None and not known.gone and state in _GONE:
                    self._ended(known)
                elif known is not None and known.agent is not None and known.agent.poll() is not None:
                    self._reap(known)

    def _described(self) -> Iterable[dict[str, Any]]:
        pages = self.runtime.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag-key", "Values": [TAG_JOB_ID]}]
        )
        for page in pages:
            for reservation in page["Reservations"]:
                yield from reservation["Instances"]  # type: ignore[misc]

    def _launched(self, described: dict[str, Any]) -> None:
        instance_id = described["InstanceId"]
        tags = {t["Key"]: t["Value"] for t in described.get("Tags", [])}
        try:
            attempt = int(tags.get(TAG_ATTEMPT, ""))
        except ValueError:
            log.warning("instance without an attempt tag: no agent", extra={"instance_id": instance_id})
            attempt = 0
        instance = LocalInstance(instance_id, tags[TAG_JOB_ID], attempt, self.root / instance_id)
        self.instances[instance_id] = instance
        self.imds.register(
            instance_id,
            instance_type=described["InstanceType"],
            availability_zone=described["Placement"]["AvailabilityZone"],
            region=self.stack.region,
            tags=tags,
        )
        if not self._is_ours(instance.job_id):
            self.echo(f"{instance_id}: job {instance.job_id} is not in stack {self.stack.stack_name}'s table: no agent")
            return
        self._emit("running", instance_id)
        if attempt <= 0:
            return
        instance.agent = self._start_agent(instance)
        self._schedule_market_interruption(instance)
        self.echo(
            f"{instance_id} ({described['InstanceType']}, {described['Placement']['AvailabilityZone']}): agent started "
            f"for {instance.job_id} attempt {attempt} (pid {instance.agent.pid}, log {instance.directory}/agent.log)"
        )

    def _schedule_market_interruption(self, instance: LocalInstance) -> None:
        """When the market takes this spot instance's capacity back (`local up --market SCENARIO.yaml`: its
        outages and price rises above the job's cap), its interruption, as a replay's instances get theirs: the
        warning two minutes before (or at once, for a launch inside the last two minutes)."""
        ec2 = self.runtime.market
        launch = ec2.launch_of(instance.instance_id) if ec2 is not None else None
        if ec2 is None or launch is None or launch.spot_price is None:
            return
        market = ec2.market
        t = market.interruption_time(launch.pool, market.to_hours(launch.at), launch.max_price)
        if t is None:
            return
        ends = market.to_datetime(t)
        warned = max(self.clock.now(), ends - timedelta(seconds=DEFAULT_NOTICE_SECONDS))
        notice = max(MIN_NOTICE_SECONDS, (ends - warned).total_seconds())

        def interrupt() -> None:
            with contextlib.suppress(InterruptError):  # ended meanwhile, or interrupted by hand already
                self.interrupt(instance_id=instance.instance_id, notice_seconds=notice, source="the market")

        delay = max(0.0, (warned - self.clock.now()).total_seconds()) / self.clock.speed
        timer = threading.Timer(delay, interrupt)
        timer.daemon = True
        instance.market_timer = timer
        timer.start()

    def _is_ours(self, job_id: str) -> bool:
        """Whether the job is this stack's: another stack deployed into the same moto (`cdk deploy` with another
        stack name) launches instances too, whose agents would need that stack's names."""
        try:
            DynamoJobStore(self.stack.table_name, self.runtime.dynamodb).get_job(job_id)
        except NotFoundError:
            return False
        except Exception:  # a record this version cannot read is still this stack's job: its agent says more
            return True
        return True

    def _start_agent(self, instance: LocalInstance) -> subprocess.Popen[bytes]:
        """`spotrelay agent` as the instance's user data starts it, with the instance profile's credentials."""
        own = self.runtime.client("sts").assume_role(RoleArn=self.worker_role_arn, RoleSessionName=instance.instance_id)
        credentials = own["Credentials"]
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        environment.update(
            AWS_ACCESS_KEY_ID=credentials["AccessKeyId"],
            AWS_SECRET_ACCESS_KEY=credentials["SecretAccessKey"],
            AWS_SESSION_TOKEN=credentials["SessionToken"],
            AWS_REGION=self.stack.region,
            AWS_DEFAULT_REGION=self.stack.region,
            AWS_ENDPOINT_URL=self.endpoint_url,
            PYTHONUNBUFFERED="1",
        )
        command = [
            self.python,
            "-c",
            "from spotrelay.cli import main; main()",
            "agent",
            "--bucket",
            self.stack.bucket_name,
            "--table",
            self.stack.table_name,
            "--vend-function",
            self.stack.functions["vend"],
            "--imds-endpoint",
            f"{self.endpoint_url}{IMDS_PREFIX}{instance.instance_id}",
            "--state-dir",
            str(instance.directory / "state"),
            "--checkpoint-dir",
            str(instance.directory / "checkpoint"),
            "--poll-seconds",
            str(self.poll_seconds),
        ]
        if self.log_group:
            command += ["--log-group", self.log_group]
        instance.directory.mkdir(parents=True, exist_ok=True)
        with open(instance.directory / "agent.log", "ab") as output:
            return subprocess.Popen(
                command,
                env=environment,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: the instance's end kills it, Ctrl-C here does not
            )

    def _ended(self, instance: LocalInstance) -> None:
        instance.gone = True
        for timer in (instance.notice_timer, instance.market_timer):
            if timer is not None:
                timer.cancel()
        kill_processes(instance)
        self._emit("shutting-down", instance.instance_id)
        self._emit("terminated", instance.instance_id)
        self.echo(f"{instance.instance_id}: terminated ({instance.job_id} attempt {instance.attempt})")

    def _reap(self, instance: LocalInstance) -> None:
        assert instance.agent is not None
        code = instance.agent.returncode
        self.echo(f"{instance.instance_id}: agent exited ({code}) for {instance.job_id} attempt {instance.attempt}")
        instance.agent = None

    # --- interruptions -----------------------------------------------------------------------------------

    def interrupt(
        self,
        *,
        instance_id: str | None = None,
        job_id: str | None = None,
        notice_seconds: float = DEFAULT_NOTICE_SECONDS,
        rebalance_first: bool = False,
        source: str = "by hand",
    ) -> dict[str, Any]:
        """The interruption of a running instance (by id, or the job's newest): the warning now, the end after
        `notice_seconds`. Raises InterruptError when there is none to interrupt."""
        if not MIN_NOTICE_SECONDS <= notice_seconds <= MAX_NOTICE_SECONDS:  # (NaN is neither)
            raise InterruptError(
                f"notice_seconds: {notice_seconds!r} is not between {MIN_NOTICE_SECONDS:g} and {MAX_NOTICE_SECONDS:g}"
                " (EC2 gives 120)",
                status=400,
            )
        with self._lock:
            instance = self._find(instance_id, job_id)
            if instance.notice_deadline is not None:
                raise InterruptError(
                    f"instance {instance.instance_id} already has its interruption warning: it ends at "
                    f"{iso(instance.notice_deadline)}",
                    status=409,
                )
            now = self.clock.now()
            deadline = now + timedelta(seconds=notice_seconds)
            if rebalance_first:
                self.imds.recommend_rebalance(instance.instance_id, now)
                self._emit("rebalance", instance.instance_id)
            self.imds.notice(instance.instance_id, deadline)
            self._emit("warning", instance.instance_id, **{"instance-action": "terminate"})
            timer = threading.Timer(notice_seconds / self.clock.speed, self._notice_ran_out, [instance])
            timer.daemon = True
            instance.notice_timer, instance.notice_deadline = timer, deadline
            timer.start()
        self.echo(
            f"{instance.instance_id}: interruption warning ({source}) for {instance.job_id} attempt {instance.attempt}"
            f"{' (after a rebalance recommendation)' if rebalance_first else ''}; terminated at {iso(deadline)}"
        )
        return {
            "instance_id": instance.instance_id,
            "job_id": instance.job_id,
            "attempt": instance.attempt,
            "rebalance_recommended": rebalance_first,
            "terminates_at": iso(deadline),
        }

    def _find(self, instance_id: str | None, job_id: str | None) -> LocalInstance:
        if (instance_id is None) == (job_id is None):
            raise InterruptError("give instance_id or job_id (one of them)", status=400)
        if instance_id is not None:
            found = self.instances.get(instance_id)
            if found is None:
                raise InterruptError(f"no instance {instance_id} of a job here (see `spotrelay status JOB_ID`)")
        else:
            mine = [i for i in self.instances.values() if i.job_id == job_id and not i.gone]
            if not mine:
                raise InterruptError(f"job {job_id} has no running instance (see `spotrelay status {job_id}`)")
            found = max(mine, key=lambda i: i.attempt)
        if found.gone:
            raise InterruptError(f"instance {found.instance_id} is already terminated")
        return found

    def _notice_ran_out(self, instance: LocalInstance) -> None:
        if not instance.gone:
            with contextlib.suppress(Exception):
                self.runtime.ec2.terminate_instances(InstanceIds=[instance.instance_id])
            with self._lock:
                if not instance.gone:
                    self._ended(instance)

    # --- EventBridge -------------------------------------------------------------------------------------

    def _emit(self, kind: str, instance_id: str, **detail: str) -> None:
        stack = self.stack
        event = instance_event(
            self._recorded[kind],
            instance_id,
            account_id=stack.account_id,
            region=stack.region,
            when=self.clock.now(),
            **detail,
        )
        try:
            self.runtime.put_event(event)
        except Exception:  # EventBridge's delivery to a function that failed: logged, the instance goes on
            log.exception("EC2 event not delivered", extra={"kind": kind, "instance_id": instance_id})

    # --- HTTP ---------------------------------------------------------------------------------------------

    def serve(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """A WSGI answer to a request under /_spotrelay/ (the instances' IMDS and `interrupt`); the server
        hands the other paths to moto."""
        status, body, content_type = self._answer(environ, environ.get("PATH_INFO", ""))
        start_response(f"{status} {'OK' if status == 200 else 'Error'}", [("Content-Type", content_type)])
        return [body.encode()]

    def _answer(self, environ: dict[str, Any], path: str) -> tuple[int, str, str]:
        method = environ.get("REQUEST_METHOD", "GET")
        if path.startswith(IMDS_PREFIX):
            instance_id, _, rest = path.removeprefix(IMDS_PREFIX).partition("/")
            headers = {
                key.removeprefix("HTTP_").replace("_", "-").lower(): value
                for key, value in environ.items()
                if key.startswith("HTTP_")
            }
            status, body = self.imds.answer(instance_id, method, "/" + urllib.parse.unquote(rest), headers)
            return status, body, "text/plain"
        if path == INTERRUPT_PATH and method == "POST":
            try:
                answer = self.interrupt(**_interrupt_request(environ))
            except InterruptError as e:
                return e.status, json.dumps({"error": str(e)}), "application/json"
            return 200, json.dumps(answer), "application/json"
        return 404, json.dumps({"error": f"no {method} {path} here"}), "application/json"


def _interrupt_request(environ: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `interrupt` from a POST's JSON body; InterruptError(400) for anything else."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if not 0 < length <= MAX_REQUEST_BYTES:
        raise InterruptError(f"the body is a JSON object of at most {MAX_REQUEST_BYTES} bytes", status=400)
    try:
        request = json.loads(environ["wsgi.input"].read(length))
    except ValueError as e:
        raise InterruptError(f"the body is not JSON: {e}", status=400) from None
    if not isinstance(request, dict):
        raise InterruptError("the body is a JSON object", status=400)
    unknown = set(request) - {"instance_id", "job_id", "notice_seconds", "rebalance_first"}
    if unknown:
        raise InterruptError(f"unknown keys {sorted(unknown)[:5]}", status=400)
    ids = {key: request.get(key) for key in ("instance_id", "job_id")}
    if any(value is not None and not isinstance(value, str) for value in ids.values()):
        raise InterruptError("instance_id and job_id are strings", status=400)
    notice = request.get("notice_seconds", DEFAULT_NOTICE_SECONDS)
    if isinstance(notice, bool) or not isinstance(notice, int | float):
        raise InterruptError("notice_seconds is a number of seconds", status=400)
    rebalance = request.get("rebalance_first", False)
    if not isinstance(rebalance, bool):
        raise InterruptError("rebalance_first is true or false", status=400)
    return {**ids, "notice_seconds": float(notice), "rebalance_first": rebalance}
