"""The moto patches: the canary on the pinned moto's signatures, and install/uninstall."""

from __future__ import annotations

import inspect
import json
from typing import Any

import boto3
import moto
import pytest
from moto import mock_aws
from moto.awslambda.models import LambdaFunction
from moto.ec2.models import instance_types as moto_instance_types
from moto.events.models import Rule
from moto.stepfunctions import responses as sfn_responses
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.asl.eval.callback import callback
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from waiting import POLLING, eventually

from spotrelay.local import patches
from spotrelay.local.clock import VirtualClock
from spotrelay.local.ec2_market import Ec2Market
from spotrelay.local.lambdas import InProcessLambdas

from .conftest import START, example_market

PATCHED = (
    (LambdaFunction, "_invoke_lambda"),
    (Rule, "send_to_targets"),
    (ExecutionWorker, "start"),
    (WaitFunction, "_wait_interval"),
    (retrier_decl, "time"),
    (callback, "Event"),
)


def test_the_pinned_moto_is_what_the_patches_were_written_against() -> None:
    # Given the moto in the lock file, When its patched attributes are compared, Then none differs
    assert patches.moto_differences() == []


def test_the_canary_names_a_changed_signature() -> None:
    # Given an expectation moto does not meet (as after an upgrade that changed a private method)
    changed = patches.Expected(LambdaFunction, "_invoke_lambda", "(self, event: 'str | None' = None, extra=1)")
    # When checked, Then the difference names the method and both signatures
    (problem,) = patches.moto_differences([changed])
    assert "LambdaFunction._invoke_lambda" in problem
    assert "(self, event: 'str | None' = None) -> 'tuple[str, bool, str]'" in problem


def test_the_canary_names_a_line_the_patch_depends_on() -> None:
    missing = patches.Expected(retrier_decl.RetrierDecl, "_eval_body", None, ("time.sleep(interval_seconds * 2)",))
    (problem,) = patches.moto_differences([missing])
    assert "no longer contains 'time.sleep(interval_seconds * 2)'" in problem


def test_install_refuses_a_moto_that_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock(START)
    monkeypatch.setattr(moto, "__version__", "6.0.0")
    with pytest.raises(patches.MotoChanged, match=r"moto 6\.0\.0 is installed"):
        patches.install(clock, InProcessLambdas(clock))
    assert patches.installed() is None


def test_install_patches_and_uninstall_restores_moto() -> None:
    # Given moto as shipped
    before = {(owner, name): inspect.getattr_static(owner, name) for owner, name in PATCHED}
    types_before = dict(moto_instance_types.INSTANCE_TYPES)
    clock = VirtualClock(START)
    # When the patches are installed (with a market: the EC2 ones too)
    installed = patches.install(clock, InProcessLambdas(clock), Ec2Market(example_market(), clock))
    try:
        # Then every patched attribute is replaced, the canary still reads the originals, and the
        # catalog's GPU types moto lacked are known
        for owner, name in PATCHED:
            assert inspect.getattr_static(owner, name) is not before[(owner, name)], name
        assert patches.moto_differences() == []
        assert {"p3.2xlarge", "p3.8xlarge"} <= moto_instance_types.INSTANCE_TYPES.keys()
        assert moto_instance_types.INSTANCE_TYPES["p3.8xlarge"]["GpuInfo"]["Gpus"][0]["Count"] == 4
        # And a second installation is refused
        with pytest.raises(RuntimeError, match="installed already"):
            patches.install(clock, InProcessLambdas(clock))
    finally:
        installed.uninstall()
    # When uninstalled, Then moto is as it was
    for owner, name in PATCHED:
        assert inspect.getattr_static(owner, name) is before[(owner, name)], name
    assert types_before == moto_instance_types.INSTANCE_TYPES
    assert "p3.2xlarge" not in moto_instance_types.INSTANCE_TYPES
    assert patches.installed() is None


def _started_wait(sfn: Any, arn: str) -> None:
    """Return once the execution entered its Wait state (moto runs it on its own thread, which signals nothing
    here)."""

    def entered() -> bool:
        return any(e["type"] == "WaitStateEntered" for e in sfn.get_execution_history(executionArn=arn)["events"])

    eventually(entered, f"{arn} entering its Wait state", on=POLLING)


def test_install_stops_executions_an_earlier_mock_left_running() -> None:
    # Given an execution that a plain moto mock (a test's) left waiting in real time: when its Wait
    # ended it would run its next state under whatever is patched and mocked then
    definition = {
        "StartAt": "Wait",
        "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "Next": "After"}, "After": {"Type": "Pass", "End": True}},
    }
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        machine = sfn.create_state_machine(
            name="left-behind", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/sfn"
        )["stateMachineArn"]
        arn = sfn.start_execution(stateMachineArn=machine)["executionArn"]
        _started_wait(sfn, arn)
        backend = sfn_responses.get_backend("123456789012", "us-east-1")
        worker: ExecutionWorker | None = getattr(backend.describe_execution(arn), "exec_worker", None)
    assert worker is not None
    env = worker.env
    assert env is not None
    assert env.is_running()
    # When the local runtime's patches are installed
    clock = VirtualClock(START)
    installed = patches.install(clock, InProcessLambdas(clock))
    installed.uninstall()
    # Then that execution is stopped: it runs no further state
    assert not env.is_running()
    assert type(env.program_state()).__name__ == "ProgramStopped"
