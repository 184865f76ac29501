"""Lambda functions run in-process: the handler a function's `Handler` names, imported from the
project's checkout and called with the function's environment, as the Lambda runtime would.

One module instance per function (per ARN and configuration): `functions/place.py` deployed twice
with different environments is imported twice, each time with its own environment set, under a
unique module name, because the handlers read their settings and build their boto3 clients at
import. A module's `clock` attribute (if it has one) is replaced by the simulation's clock.

Exceptions come back as Lambda's error envelope `{"errorMessage", "errorType", "requestId",
"stackTrace"}`, so Step Functions' Retry/Catch match on `errorType` (the exception's class name, e.g.
InsufficientInstanceCapacity, JobCancelled, ConflictError), exactly as on AWS.

A function's environment is applied only for the thread that runs its handler (see
`spotrelay.local.function_environment`, installed on `os.environ` when an `InProcessLambdas` is
made): on that thread `os.environ`/`os.getenv` show the process's environment with the function's
variables applied and the other functions' SCRUBBED_PREFIXES variables hidden; every other thread
(moto's Step Functions executions, the local server's request threads, the caller) keeps seeing the
process's environment, which is never changed by an invocation (set and popped in the shared
`os.environ`, it would make botocore raise KeyError when it makes a client on another thread meanwhile).
Writes a handler makes to `os.environ` stay in its invocation's view and are gone after it.

A fault hook (`InProcessLambdas.faults`, spotrelay.local.chaos) may fail an invocation before its
handler runs or after it returned (its work done), with the error type it names, as Lambda itself fails one.

`AsynchronousInvocations` is what Lambda does with an asynchronous invocation (EventBridge's) that fails:
"two more times, with a one-minute wait between the first two attempts, and two minutes between the
second and third attempts" (AWS Lambda Developer Guide, How Lambda handles errors and retries with
asynchronous invocation, https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html),
then the event goes to the function's dead-letter queue if it has one, or is discarded. The chaos and a
scenario's outage of the functions (spotrelay.local.outages) both deliver through it.

Invocations are still serialized by one re-entrant lock (the module cache, the request ids and the
list of invocations are shared, and handlers were written to run one at a time); a handler may invoke
another function (finalize wakes the dispatcher), which runs nested, in the same thread, with its
own environment (made from the process's, not from its caller's), and the caller's is back after.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from aws_lambda_powertools import Metrics

from spotrelay.local import function_environment
from spotrelay.local.clock import SimulationClock

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout the handlers are imported from (`functions/` sits next to `spotrelay/`)."""

# Variables a function sees only if its own configuration sets them.
SCRUBBED_PREFIXES = ("SPOTRELAY_", "POWERTOOLS_", "AWS_LAMBDA_")

# What the Lambda runtime sets, plus what in-process execution needs:
# - AWS_MAX_ATTEMPTS=1: no SDK retries inside handlers. moto never throttles, and an SDK retry (of
#   EC2's HTTP 500 InsufficientInstanceCapacity, for one) would sleep in real time.
# - POWERTOOLS_TRACE_DISABLED: there is no X-Ray daemon.
RUNTIME_ENV = {"AWS_MAX_ATTEMPTS": "1", "POWERTOOLS_TRACE_DISABLED": "true"}

QUIET_ENV = {"POWERTOOLS_LOG_LEVEL": "ERROR", "POWERTOOLS_METRICS_DISABLED": "true"}
"""Overrides that keep the handlers' logs and EMF metrics off stdout (the replay prints its own)."""


def _end_metric_set() -> None:
    """End the invocation's EMF metric set, as `@metrics.log_metrics` does on Lambda when it flushes.

    With POWERTOOLS_METRICS_DISABLED, Powertools (3.x) skips the flush *and* the clear, so the
    metrics of every in-process invocation pile up in its process-wide metric set (shared by all
    `Metrics` instances) until `add_metric` reaches 100 values and prints them to stdout regardless
    of the setting: into whatever output the process had then (a CLI test's, once). On Lambda each
    invocation's set ends with it; here too."""
    Metrics().clear_metrics()


class LambdaFunctionLike(Protocol):
    """The attributes of moto's LambdaFunction the runtime reads."""

    function_arn: str
    function_name: str
    handler: str
    region: str
    environment_vars: dict[str, str]
    memory_size: int
    timeout: int
    version: str
    code_sha_256: str


@dataclass(frozen=True)
class LambdaContext:
    """The Lambda context object (what Powertools and handlers read)."""

    function_name: str
    function_version: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    log_group_name: str
    log_stream_name: str
    timeout_seconds: int

    def get_remaining_time_in_millis(self) -> int:
        return self.timeout_seconds * 1000  # the full timeout: nothing runs against real time here


