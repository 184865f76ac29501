"""The local runtime's fixtures: the synthesized template (synthesized once if cdk.out lacks it), a
small spot market, a runtime with the stack deployed on a virtual clock, and the recorded events."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotrelay.local import LocalRuntime, VirtualClock
from spotrelay.market import MarketBuilder, SpotMarket

REPO_ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 11, 30, tzinfo=UTC)
STALL_SECONDS = 120.0  # a bound on each wait for quiescence (real seconds), never a sleep; generous under load
SEED = 7

# resnet50 fits every family; the stack allows g4dn, g5, g6, g6e, gr6, p4d, p5. The cheapest pool
# here is g6.xlarge in us-east-1a, then g6.xlarge in us-east-1b; the stack's subnets are in 1a and 1b.
EXAMPLE_PRICES = (
    ("g6.xlarge", "us-east-1a", 0.35),
    ("g6.xlarge", "us-east-1b", 0.40),
    ("g5.xlarge", "us-east-1a", 0.50),
    ("g5.xlarge", "us-east-1b", 0.55),
)


def example_market(start: datetime = START) -> SpotMarket:
    builder = MarketBuilder(start)
    for instance_type, zone, price in EXAMPLE_PRICES:
        builder.add_price(instance_type, zone, price)
    return builder.build()


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing here may reach a real account: fake credentials, no profile or config file."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START, stall_seconds=STALL_SECONDS)


@pytest.fixture
def runtime(synthesized_template: Path, clock: VirtualClock) -> Iterator[LocalRuntime]:
    """The stack deployed into moto, the example market behind EC2, the virtual clock at START."""
    with LocalRuntime(clock=clock, market=example_market(), seed=SEED) as local:
        local.deploy(synthesized_template)
        yield local


@pytest.fixture
def recorded_event(events_dir: Path) -> Callable[..., dict[str, Any]]:
    """A recorded event from events/recorded, with what a replay binds changed: `instance_id` (detail
    and resources), `alarm_name` (detail.alarmName and the resource ARN), `time`."""

    def load(name: str, *, instance_id: str | None = None, alarm_name: str | None = None) -> dict[str, Any]:
        event = copy.deepcopy(json.loads((events_dir / "recorded" / f"{name}.json").read_text()))
        assert isinstance(event, dict)
        if instance_id is not None:
            event["detail"]["instance-id"] = instance_id
            event["resources"] = [f"arn:aws:ec2:{event['region']}:{event['account']}:instance/{instance_id}"]
        if alarm_name is not None:
            event["detail"]["alarmName"] = alarm_name
            event["resources"] = [f"arn:aws:cloudwatch:{event['region']}:{event['account']}:alarm:{alarm_name}"]
        return event

    return load


@pytest.fixture
def resnet50_message(events_dir: Path) -> str:
    """events/jobs/resnet50.yaml as the JSON body a user sends to the job queue."""
    return json.dumps(yaml.safe_load((events_dir / "jobs" / "resnet50.yaml").read_text()))
