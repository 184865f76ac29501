"""The eight Lambda functions: runtime, layer, tracing, logs, limits, environment vs settings models,
and the one shared code asset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infrastructure import REPO_ROOT
from infrastructure.synth import Synthesized, render
from spotrelay.config import ENV_STATE_MACHINE_ARN, ENV_SUBNETS, SETTINGS_BY_FUNCTION, DispatcherSettings
from spotrelay.control.admission import AdmissionLimits
from spotrelay.control.resume import RESUME_SETTLE_SECONDS
from stacks.config import DEFAULT_POWERTOOLS_LAYER_ARN
from stacks.functions_construct import FUNCTION_NAMES, POWERTOOLS_KEYS

PLACEHOLDER = "placeholder"


def _functions(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    return {
        name: synthesized.resources[logical_id]["Properties"] for name, logical_id in synthesized.function_ids().items()
    }


def test_there_is_one_function_per_settings_model(synthesized: Synthesized) -> None:
    assert set(FUNCTION_NAMES) == set(SETTINGS_BY_FUNCTION)
    assert set(_functions(synthesized)) == set(SETTINGS_BY_FUNCTION)
    synthesized.template.resource_count_is("AWS::Lambda::Function", len(FUNCTION_NAMES))


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_function_runs_python311_on_arm64_with_the_powertools_layer_and_active_tracing(
    synthesized: Synthesized, name: str
) -> None:
    function = _functions(synthesized)[name]
    assert function["Runtime"] == "python3.11"
    assert function["Architectures"] == ["arm64"]
    assert function["Handler"] == f"functions/{name}.handler"
    assert function["Layers"] == [{"Fn::Sub": DEFAULT_POWERTOOLS_LAYER_ARN}]
    assert function["TracingConfig"] == {"Mode": "Active"}
    # Its own log group, with a retention
    log_group_id = function["LoggingConfig"]["LogGroup"]["Ref"]
    assert synthesized.resources[log_group_id]["Properties"]["RetentionInDays"] == 30


def test_timeouts_and_concurrency(synthesized: Synthesized) -> None:
    functions = _functions(synthesized)
    assert {name: f["Timeout"] for name, f in functions.items()} == {
        name: 120 if name in ("dispatcher", "reconcile") else 60 for name in FUNCTION_NAMES
    }
    # A step of a stopped execution runs out within its timeout: resume waits longer than any after a run ends
    # (the dispatcher and reconcile are no steps of an execution)
    steps = {name: f["Timeout"] for name, f in functions.items() if name not in ("dispatcher", "reconcile")}
    assert max(steps.values()) < RESUME_SETTLE_SECONDS
    # Admission must not race itself: one dispatcher at a time; nothing else is limited
    assert {name: f.get("ReservedConcurrentExecutions") for name, f in functions.items()} == {
        name: 1 if name == "dispatcher" else None for name in FUNCTION_NAMES
    }


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_environment_keys_are_exactly_the_settings_model_plus_powertools(synthesized: Synthesized, name: str) -> None:
    variables = _functions(synthesized)[name]["Environment"]["Variables"]
    assert set(variables) == SETTINGS_BY_FUNCTION[name].env_keys() | set(POWERTOOLS_KEYS)
    assert variables["POWERTOOLS_SERVICE_NAME"] == "spotrelay"
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "spotrelay"
    assert variables["POWERTOOLS_LOG_LEVEL"] == variables["LOG_LEVEL"] == "INFO"


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_environment_values_satisfy_the_settings_model(synthesized: Synthesized, name: str) -> None:
    # Given the function's environment, deploy-time references replaced by placeholder text
    variables = render(_functions(synthesized)[name]["Environment"]["Variables"])
    environment = {key: value.replace("<", "").replace(">", "") for key, value in variables.items()}
    # When the function validates it at cold start, Then it parses
    settings = SETTINGS_BY_FUNCTION[name].from_env(environment)
    assert settings.model_dump(by_alias=True).keys() == SETTINGS_BY_FUNCTION[name].env_keys()


def test_subnets_are_json_by_zone_and_the_state_machine_arn_is_the_lifecycles(synthesized: Synthesized) -> None:
    variables = render(_functions(synthesized)["launch"]["Environment"]["Variables"])
    subnets = json.loads(variables[ENV_SUBNETS])
    assert len(subnets) == 2  # the created VPC's two public subnets, keyed by their AZ
    vpc_subnets = synthesized.stack.network.vpc.public_subnets
    assert sorted(subnets.values()) == sorted(f"<{synthesized.logical_id(subnet)}>" for subnet in vpc_subnets)
    state_machine = synthesized.properties(synthesized.stack.lifecycle.state_machine)
    dispatcher = render(_functions(synthesized)["dispatcher"]["Environment"]["Variables"])
    assert dispatcher[ENV_STATE_MACHINE_ARN] == (
        f"arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:stateMachine:{state_machine['StateMachineName']}"
    )


def test_the_admission_limits_output_is_what_the_dispatcher_admits_by(synthesized: Synthesized) -> None:
    # What `spotrelay submit` checks a job against, and the dispatcher's own settings: the same limits
    settings = DispatcherSettings.from_env(render(_functions(synthesized)["dispatcher"]["Environment"]["Variables"]))
    output = synthesized.json["Outputs"]["AdmissionLimits"]["Value"]
    assert AdmissionLimits.model_validate_json(output) == AdmissionLimits(
        max_concurrent_jobs=settings.max_concurrent_jobs,
        budget_usd_per_hour=settings.budget_usd_per_hour,
        spot_vcpu_quotas=settings.spot_vcpu_quotas,
        allowed_families=settings.allowed_families,
    )


def test_all_functions_share_one_code_asset(synthesized: Synthesized) -> None:
    codes = {json.dumps(f["Code"], sort_keys=True) for f in _functions(synthesized).values()}
    assert len(codes) == 1


def _asset_dir(synthesized: Synthesized) -> Path:
    code = _functions(synthesized)["dispatcher"]["Code"]
    asset_hash = code["S3Key"].removesuffix(".zip")
    return synthesized.outdir / f"asset.{asset_hash}"


def test_the_asset_holds_spotrelay_and_functions_only(synthesized: Synthesized) -> None:
    # Given the staged asset directory (what CDK zips and uploads)
    asset = _asset_dir(synthesized)
    files = [path.relative_to(asset) for path in asset.rglob("*") if path.is_file()]
    top_level = {path.parts[0] for path in files}
    # Then it holds the package and (once written) the handlers, and nothing else
    assert "spotrelay" in top_level
    assert top_level <= {"spotrelay", "functions"}
    if (REPO_ROOT / "functions").is_dir() and any((REPO_ROOT / "functions").glob("*.py")):
        assert "functions" in top_level
    assert (asset / "spotrelay" / "config.py").is_file()
    # And no caches, compiled files or hidden files
    assert not [p for p in files if "__pycache__" in p.parts or p.suffix == ".pyc" or p.name.startswith(".")]
    for unwanted in ("tests", "node_modules", ".venv", "cdk.out", "stacks", ".git"):
        assert not (asset / unwanted).exists(), unwanted
