"""The typed configuration from CDK context: defaults, cdk.json, errors that name the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from infrastructure import REPO_ROOT
from infrastructure.synth import cdk_json_context
from stacks.config import ConfigError, SpotRelayConfig


def test_defaults_are_the_documented_ones() -> None:
    config = SpotRelayConfig()
    assert config.allowed_gpu_families == ("g4dn", "g5", "g6", "g6e", "gr6", "p4d", "p5")
    assert config.max_concurrent_jobs == 8
    assert config.budget_usd_per_hour == 50
    assert config.spot_vcpu_quotas == {"g": 64, "p": 96}
    assert config.checkpoint_retention_days == 30
    assert config.log_level == "INFO"
    assert config.heartbeat_seconds == 900
    assert config.block_minutes == 3
    assert "${AWS::Region}" in config.powertools_layer_arn
    assert config.worker_ami_ssm_parameter.startswith("/aws/service/deeplearning/ami/x86_64/")
    assert config.creates_vpc


def test_cdk_json_context_repeats_the_model_defaults() -> None:
    # cdk.json documents the defaults for operators; it must not silently differ from the model's
    context = cdk_json_context()
    ours = {key: value for key, value in context.items() if key in SpotRelayConfig.context_keys()}
    assert ours
    assert SpotRelayConfig.from_mapping(ours) == SpotRelayConfig()


def test_cdk_json_runs_the_venv_app_and_does_not_watch_generated_trees() -> None:
    settings = json.loads((REPO_ROOT / "cdk.json").read_text())
    assert settings["app"] == ".venv/bin/python app.py"
    assert {"cdk.out", "node_modules", ".venv"} <= set(settings["watch"]["exclude"])


def test_cdk_json_sets_every_recommended_feature_flag_of_the_installed_aws_cdk_lib() -> None:
    import aws_cdk

    [tarball] = (Path(aws_cdk.__file__).parent / "_jsii").glob(f"aws-cdk-lib@{version('aws-cdk-lib')}.jsii.tgz")
    with tarfile.open(tarball) as archive:
        member = archive.extractfile("package/recommended-feature-flags.json")
        assert member is not None
        recommended: dict[str, Any] = json.load(member)
    context = cdk_json_context()
    assert {flag: context.get(flag) for flag in recommended} == recommended


def test_cli_strings_parse_like_json_values() -> None:
    config = SpotRelayConfig.from_mapping(
        {
            "vpc_id": "vpc-0123456789abcdef0",
            "subnets": '[{"id": "subnet-0123abcd", "availability_zone": "us-east-1a"}]',
            "allowed_gpu_families": "g5, g6e",
            "spot_vcpu_quotas": '{"g": 128}',
            "max_concurrent_jobs": "4",
        }
    )
    assert config.subnets[0].id == "subnet-0123abcd"
    assert config.allowed_gpu_families == ("g5", "g6e")
    assert config.spot_vcpu_quotas == {"g": 128}
    assert config.max_concurrent_jobs == 4
    assert not config.creates_vpc


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"max_concurrent_jobs": 0}, "max_concurrent_jobs"),
        ({"budget_usd_per_hour": "-1"}, "budget_usd_per_hour"),
        ({"allowed_gpu_families": "g5,x99"}, "allowed_gpu_families"),
        ({"spot_vcpu_quotas": "{not json"}, "spot_vcpu_quotas"),
        ({"log_level": "LOUD"}, "log_level"),
        ({"subnets": '[{"id": "subnet-1"}]', "vpc_id": "vpc-0123456789abcdef0"}, "subnets"),
        ({"vpc_id": "vpc-0123456789abcdef0"}, "vpc_id and subnets"),
        ({"allowed_gpu_families": "g5", "spot_vcpu_quotas": {"p": 96}}, "spot_vcpu_quotas"),
        ({"heartbeat_seconds": 5}, "heartbeat_seconds"),
        ({"max_concurent_jobs": 4}, "max_concurent_jobs"),
    ],
)
def test_invalid_context_fails_naming_the_key(context: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        SpotRelayConfig.from_mapping(context)


def test_app_exits_with_the_message_on_invalid_context(tmp_path: Path) -> None:
    # Given the context the CDK CLI would pass, with an invalid value
    environment = os.environ | {
        "CDK_CONTEXT_JSON": json.dumps({"max_concurrent_jobs": 0}),
        "CDK_OUTDIR": str(tmp_path),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    # When app.py runs, Then it stops with a message naming the key, and writes nothing
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "context key 'max_concurrent_jobs'" in result.stderr
    assert not list(tmp_path.iterdir())


def test_package_json_pins_the_cdk_cli_to_2x() -> None:
    package = json.loads((REPO_ROOT / "package.json").read_text())
    assert package["devDependencies"]["aws-cdk"] == "^2.1148.0"
    lock = json.loads((REPO_ROOT / "package-lock.json").read_text())
    locked = lock["packages"]["node_modules/aws-cdk"]["version"]
    major, minor, _ = (int(part) for part in locked.split("."))
    assert (major, minor) >= (2, 1148)
    assert major == 2
