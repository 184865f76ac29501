"""The in-memory fakes stand in for the boto3 adapters: each must offer every method of its port.

mypy checks the signatures (the assignments below are typed as the Protocols); the runtime check
catches a port method that gained no fake counterpart even when mypy is not run.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fakes import FakeClock, FakeCompute, FakeJobStore, FakeQueue, FakeWakeup, FakeWorkflow

import spotrelay.clock
from spotrelay.control import ports

STORE: ports.JobStore = FakeJobStore()
COMPUTE: ports.Compute = FakeCompute()
WORKFLOW: ports.Workflow = FakeWorkflow()
QUEUE: ports.JobQueue = FakeQueue()
WAKEUP: ports.Wakeup = FakeWakeup()
CLOCK: ports.Clock = FakeClock()


def port_methods(protocol: type[Any]) -> set[str]:
    return {name for name, member in vars(protocol).items() if inspect.isfunction(member) and not name.startswith("_")}


@pytest.mark.parametrize(
    ("protocol", "fake"),
    [
        (ports.JobStore, FakeJobStore),
        (ports.Compute, FakeCompute),
        (ports.Workflow, FakeWorkflow),
        (ports.JobQueue, FakeQueue),
        (ports.Wakeup, FakeWakeup),
        (ports.Clock, FakeClock),
    ],
)
def test_fake_has_every_method_of_its_port_with_the_same_parameters(protocol: type[Any], fake: type[Any]) -> None:
    # Given a port and its fake
    methods = port_methods(protocol)
    assert methods, f"{protocol.__name__} declares no methods"

    # When each port method is looked up on the fake
    missing = {m for m in methods if not callable(getattr(fake, m, None))}

    # Then none is missing, and each takes the same parameters by the same names
    assert missing == set()
    for name in methods:
        expected = list(inspect.signature(getattr(protocol, name)).parameters)
        assert list(inspect.signature(getattr(fake, name)).parameters) == expected, name


def test_every_port_in_the_module_has_a_fake() -> None:
    # Given the Protocols that ports.py declares
    declared = {
        name
        for name, value in vars(ports).items()
        if inspect.isclass(value) and getattr(value, "_is_protocol", False) and value.__module__ == ports.__name__
    }

    # Then each one is covered above, and the clock is the one port of time in the codebase (spotrelay.clock)
    assert declared == {"JobStore", "Compute", "Workflow", "JobQueue", "Wakeup"}
    assert ports.Clock is spotrelay.clock.Clock
