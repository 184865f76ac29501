"""The worker agent's ports: what it needs of the job table, the checkpoint bucket, the Run task's token
and the instance metadata, as Protocols (the control plane's are `spotrelay.control.ports`). The AWS
adapters implement them (`spotrelay.aws.store`, `spotrelay.aws.checkpoint_storage`, `spotrelay.aws.task_tokens`,
`spotrelay.agent.imds`); the agent's modules import only this, never the adapters, which `spotrelay.agent.
main` wires in. The storage errors the adapters raise are here too, for the agent to catch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from spotrelay.agent.imds import InstanceAction, RebalanceRecommendation
    from spotrelay.clock import ClockEvent
    from spotrelay.control.ports import CheckpointPointer
    from spotrelay.models import Attempt, CheckpointManifest, Job


class CheckpointStorage(Protocol):
    """The checkpoint bucket (`spotrelay.aws.checkpoint_storage.S3CheckpointStorage`)."""

    def upload(self, items: Sequence[tuple[Path, str]], cancel: ClockEvent | None = None) -> list[str]: ...

    def copy(self, items: Sequence[tuple[str, str]], cancel: ClockEvent | None = None) -> list[str]: ...

    def download(self, items: Sequence[tuple[str, Path]]) -> None: ...

    def put_manifest(self, manifest: CheckpointManifest) -> str: ...

    def read_manifest(self, key: str) -> CheckpointManifest: ...

    def last_modified(self, keys: Sequence[str]) -> dict[str, datetime]: ...


class CheckpointPointers(Protocol):
    """The part of `JobStore` that holds the job's checkpoint pointer."""

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool: ...

    def get_checkpoint(self, job_id: str) -> CheckpointPointer | None: ...


class AgentStore(CheckpointPointers, Protocol):
    """What the agent reads and writes in the job table (GetItem and a conditional PutItem only)."""

    def get_job(self, job_id: str) -> tuple[Job, int]: ...

    def get_attempt(self, job_id: str, attempt: int) -> Attempt: ...


class InstanceMetadata(Protocol):
    def instance_action(self) -> InstanceAction | None: ...

    def rebalance_recommendation(self) -> RebalanceRecommendation | None: ...


class TaskTokens(Protocol):
    """Each returns False when the token is already closed."""

    def heartbeat(self, task_token: str) -> bool: ...

    def succeed(self, task_token: str, output: dict[str, Any]) -> bool: ...

    def fail(self, task_token: str, error: str, cause: str) -> bool: ...


class TransferCancelled(Exception):
    """A batch of transfers was cancelled; `completed` are the keys that finished before that."""

    def __init__(self, completed: list[str]) -> None:
        super().__init__(f"cancelled after {len(completed)} transfer(s)")
        self.completed = completed


class CheckpointIntegrityError(Exception):
    """A checkpoint's bytes do not match its manifest: never resume from it."""

    def __init__(self, where: str, problems: list[str]) -> None:
        super().__init__(f"{where}: {'; '.join(problems[:5])}{' ...' if len(problems) > 5 else ''}")
        self.where = where
        self.problems = problems
