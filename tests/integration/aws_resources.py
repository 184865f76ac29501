"""What the moto fixtures create, for the tests to name: region, zones, and the resources' ids."""

from __future__ import annotations

from dataclasses import dataclass

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b")
TABLE = "spotrelay-test"
ROLE_ARN = "arn:aws:iam::123456789012:role/spotrelay-sfn"
IMAGE_ID = "ami-12c6146b"  # one of moto's built-in AMIs (listing them all takes a second per test)


@dataclass(frozen=True)
class Queues:
    queue_url: str
    dlq_url: str


@dataclass(frozen=True)
class Lifecycle:
    state_machine_arn: str
    token_queue_url: str


@dataclass(frozen=True)
class Network:
    launch_template_id: str
    subnets: dict[str, str]  # AZ -> subnet id
