"""Checkpoints in S3: parallel multipart uploads and downloads, server-side copies, manifests.

Layout (`spotrelay.agent.checkpoint_contents` decides what goes where):

    s3://<bucket>/jobs/<job_id>/checkpoints/<attempt>-<seq>/data/<path>      the files this checkpoint uploaded
    s3://<bucket>/jobs/<job_id>/checkpoints/<attempt>-<seq>/manifest.json    written last

Transfers go through one s3transfer `TransferManager` per batch (what `s3.upload_file` uses), so
several files move at once and each file above `multipart_threshold` is split into parts uploaded in
parallel: `max_concurrency` requests in flight over the whole batch. AWS suggests one concurrent
request per 85-90 MB/s wanted, about 15 to fill a 10 Gb/s NIC ("Best Practices Design Patterns:
Optimizing Amazon S3 Performance", Horizontal Scaling and Request Parallelization); 32 in flight
leave room for a 25 Gb/s instance. The classic (Python) transfer client is used on purpose: its
futures can be cancelled one by one, which the agent needs to drop a periodic upload at a notice.

Uploads carry the SDK's default CRC32 checksums (boto3 >= 1.36), so S3 rejects a part damaged in
transit; the manifest's sha256 is what restore verifies end to end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.exceptions import ClientError
from pydantic import ValidationError
from s3transfer.subscribers import BaseSubscriber

from spotrelay.agent.ports import CheckpointIntegrityError, TransferCancelled
from spotrelay.clock import ClockEvent
from spotrelay.field_problems import field_problems
from spotrelay.models import CheckpointManifest

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from s3transfer.futures import TransferFuture
    from s3transfer.manager import TransferManager

    _Submit = Callable[[TransferManager, list[BaseSubscriber]], TransferFuture]

MiB = 1024 * 1024
DEFAULT_TRANSFER_CONFIG = TransferConfig(
    multipart_threshold=64 * MiB,
    multipart_chunksize=64 * MiB,  # 40 GiB -> 640 parts (s3transfer widens parts to stay under 10,000)
    max_concurrency=32,
    use_threads=True,
    preferred_transfer_client="classic",
)
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}


class _Done(BaseSubscriber):
    """Counts finished transfers and wakes the waiter."""

    def __init__(self, key: str, batch: _Batch) -> None:
        self.key = key
        self.batch = batch

    def on_done(self, future: TransferFuture, **kwargs: Any) -> None:
        self.batch.finished(self.key, future)


class _Batch:
    def __init__(self, total: int) -> None:
        self.total = total
        self.completed: list[str] = []
        self.failed = 0
        self._cv = threading.Condition()

    def finished(self, key: str, future: TransferFuture) -> None:
        with self._cv:
            try:
                future.result()
            except BaseException:
                self.failed += 1
            else:
                self.completed.append(key)
            self._cv.notify_all()

    def wait(self, cancel: ClockEvent | None, tick: float = 0.05) -> bool:
        """Until every transfer finished (True) or `cancel` is set (False)."""
        with self._cv:
            while len(self.completed) + self.failed < self.total:
                if cancel is not None and cancel.is_set():
                    return False
                self._cv.wait(tick if cancel is not None else None)
            return True


class S3CheckpointStorage:
    """The checkpoint bucket, as the agent uses it."""

    def __init__(self, client: S3Client, bucket: str, *, transfer_config: TransferConfig | None = None) -> None:
        self.client = client
        self.bucket = bucket
        self.transfer_config = transfer_config or DEFAULT_TRANSFER_CONFIG

    def upload(self, items: Sequence[tuple[Path, str]], cancel: ClockEvent | None = None) -> list[str]:
        """Upload local files to keys, in parallel; returns the keys. Raises TransferCancelled when
        `cancel` is set first (the keys finished by then are in it)."""
        return self._run([(key, partial(self._upload_one, path, key)) for path, key in items], cancel)

    def download(self, items: Sequence[tuple[str, Path]]) -> None:
        """Download keys to local paths (their parent dirs are created), in parallel."""
        for _, path in items:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._run([(key, partial(self._download_one, key, path)) for key, path in items], None)

    def copy(self, items: Sequence[tuple[str, str]], cancel: ClockEvent | None = None) -> list[str]:
        """Server-side copies (source key -> key), multipart for large objects; returns the new keys."""
        return self._run([(key, partial(self._copy_one, source, key)) for source, key in items], cancel)

    def _upload_one(
        self, path: Path, key: str, manager: TransferManager, subscribers: list[BaseSubscriber]
    ) -> TransferFuture:
        return manager.upload(str(path), self.bucket, key, subscribers=subscribers)

    def _download_one(
        self, key: str, path: Path, manager: TransferManager, subscribers: list[BaseSubscriber]
    ) -> TransferFuture:
        return manager.download(self.bucket, key, str(path), subscribers=subscribers)

    def _copy_one(
        self, source: str, key: str, manager: TransferManager, subscribers: list[BaseSubscriber]
    ) -> TransferFuture:
        return manager.copy({"Bucket": self.bucket, "Key": source}, self.bucket, key, subscribers=subscribers)

    def _run(self, submits: Sequence[tuple[str, _Submit]], cancel: ClockEvent | None) -> list[str]:
        if not submits:
            return []
        batch = _Batch(len(submits))
        futures: list[TransferFuture] = []
        with create_transfer_manager(self.client, self.transfer_config) as manager:
            for key, submit in submits:
                futures.append(submit(manager, [_Done(key, batch)]))
            finished = batch.wait(cancel)
            if not finished:
                for future in futures:
                    future.cancel()
        if not finished:
            raise TransferCancelled(list(batch.completed))
        for future in futures:
            future.result()  # the first failure, with its own exception
        return list(batch.completed)

    # --- manifests ----------------------------------------------------------------------------------

    def put_manifest(self, manifest: CheckpointManifest) -> str:
        key = manifest.prefix + "manifest.json"
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=manifest.model_dump_json().encode(), ContentType="application/json"
        )
        return key

    def read_manifest(self, key: str) -> CheckpointManifest:
        """The manifest at `key`. A committed checkpoint whose manifest is missing or unreadable is a
        corrupt checkpoint (CheckpointIntegrityError), never an empty one."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND:
                raise CheckpointIntegrityError(key, ["the manifest is missing"]) from e
            raise
        try:
            return CheckpointManifest.model_validate_json(body)
        except ValidationError as e:
            raise CheckpointIntegrityError(key, [f"not a manifest: {'; '.join(field_problems(e, at_most=1))}"]) from e

    def last_modified(self, keys: Sequence[str]) -> dict[str, datetime]:
        """When each object was written (HeadObject, in parallel)."""
        unique = sorted(set(keys))
        if not unique:
            return {}

        def head(key: str) -> datetime:
            return self.client.head_object(Bucket=self.bucket, Key=key)["LastModified"]

        with ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:
            return dict(zip(unique, pool.map(head, unique), strict=True))
