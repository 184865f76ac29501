"""Cold-start import time of each Lambda function module, each in a fresh Python process.

    python -m spotrelay.bench.cold_start [--runs N]

Imports `functions.<name>` with the environment its settings model needs (placeholder values; no
AWS call is made at import) and reports the median wall time of the import over N fresh processes.
This is what a Lambda cold start pays on top of the runtime's own start: module imports, settings
validation and client construction.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from spotrelay.config import SETTINGS_BY_FUNCTION

PLACEHOLDERS = {
    "SPOTRELAY_TABLE": "spotrelay-table",
    "SPOTRELAY_BUCKET": "spotrelay-bucket",
    "SPOTRELAY_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/jobs",
    "SPOTRELAY_DLQ_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq",
    "SPOTRELAY_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:JobLifecycle",
    "SPOTRELAY_LAUNCH_TEMPLATE_ID": "lt-0123456789abcdef0",
    "SPOTRELAY_SUBNETS": '{"us-east-1a": "subnet-1", "us-east-1b": "subnet-2"}',
    "SPOTRELAY_ALLOWED_FAMILIES": "g5,g6,p4d",
    "SPOTRELAY_MAX_CONCURRENT_JOBS": "8",
    "SPOTRELAY_BUDGET_USD_PER_HOUR": "50",
    "SPOTRELAY_SPOT_VCPU_QUOTAS": '{"g": 64, "p": 96}',
    "SPOTRELAY_DISPATCHER_FUNCTION": "spotrelay-dispatcher",
    "SPOTRELAY_BLOCK_MINUTES": "60",
    "SPOTRELAY_HEARTBEAT_SECONDS": "900",
}

PROBE = "import time; t = time.perf_counter(); import functions.{name}; print(time.perf_counter() - t)"


def import_seconds(name: str) -> float:
    env = {
        **os.environ,
        **PLACEHOLDERS,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_SERVICE_NAME": "spotrelay",
        "POWERTOOLS_METRICS_NAMESPACE": "spotrelay",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(name=name)], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'function':<12} {'median import':>14} {'min':>8}   ({args.runs} fresh processes each)")
    for name in SETTINGS_BY_FUNCTION:
        samples = [import_seconds(name) for _ in range(args.runs)]
        print(f"{name:<12} {statistics.median(samples) * 1000:>11.0f} ms {min(samples) * 1000:>5.0f} ms")


if __name__ == "__main__":
    main()
