"""The one typed configuration of the stack, built from CDK context.

Every name and size the constructs use comes from here. Values come from `cdk.json` ("context")
or the command line (`cdk synth -c max_concurrent_jobs=4`). Command-line values always arrive as
strings, so list- and map-valued keys also accept their JSON text (and lists a comma-separated
string):

    -c vpc_id=vpc-0abc -c 'subnets=[{"id": "subnet-0a", "availability_zone": "us-east-1a"}]'
    -c allowed_gpu_families=g5,g6e -c 'spot_vcpu_quotas={"g": 128, "p": 96}'

Without `vpc_id`/`subnets` the stack creates a small VPC of its own (see `network_construct`).
A value that does not validate stops the synth with a message naming the context key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spotrelay.catalog import INSTANCE_TYPES, family_of
from spotrelay.config import INTERRUPTION_BLOCK_MINUTES

# p3 (V100) is left out by default: the default worker AMI (the PyTorch DLAMI with the current NVIDIA
# driver) does not list P3 among its supported instance types. Add it with an AMI that supports it.
DEFAULT_GPU_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p4d", "p5")
# AWS's account-level spot vCPU quotas are per quota group: "All G and VT Spot Instance Requests" ("g")
# and "All P Spot Instance Requests" ("p"); the group of a family is its first letter.
DEFAULT_SPOT_VCPU_QUOTAS = {"g": 64, "p": 96}
# `${AWS::Region}` is substituted at deploy time (Fn::Sub), so one template serves every region.
DEFAULT_POWERTOOLS_LAYER_ARN = (
    "arn:aws:lambda:${AWS::Region}:017000801446:layer:AWSLambdaPowertoolsPythonV3-python311-arm64:27"
)
# Deep Learning OSS Nvidia Driver AMI GPU PyTorch (Amazon Linux 2023), x86_64: AWS publishes one public
# SSM parameter per PyTorch minor version (.../oss-nvidia-driver-gpu-pytorch-<x.y>-amazon-linux-2023/...);
# it is resolved when CloudFormation deploys the stack, never at synth.
DEFAULT_WORKER_AMI_SSM_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.10-amazon-linux-2023/latest/ami-id"
)
KNOWN_GPU_FAMILIES = frozenset(family_of(name) for name in INSTANCE_TYPES)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class ConfigError(ValueError):
    """The CDK context does not make a valid configuration; the message names every bad key."""


class SubnetConfig(BaseModel):
    """One existing subnet workers may launch into."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^subnet-[0-9a-f]{8,17}$")
    availability_zone: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+[a-z]$")


def _json_if_text(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        return json.loads(value)
    return value


def _split_if_text(value: Any) -> Any:
    value = _json_if_text(value)
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class SpotRelayConfig(BaseModel):
    """What a platform engineer chooses per account/region; field names are the CDK context keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # At most 64 characters: a job's session policy (spotrelay.control.vend) names the stack's table twice and
    # its log group once, and STS takes 2,048 characters of it
    stack_name: str = Field(default="SpotRelay", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,63}$")
    vpc_id: str | None = Field(default=None, pattern=r"^vpc-[0-9a-f]{8,17}$")
    subnets: tuple[SubnetConfig, ...] = ()
    allowed_gpu_families: tuple[str, ...] = Field(default=DEFAULT_GPU_FAMILIES, min_length=1)
    max_concurrent_jobs: int = Field(default=8, ge=1, le=1000)
    budget_usd_per_hour: float = Field(default=50.0, gt=0)
    spot_vcpu_quotas: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_SPOT_VCPU_QUOTAS))
    checkpoint_retention_days: int = Field(default=30, ge=1)
    log_level: LogLevel = "INFO"
    powertools_layer_arn: str = Field(
        default=DEFAULT_POWERTOOLS_LAYER_ARN,
        pattern=r"^arn:(aws|aws-cn|aws-us-gov|\$\{AWS::Partition\}):lambda:([a-z0-9-]+|\$\{AWS::Region\}):\d{12}:layer:[A-Za-z0-9_-]+:\d+$",
    )
    heartbeat_seconds: int = Field(default=900, ge=60)
    # An interruption warning keeps its pool out for every job this long (spotrelay.config)
    block_minutes: int = Field(default=INTERRUPTION_BLOCK_MINUTES, ge=1)
    worker_ami_ssm_parameter: str = Field(default=DEFAULT_WORKER_AMI_SSM_PARAMETER, pattern=r"^/[A-Za-z0-9_./-]+$")
    worker_root_volume_gib: int = Field(default=200, ge=100, le=16384)

    _subnets_json = field_validator("subnets", mode="before")(_json_if_text)
    _quotas_json = field_validator("spot_vcpu_quotas", mode="before")(_json_if_text)
    _families_list = field_validator("allowed_gpu_families", mode="before")(_split_if_text)

    @field_validator("allowed_gpu_families")
    @classmethod
    def _known_families(cls, families: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(families) - KNOWN_GPU_FAMILIES)
        if unknown:
            raise ValueError(f"unknown GPU families {unknown}; the catalog knows {sorted(KNOWN_GPU_FAMILIES)}")
        if len(set(families)) != len(families):
            raise ValueError("a family is listed twice")
        return families

    @field_validator("spot_vcpu_quotas")
    @classmethod
    def _positive_quotas(cls, quotas: dict[str, int]) -> dict[str, int]:
        bad = {group: vcpus for group, vcpus in quotas.items() if vcpus < 1 or len(group) != 1}
        if bad:
            raise ValueError(f"quota groups are one letter with a quota >= 1 vCPU, got {bad}")
        return quotas

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.vpc_id is None) != (not self.subnets):
            raise ValueError("give vpc_id and subnets together, or neither (the stack then creates a VPC)")
        zones = [subnet.availability_zone for subnet in self.subnets]
        if len(set(zones)) != len(zones):
            raise ValueError(f"one subnet per availability zone, got {zones}")
        ungrouped = sorted(f for f in self.allowed_gpu_families if f[0] not in self.spot_vcpu_quotas)
        if ungrouped:
            raise ValueError(f"families {ungrouped} have no spot vCPU quota group in spot_vcpu_quotas")
        return self

    @property
    def creates_vpc(self) -> bool:
        return self.vpc_id is None

    @classmethod
    def context_keys(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    @classmethod
    def from_context(cls, get_context: Callable[[str], Any]) -> Self:
        """Build from a context getter (`app.node.try_get_context`); None means "not given"."""
        given = {key: value for key in cls.context_keys() if (value := get_context(key)) is not None}
        return cls.from_mapping(given)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Self:
        try:
            return cls.model_validate(dict(values))
        except ValidationError as error:  # bad JSON text in a before-validator is a ValueError: reported here too
            raise ConfigError(_describe(error, values)) from error


def _describe(error: ValidationError, values: Mapping[str, Any]) -> str:
    lines = []
    for problem in error.errors():
        location = [str(part) for part in problem["loc"]]
        if not location:  # a rule across keys: its message names them
            lines.append(f"context: {problem['msg']}")
            continue
        key, where = location[0], ".".join(location[1:])
        detail = f" (at {where})" if where else ""
        given = values.get(key, "<not given>")
        lines.append(f"context key '{key}'{detail}: {problem['msg']} (given: {given!r})")
    return "invalid CDK context:\n  " + "\n  ".join(lines)
