"""How long from a spot interruption notice to a committed checkpoint (a benchmark, not a test).

    python -m spotrelay.agent.bench [--size-mib 1024] [--files 8] [--poll-seconds 0.5]
    make bench-agent

Runs the real agent loop (restore, job process, IMDS polling, final checkpoint: hash, multipart
parallel upload, manifest, conditional pointer write) against moto S3 and DynamoDB served by a
`ThreadedMotoServer` in a separate process, and prints two figures for a checkpoint dir of
`--size-mib` MiB in `--files` files:

- cold: nothing of the dir was uploaded before the notice (the whole dir goes up at the notice);
- incremental: a periodic checkpoint uploaded the dir earlier, then one file changed; only that
  file goes up at the notice.

Each figure runs from the moment the notice appears in (a scripted) IMDS to the moment the pointer
in DynamoDB names the final checkpoint; it includes the poll latency (`--poll-seconds`, up to that
long; the agent polls every 5 s on an instance) and the job's exit on SIGTERM (immediate here).
moto is one Python process on the loopback: its figure says what the agent costs on this machine,
not what S3 can take.

How a 40 GiB checkpoint fits inside the two-minute notice
---------------------------------------------------------
The budget after the notice (T-120 s): up to 5 s until the agent's poll sees it, up to
`grace_seconds` (default 90) for the job to stop and save, then the upload of what S3 does not have
yet, the manifest (one small PUT) and the pointer (one conditional PutItem), in tens of
milliseconds. With the default grace that leaves about 20 s for the upload (120 - 5 - 90 - 5 s
margin); a job that saves quickly can set `grace_seconds: 30` and leave about 80 s.

Uploading 40 GiB at the notice does not fit: in 20 s that needs about 2 GiB/s (17 Gb/s) sustained.
The throughput assumed here is what AWS documents for S3 from EC2 in the same region: one request
carries about 85-90 MB/s, and about 15 parallel requests fill a 10 Gb/s NIC ("Best Practices Design
Patterns: Optimizing Amazon S3 Performance", section "Horizontal Scaling and Request
Parallelization"); traffic inside the region may use the instance's full bandwidth, a single flow
at most 5 Gb/s ("Amazon EC2 instance network bandwidth", EC2 User Guide). So a 10 Gb/s GPU instance
(g5/g6 sizes "up to 10 Gb/s" burst to it; their baseline is lower) moves at most about 1.1 GiB/s,
and the agent's 32 requests in flight (64 MiB parts, many files at once) are enough to fill it.

What makes 40 GiB fit is that the notice only has to carry the delta. Every `interval_minutes` the
agent uploads the files that changed since the last checkpoint, in the background while the job
runs; unchanged files are referenced, not uploaded again. At the notice, S3 already holds every file
as of the last periodic checkpoint, and only files written since then go up: at ~1 GiB/s and a 20 s
budget, up to ~20 GiB of new bytes (80 GiB with a 30 s grace). A job whose state is 40 GiB should
therefore write it as several files (shards, or one file per save step) and save on its own
schedule, not on SIGTERM: then the delta at the notice is at most the last save, and a job that
saves nothing on SIGTERM loses at most one interval of work. Two more limits to respect: hashing
(sha256 runs at ~1-2 GB/s per core with SHA extensions; the agent hashes files in parallel threads,
and only files whose size or mtime changed), and the disk the checkpoint dir is on: gp3's baseline
is 125 MB/s, so reading a large delta back for the upload needs the instance's NVMe instance store,
provisioned gp3 throughput, or the page cache.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotrelay.agent.agent import Agent, AgentResult, AgentSettings
from spotrelay.agent.imds import InstanceAction, RebalanceRecommendation
from spotrelay.models import Attempt, Job, JobSpec, Pool

if TYPE_CHECKING:
    from spotrelay.aws.store import DynamoJobStore

MiB = 1024 * 1024
REGION = "us-east-1"
TABLE = "spotrelay-bench"
BUCKET = "spotrelay-bench-checkpoints"
SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="localhost", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""
JOB = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.05)"


class ScriptedMetadata:
    """IMDS whose interruption notice appears when the bench says so."""

    def __init__(self) -> None:
        self.action: InstanceAction | None = None

    def instance_action(self) -> InstanceAction | None:
        return self.action

    def rebalance_recommendation(self) -> RebalanceRecommendation | None:
        return None


class NoTaskTokens:
    def heartbeat(self, task_token: str) -> bool:
        return True

    def succeed(self, task_token: str, output: dict[str, Any]) -> bool:
        return True

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        return True


def start_moto() -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    return server, f"http://localhost:{port}"


def write_dir(root: Path, size_mib: int, files: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    per_file = size_mib * MiB // files
    chunk = 16 * MiB
    for n in range(files):
        with (root / f"shard-{n:02d}.bin").open("wb") as f:
            left = per_file
            while left > 0:
                f.write(os.urandom(min(chunk, left)))
                left -= chunk


def sha256_rate(path: Path) -> float:
    """MB/s of sha256 over one file on this machine (one core)."""
    started = time.monotonic()
    with path.open("rb") as f:
        hashlib.file_digest(f, "sha256")
    return path.stat().st_size / 1e6 / (time.monotonic() - started)


def run_case(
    *,
    name: str,
    store: DynamoJobStore,
    storage: Any,
    workdir: Path,
    size_mib: int,
    files: int,
    poll_seconds: float,
    incremental: bool,
) -> dict[str, Any]:
    job_id = f"bench-{name}"
    checkpoint_dir = workdir / name / "ckpt"
    write_dir(checkpoint_dir, size_mib, files)
    now = datetime.now(UTC)
    spec = JobSpec.model_validate(
        {
            "name": job_id,
            "run": {"command": f"{sys.executable} -c '{JOB}'"},
            "resources": {"gpus": 1},
            "checkpoint": {"dir": str(checkpoint_dir), "interval_minutes": 0.05 if incremental else 600},
        }
    )
    store.create_job(Job(job_id=job_id, spec=spec, submitted_at=now, updated_at=now))
    store.put_attempt(
        Attempt(
            job_id=job_id,
            attempt=1,
            pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1a"),
            hourly_price=0.0,
            started_at=now,
            task_token="bench-token",
        )
    )
    metadata = ScriptedMetadata()
    agent = Agent(
        job_id=job_id,
        attempt=1,
        store=store,
        storage=storage,
        tokens=NoTaskTokens(),
        metadata=metadata,
        settings=AgentSettings(
            state_dir=workdir / name / "state",
            poll_seconds=poll_seconds,
            heartbeat_seconds=3600,
            checkpoint_dir=checkpoint_dir,
        ),
    )
    results: list[AgentResult] = []
    thread = threading.Thread(target=lambda: results.append(agent.run()), daemon=True)
    thread.start()
    while agent.state.process is None:
        time.sleep(0.01)
    if incremental:
        while store.get_checkpoint(job_id) is None:  # the first periodic checkpoint: the whole dir
            time.sleep(0.01)
        with (checkpoint_dir / "shard-00.bin").open("r+b") as f:
            f.write(os.urandom(MiB))  # one shard changes
    before = store.get_checkpoint(job_id)
    noticed = time.monotonic()
    metadata.action = InstanceAction(action="terminate", time="2026-11-30T12:02:00Z")
    while True:
        pointer = store.get_checkpoint(job_id)
        if pointer is not None and pointer != before and pointer.seq >= (0 if before is None else before.seq + 1):
            committed = time.monotonic() - noticed
            manifest = storage.read_manifest(pointer.manifest_key)
            if manifest.final:
                break
        time.sleep(0.005)
    thread.join(60)
    final = next(c for c in results[0].checkpoints if c.reason == "final")
    return {
        "case": name,
        "checkpoint_mib": size_mib,
        "files": files,
        "uploaded_mib": round(final.uploaded_bytes / MiB, 1),
        "uploaded_files": len(final.uploaded),
        "notice_to_commit_seconds": round(committed, 2),
        "final_checkpoint_seconds": final.seconds,
        "upload_mib_per_second": round(final.uploaded_bytes / MiB / final.seconds, 1) if final.seconds else None,
        "poll_seconds": poll_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024, help="size of the checkpoint dir")
    parser.add_argument("--files", type=int, default=8, help="files it is split into")
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="the agent's IMDS poll interval")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    import boto3

    from spotrelay.agent.logs import configure_json_logging
    from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
    from spotrelay.aws.store import DynamoJobStore

    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ[name] = value
    configure_json_logging(stream=open(os.devnull, "w"))  # noqa: SIM115 - the agent's log lines are not the figure
    server, endpoint = start_moto()
    workdir = Path(tempfile.mkdtemp(prefix="spotrelay-bench-agent-"))
    try:
        dynamodb = boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint)
        dynamodb.create_table(
            TableName=TABLE,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        )
        s3 = boto3.client("s3", region_name=REGION, endpoint_url=endpoint)
        s3.create_bucket(Bucket=BUCKET)
        store = DynamoJobStore(TABLE, dynamodb)
        storage = S3CheckpointStorage(s3, BUCKET)
        figures = [
            run_case(
                name=name,
                store=store,
                storage=storage,
                workdir=workdir,
                size_mib=args.size_mib,
                files=args.files,
                poll_seconds=args.poll_seconds,
                incremental=name == "incremental",
            )
            for name in ("cold", "incremental")
        ]
        hashing = sha256_rate(workdir / "cold" / "ckpt" / "shard-00.bin")
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"figures": figures, "sha256_mb_per_second": round(hashing)}, indent=2))
        return
    print(f"notice -> committed checkpoint, {args.size_mib} MiB in {args.files} files, moto server on the loopback")
    for f in figures:
        print(
            f"  {f['case']:<12} {f['notice_to_commit_seconds']:6.2f} s  "
            f"(uploaded {f['uploaded_mib']:.0f} MiB in {f['uploaded_files']} file(s); final checkpoint "
            f"{f['final_checkpoint_seconds']:.2f} s, {f['upload_mib_per_second']} MiB/s; poll {f['poll_seconds']} s)"
        )
    print(f"  sha256 on this machine: {hashing:.0f} MB/s per core")


if __name__ == "__main__":
    main()