@dataclass
class Invocation:
    """One handler call, recorded when it starts (a nested call comes after its caller), for
    diagnostics: what ran, with what, and the error type if it raised."""

    function_name: str
    request_id: str
    event: Any = field(repr=False)
    error_type: str | None = None
    result: Any = field(default=None, repr=False)  # what the handler returned (None if it raised)


@dataclass(frozen=True)
class InvocationFault:
    """An invocation failed from outside its handler: before the handler runs, or after it returned."""

    error_type: str  # the error envelope's errorType (what a Step Functions Retry matches)
    after_handler: bool


class InvocationFaults(Protocol):
    """Decides, as an invocation starts, whether it fails around its handler (None: it does not)."""

    def fault_for(self, function_name: str) -> InvocationFault | None: ...


ASYNC_RETRY_WAITS = (60.0, 120.0)  # Lambda's retries of a failed asynchronous invocation (the docstring)


class AsynchronousHost(Protocol):
    """What Lambda's retries need: the clock's now, an agenda, a timeline."""

    def now(self) -> datetime: ...

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None: ...

    def note(self, job: str, text: str, when: datetime | None = None) -> None: ...


DeadLetter = Callable[[str, Any, str], bool]
"""(function name, the event, the last error) -> whether the function has a DLQ and the event went there."""


class AsynchronousInvocations:
    """Lambda's asynchronous invocations of one runtime: `invoke(name, send, event)` makes the first attempt
    now, and retries a failed one (`send()` returns its error) ASYNC_RETRY_WAITS later on the host's agenda;
    after the last, `dead_letter` (if set) gets the event. `who(name)` is how the timeline names a function
    (its handler module); `label` is the timeline's column for the notes."""

    def __init__(self, host: AsynchronousHost, *, label: str = "lambda", who: Callable[[str], str] | None = None):
        self.host = host
        self.label = label
        self.who = who or (lambda name: name)
        self.dead_letter: DeadLetter | None = None
        self.given_up: list[tuple[datetime, str, bool]] = []  # (when, function, dead-lettered)

    def invoke(self, name: str, send: Callable[[], str | None], event: Any, attempt: int = 1) -> None:
        error = send()
        if error is None:
            return
        module = self.who(name)
        if attempt <= len(ASYNC_RETRY_WAITS):
            wait = ASYNC_RETRY_WAITS[attempt - 1]
            text = f"{module}: asynchronous attempt {attempt} failed: Lambda retries it {wait:.0f} s later"
            self.host.note(self.label, text)
            self.host.schedule(
                self.host.now() + timedelta(seconds=wait),
                f"retry of {name}",
                lambda: self.invoke(name, send, event, attempt + 1),
            )
            return
        dead_lettered = self.dead_letter is not None and self.dead_letter(name, event, error)
        self.given_up.append((self.host.now(), module, dead_lettered))
        where = "sends the event to its DLQ" if dead_lettered else "discards the event"
        self.host.note(self.label, f"{module}: asynchronous attempt {attempt} failed too: Lambda {where}")


class InjectedFault(RuntimeError):
    """An invocation failed by `InProcessLambdas.faults`, not by its handler."""


class HandlerNotFound(RuntimeError):
    """The function's Handler does not name a Python file under the code root."""


def handler_location(handler: str, code_root: Path) -> tuple[Path, str]:
    """`functions/place.handler` (or `functions.place.handler`) -> (<root>/functions/place.py, "handler")."""
    module_part, dot, attribute = handler.rpartition(".")
    if not dot or not module_part or not attribute:
        raise HandlerNotFound(f"handler {handler!r} is not <module>.<function>")
    relative = module_part.replace(".", "/") if "/" not in module_part else module_part
    path = (code_root / f"{relative}.py").resolve()
    if not path.is_file():
        raise HandlerNotFound(f"handler {handler!r}: no file {path}")
    return path, attribute


def error_envelope(error: BaseException, request_id: str, error_type: str | None = None) -> dict[str, Any]:
    return {
        "errorMessage": str(error),
        "errorType": error_type or type(error).__name__,
        "requestId": request_id,
        "stackTrace": traceback.format_tb(error.__traceback__),
    }


