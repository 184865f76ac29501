"""The EC2 and CloudWatch events the local runtime sends, in the exact shapes AWS sends them: the recorded
examples of `events/recorded/` (their README names the sources), bound to an instance, a stack and a time."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from spotrelay.local.lambdas import REPO_ROOT

RECORDED_DIR = REPO_ROOT / "events" / "recorded"
RECORDED = {
    "running": "instance-state-change-running.json",
    "shutting-down": "instance-state-change-shutting-down.json",
    "terminated": "instance-state-change-terminated.json",
    "warning": "spot-interruption-warning.json",
    "rebalance": "rebalance-recommendation.json",
    "alarm": "alarm-state-change.json",
}


def iso(when: datetime) -> str:
    """An event's `time`: UTC, to the second, as EventBridge writes it."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_recorded() -> dict[str, dict[str, Any]]:
    """Each kind's recorded event (read once by whoever sends them)."""
    return {kind: json.loads((RECORDED_DIR / name).read_text()) for kind, name in RECORDED.items()}


def instance_event(
    template: dict[str, Any], instance_id: str, *, account_id: str, region: str, when: datetime, **detail: str
) -> dict[str, Any]:
    """A copy of a recorded EC2 event about `instance_id`, in that account and region, at `when`."""
    event = copy.deepcopy(template)
    event["account"], event["region"], event["time"] = account_id, region, iso(when)
    if isinstance(event.get("detail"), dict):
        event["detail"]["instance-id"] = instance_id
        event["detail"].update(detail)
    event["resources"] = [f"arn:aws:ec2:{region}:{account_id}:instance/{instance_id}"]
    return event
