"""The replay's invariants (spotrelay.local.invariants): reading what moto holds into an `Observed`.

`read` asks the API (one Scan, one DescribeInstances, one ListExecutions); `peek` reads moto's in-process
backends, the same state without a request to serialize; `ReadCache` keeps each record parsed once per
version of its text. Siblings: spotrelay.local.invariants_snapshot (`Observed`),
spotrelay.local.invariants_checks (the checks), spotrelay.local.invariants (the monitor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED
from spotrelay.control.ports import CheckpointPointer
from spotrelay.field_problems import field_problems
from spotrelay.local.invariants_snapshot import RUNNING_STATES, InstanceView, Observed, UnreadableRecord
from spotrelay.models import Attempt, Job
from spotrelay.policy import BlockedPool

if TYPE_CHECKING:
    from spotrelay.local.deploy import LocalStack
    from spotrelay.local.runtime import LocalRuntime


_MODELS: dict[str, type[BaseModel]] = {
    "JOB": Job,
    "ATTEMPT": Attempt,
    "CHECKPOINT": CheckpointPointer,
    "BLOCK": BlockedPool,
}


def _model_of(sk: str) -> type[BaseModel] | None:
    return _MODELS.get(sk.split("#", 1)[0])


class ReadCache:
    """What reading moto step after step keeps: each record parsed once per version of its text (a step
    changes a few records of many), and moto's backends of the replay (`peek`)."""

    def __init__(self) -> None:
        self._parsed: dict[tuple[str, str], tuple[str, BaseModel | str]] = {}
        self.backends: tuple[Any, Any, Any] | None = None  # DynamoDB table, EC2, Step Functions

    def parse(self, pk: str, sk: str, text: str | None) -> BaseModel | UnreadableRecord | None:
        model = _model_of(sk)
        if model is None:
            return None
        if text is None:
            return UnreadableRecord(pk, sk, "no `record` attribute")
        cached = self._parsed.get((pk, sk))
        if cached is None or cached[0] != text:
            parsed: BaseModel | str
            try:
                parsed = model.model_validate_json(text)
            except ValidationError as e:
                parsed = f"does not read as {model.__name__}: {'; '.join(field_problems(e, at_most=1))}"
            cached = self._parsed[(pk, sk)] = (text, parsed)
        return UnreadableRecord(pk, sk, cached[1]) if isinstance(cached[1], str) else cached[1]


def _observed(
    records: Iterable[tuple[str, str, str | None]],
    instances: Iterable[InstanceView],
    executions: Mapping[str, str],
    cache: ReadCache,
) -> Observed:
    jobs: dict[str, Job] = {}
    attempts: dict[str, list[Attempt]] = {}
    pointers: dict[str, CheckpointPointer] = {}
    unreadable: list[UnreadableRecord] = []
    for pk, sk, text in records:
        parsed = cache.parse(pk, sk, text)
        if isinstance(parsed, UnreadableRecord):
            unreadable.append(parsed)
        elif isinstance(parsed, Job):
            jobs[parsed.job_id] = parsed
        elif isinstance(parsed, Attempt):
            attempts.setdefault(parsed.job_id, []).append(parsed)
        elif isinstance(parsed, CheckpointPointer):
            pointers[parsed.job_id] = parsed
    return Observed(
        jobs=jobs,
        attempts={job_id: sorted(found, key=lambda a: a.attempt) for job_id, found in attempts.items()},
        pointers=pointers,
        instances=sorted(instances, key=lambda i: i.instance_id),
        executions=executions,
        unreadable=unreadable,
    )


def _instance(instance_id: str, state: str, launched: datetime, tags: Mapping[str, str]) -> InstanceView:
    attempt = tags.get(TAG_ATTEMPT, "")
    return InstanceView(
        instance_id=instance_id,
        state=state,
        launched_at=launched if launched.tzinfo is not None else launched.replace(tzinfo=UTC),
        job_id=tags.get(TAG_JOB_ID),
        attempt=int(attempt) if attempt.isdigit() else None,
    )


def read(runtime: LocalRuntime, stack: LocalStack, cache: ReadCache | None = None) -> Observed:
    """Through the API, as any client would: one Scan of the table, one DescribeInstances of the managed
    instances pending or running, one ListExecutions of JobLifecycle (each paginated)."""
    records: list[tuple[str, str, str | None]] = []
    for page in runtime.dynamodb.get_paginator("scan").paginate(TableName=stack.table_name, ConsistentRead=True):
        for item in page.get("Items", []):
            text = item.get("record", {}).get("S")
            records.append((item["pk"].get("S", ""), item["sk"].get("S", ""), text))
    instances: list[InstanceView] = []
    pages = runtime.ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": sorted(RUNNING_STATES)},
        ]
    )
    for described_page in pages:
        for reservation in described_page.get("Reservations", []):
            for described in reservation.get("Instances", []):
                tags = {t.get("Key", ""): t.get("Value", "") for t in described.get("Tags", [])}
                instances.append(
                    _instance(
                        described.get("InstanceId", ""),
                        described.get("State", {}).get("Name", ""),
                        described.get("LaunchTime", datetime.min.replace(tzinfo=UTC)),
                        tags,
                    )
                )
    executions: dict[str, str] = {}
    listed = runtime.sfn.get_paginator("list_executions").paginate(stateMachineArn=stack.state_machine_arn)
    for listed_page in listed:
        for execution in listed_page.get("executions", []):
            executions[execution["name"]] = execution["status"]
    return _observed(records, instances, executions, cache or ReadCache())


def peek(runtime: LocalRuntime, stack: LocalStack, cache: ReadCache | None = None) -> Observed:
    """The same as `read`, from moto's in-process backends: no request and response to serialize. Only
    while every process of the clock is blocked on it (the replay checks between steps): nothing else
    changes the backends then."""
    cache = cache or ReadCache()
    if cache.backends is None:
        from moto.dynamodb.models import dynamodb_backends
        from moto.ec2.models import ec2_backends
        from moto.stepfunctions.responses import get_backend

        account, region = stack.account_id, runtime.region
        table = dynamodb_backends[account][region].get_table(stack.table_name)
        sfn = get_backend(account, region)  # moto's interpreter's backend (execute_state_machine)
        cache.backends = (table, ec2_backends[account][region], sfn.describe_state_machine(stack.state_machine_arn))
    table, ec2, state_machine = cache.backends
    records: list[tuple[str, str, str | None]] = []
    groups: Any = table.items.values()  # `all_items()`, unsorted: hash key -> range key -> item
    for group in groups:
        for item in group.values() if table.range_key_attr else [group]:
            attrs = item.attrs
            record = attrs.get("record")
            records.append((str(attrs["pk"].value), str(attrs["sk"].value), str(record.value) if record else None))
    instances = []
    for reservation in ec2.reservations.values():
        for instance in reservation.instances:
            if instance.state not in RUNNING_STATES:
                continue
            tags = ec2.tags.get(instance.id, {})  # `get_tags()` searches every resource's tags
            if tags.get(TAG_MANAGED) == "true":
                launched = instance.launch_time
                if isinstance(launched, str):
                    launched = datetime.fromisoformat(launched.replace("Z", "+00:00"))
                instances.append(_instance(instance.id, instance.state, launched, tags))
    executions: dict[str, str] = {}
    for execution in state_machine.executions:
        status = getattr(execution, "exec_status", None) or getattr(execution, "status", None)
        executions[execution.name] = str(getattr(status, "value", status))
    return _observed(records, instances, executions, cache)


__all__ = ["ReadCache", "peek", "read"]
