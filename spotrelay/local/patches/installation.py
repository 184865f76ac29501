"""Installing the patches: `_Patcher` (replaces moto's attributes and puts them back), the installed state
(`installed()`, `Installed`, the one installation at a time), `install` (which runs every subsystem's patch
function, after `check_moto` and `stop_stray_executions`), and `Delivery` (what `Installed.deliveries` records).

The subsystems' patches are in the sibling modules of spotrelay.local.patches (see the package's docstring);
each imports this module for `_Patcher` and reads the installed state here (`installation._installed`).
"""

from __future__ import annotations

import gc
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

from spotrelay.local.clock import SimulationClock
from spotrelay.local.ec2_market import Ec2Market
from spotrelay.local.lambdas import InProcessLambdas
from spotrelay.local.patches.canaries import _ORIGINALS, Expected, _unwrapped, check_moto

if TYPE_CHECKING:
    from spotrelay.local.patches.dynamodb_faults import StoreFaults
    from spotrelay.local.patches.events import DeliveryFaults

logger = logging.getLogger("spotrelay.local.patches")  # the package's logger, as before the split

# stop_stray_executions stops an execution through its worker
EXPECTED: tuple[Expected, ...] = (
    Expected(
        ExecutionWorker,
        "stop",
        "(self, stop_date: datetime.datetime, error: str | None, cause: str | None)",
        ("self.env.set_stop(stop_date=stop_date, cause=cause, error=error)",),
    ),
)

_install_lock = threading.Lock()
_installed: Installed | None = None


class _Patcher:
    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    @staticmethod
    def original(owner: Any, name: str) -> Any:
        """The attribute as it is now (unwrapped from classmethod/staticmethod)."""
        return _unwrapped(owner, name)

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """Set owner.name = value, until `undo`."""
        raw = owner.__dict__[name] if inspect.isclass(owner) else getattr(owner, name)
        key = (id(owner), name)
        _ORIGINALS.setdefault(key, _unwrapped(owner, name))

        def restore() -> None:
            setattr(owner, name, raw)
            _ORIGINALS.pop(key, None)

        self._undo.append(restore)
        setattr(owner, name, value)

    def replace_contents(self, target: dict[str, Any], contents: dict[str, Any]) -> None:
        """Change a dict in place (moto's modules import some by name), until `undo`."""
        saved = dict(target)

        def restore() -> None:
            target.clear()
            target.update(saved)

        self._undo.append(restore)
        target.clear()
        target.update(contents)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@dataclass
class Installed:
    """The patches in force; `uninstall()` restores moto."""

    clock: SimulationClock
    lambdas: InProcessLambdas
    market: Ec2Market | None
    deliveries: list[Delivery]
    _patcher: _Patcher
    delivery_faults: DeliveryFaults | None = None  # Lambda targets' deliveries go through it when set
    store_faults: StoreFaults | None = None  # DynamoDB writes go through it when set

    def uninstall(self) -> None:
        global _installed
        with _install_lock:
            self._patcher.undo()
            if _installed is self:
                _installed = None


@dataclass(frozen=True)
class Delivery:
    """An event EventBridge delivered to a Lambda or Step Functions target (for diagnostics)."""

    rule: str
    target_arn: str
    event_id: str
    error: str | None


def installed() -> Installed | None:
    return _installed


def install(clock: SimulationClock, lambdas: InProcessLambdas, market: Ec2Market | None = None) -> Installed:
    """Patch moto (see the package's docstring). One installation at a time."""
    # the subsystems' patch functions (imported here: their modules import this one)
    from spotrelay.local.patches.cloudformation import _patch_cloudformation
    from spotrelay.local.patches.dynamodb_faults import _patch_dynamodb_faults
    from spotrelay.local.patches.ec2 import _patch_default_amis, _patch_ec2
    from spotrelay.local.patches.events import _patch_events
    from spotrelay.local.patches.lambda_tasks import _patch_lambda, _patch_task_failure
    from spotrelay.local.patches.s3 import _patch_s3
    from spotrelay.local.patches.speed import _patch_speed
    from spotrelay.local.patches.sqs_clock import _patch_sqs_clock
    from spotrelay.local.patches.virtual_clock import _patch_clock

    global _installed
    with _install_lock:
        if _installed is not None:
            raise RuntimeError("spotrelay.local patches are installed already: uninstall them first")
        check_moto()
        stopped = stop_stray_executions()
        if stopped:
            logger.info("stopped executions an earlier mock left running", extra={"executions": stopped})
        patcher = _Patcher()
        deliveries: list[Delivery] = []
        try:
            _patch_lambda(patcher, lambdas)
            _patch_task_failure(patcher)
            _patch_events(patcher, deliveries)
            _patch_clock(patcher, clock)
            _patch_sqs_clock(patcher, clock)
            _patch_cloudformation(patcher)
            _patch_s3(patcher)
            _patch_dynamodb_faults(patcher)
            _patch_speed(patcher)
            _patch_default_amis(patcher)
            if market is not None:
                _patch_ec2(patcher, market)
        except BaseException:
            patcher.undo()
            raise
        _installed = Installed(clock=clock, lambdas=lambdas, market=market, deliveries=deliveries, _patcher=patcher)
        return _installed


def stop_stray_executions() -> int:
    """Stop every Step Functions execution still running in this process (see the package's docstring:
    executions left behind); returns how many. Called with no patches installed."""
    stopped = 0
    now = datetime.now(UTC)
    for candidate in gc.get_objects():
        if not isinstance(candidate, ExecutionWorker):
            continue
        env = getattr(candidate, "env", None)
        if env is not None and env.is_running():
            candidate.stop(stop_date=now, error="spotrelay.local.Stale", cause="left running by an earlier mock")
            stopped += 1
    return stopped