class InProcessLambdas:
    """Imports and calls handlers; `invoke` is what the patched `LambdaFunction._invoke_lambda` calls."""

    def __init__(
        self,
        clock: SimulationClock,
        *,
        code_root: Path = REPO_ROOT,
        overrides: Mapping[str, str] | None = None,
        request_ids: Iterator[str] | None = None,
    ) -> None:
        self.clock = clock
        self.code_root = code_root
        self.overrides = dict(overrides or {})
        self._request_ids = request_ids
        self._lock = threading.RLock()
        self._modules: dict[str, ModuleType] = {}
        self._count = 0
        self.invocations: list[Invocation] = []
        self.faults: InvocationFaults | None = None  # spotrelay.local.chaos: invocations failed on purpose
        function_environment.install()  # os.environ shows a function's variables on its handler's thread only

    # --- modules -----------------------------------------------------------------------------------

    def environment(self, function: LambdaFunctionLike) -> dict[str, str]:
        """Exactly what the function sees of the environment that its configuration decides."""
        region = function.region
        return {
            **RUNTIME_ENV,
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
            "AWS_LAMBDA_FUNCTION_NAME": function.function_name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(function.memory_size),
            "AWS_LAMBDA_FUNCTION_VERSION": str(function.version),
            "_HANDLER": function.handler,
            **{str(k): str(v) for k, v in (function.environment_vars or {}).items()},
            **self.overrides,
        }

    def module_for(self, function: LambdaFunctionLike) -> ModuleType:
        """The function's own module instance (imported on first use, with its environment set)."""
        environment = self.environment(function)
        fingerprint = hashlib.sha256(
            json.dumps(
                [function.function_arn, function.handler, function.code_sha_256, environment], sort_keys=True
            ).encode()
        ).hexdigest()[:12]
        with self._lock:
            module = self._modules.get(fingerprint)
            if module is not None:
                return module
            path, _ = handler_location(function.handler, self.code_root)
            safe_name = re.sub(r"\W", "_", function.function_name)
            name = f"spotrelay_local_lambda_{safe_name}_{fingerprint}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise HandlerNotFound(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            with self._environment(environment):
                sys.modules[name] = module  # pydantic resolves the module's annotations through sys.modules
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            if hasattr(module, "clock"):
                vars(module)["clock"] = self.clock
            self._modules[fingerprint] = module
            return module

    def unload(self) -> None:
        """Forget every imported function module (the next invocation is a cold start)."""
        with self._lock:
            for module in self._modules.values():
                sys.modules.pop(module.__name__, None)
            self._modules.clear()

    # --- invocation --------------------------------------------------------------------------------

    def invoke(self, function: LambdaFunctionLike, event: Any) -> tuple[str, bool, str]:
        """(response payload as JSON, errored, logs): the contract of moto's `_invoke_lambda`."""
        if isinstance(event, str | bytes):
            with suppress(json.JSONDecodeError):
                event = json.loads(event or "{}")
        with self._lock:
            self._count += 1
            request_id = next(self._request_ids) if self._request_ids is not None else f"local-{self._count:08d}"
            record = Invocation(function.function_name, request_id, event)
            self.invocations.append(record)
            try:
                module = self.module_for(function)
            except HandlerNotFound as e:
                return self._failed(record, e, "Runtime.HandlerNotFound")
            except (ImportError, SyntaxError) as e:
                return self._failed(record, e, "Runtime.ImportModuleError")
            except Exception as e:  # an init error (settings that do not validate, ...)
                return self._failed(record, e)
            _, attribute = handler_location(function.handler, self.code_root)
            handler = getattr(module, attribute, None)
            if not callable(handler):
                return self._failed(
                    record, HandlerNotFound(f"{function.handler}: no callable"), "Runtime.HandlerNotFound"
                )
            context = LambdaContext(
                function_name=function.function_name,
                function_version=str(function.version),
                invoked_function_arn=function.function_arn,
                memory_limit_in_mb=int(function.memory_size),
                aws_request_id=request_id,
                log_group_name=f"/aws/lambda/{function.function_name}",
                log_stream_name=f"local/{request_id}",
                timeout_seconds=int(function.timeout),
            )
            fault = self.faults.fault_for(function.function_name) if self.faults is not None else None
            if fault is not None and not fault.after_handler:
                crash = InjectedFault(f"injected: {function.function_name} failed before its handler ran")
                return self._failed(record, crash, fault.error_type)
            try:
                with self._environment(self.environment(function)):
                    result = handler(event, context)
            except Exception as e:
                return self._failed(record, e)
            finally:
                _end_metric_set()
            record.result = result  # kept when a fault fails it now: the handler's work is done
            if fault is not None:
                crash = InjectedFault(f"injected: {function.function_name} failed after its handler returned")
                return self._failed(record, crash, fault.error_type)
            return json.dumps(result, default=str), False, ""

    @staticmethod
    def _failed(record: Invocation, error: BaseException, error_type: str | None = None) -> tuple[str, bool, str]:
        envelope = error_envelope(error, record.request_id, error_type)
        record.error_type = envelope["errorType"]
        return json.dumps(envelope), True, "".join(traceback.format_exception(error))

    @contextmanager
    def _environment(self, environment: Mapping[str, str]) -> Iterator[None]:
        """On this thread only: `environment` applied over the process's environment, other functions'
        settings hidden. Nothing changes in the shared os.environ (see the module docstring)."""
        with function_environment.function_environment(environment, SCRUBBED_PREFIXES):
            yield
