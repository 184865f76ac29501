"""The nine Lambda functions: one shared code asset, the Powertools layer, one role each.

Code: ONE asset of the repository root holding exactly the handler modules (`functions/<name>.py`)
and the modules of ours they import at run time, transitively, with the packages on the way
(`runtime_imports`, an AST walk: imports inside functions count, those under `if TYPE_CHECKING:` do
not). It is computed at every synth, so a new import lands in the asset by itself, and what only the
CLI, the local runtime, the benchmark or the agent use stays out. Built by copying files: no Docker, no
bundling. Dependencies come from the runtime (boto3) and the Powertools layer (Powertools and pydantic
v2). Nothing else is installed: a handler must not import what needs `spotrelay`'s other dependencies
(the CLI's typer and rich, PyYAML) at module level.

Environment: exactly the keys of the function's settings model (`SETTINGS_BY_FUNCTION[name]`,
validated at the function's cold start) plus the Powertools/log-level keys. A settings field the
stack cannot fill stops the synth, naming the function and the variable, so code and infrastructure
cannot drift apart.

Each function gets its own role with no managed policy: write access to its own log group and, via
active tracing, X-Ray; everything else is granted by `iam_construct`.

Dead letters: an asynchronously invoked function of DEAD_LETTERED_FUNCTIONS (ec2_events: EventBridge's
EC2 events) has its own SQS DLQ (KMS, a rotated key of its own, TLS only, 14 days). Lambda retries a failed
asynchronous invocation twice (1 and 2 minutes later), then sends the event there; `spotrelay admin
redrive` invokes the function with each one again (the README's runbook). Its URL and the function's name
are stack outputs (spotrelay.aws.recovery names them). The dispatcher's and reconcile's asynchronous
events (the schedule, the queue-depth alarm) need none: the next schedule does their work.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath

from aws_cdk import CfnOutput, Duration, Fn, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from spotrelay.aws.recovery import DEAD_LETTERED_FUNCTIONS, dead_letter_queue_output, function_name_output
from spotrelay.config import ENV_DISPATCHER_FUNCTION, METRICS_NAMESPACE, SETTINGS_BY_FUNCTION
from stacks.config import SpotRelayConfig
from stacks.keys import stack_key
from stacks.suppressions import acknowledge

FUNCTION_NAMES = (
    "dispatcher",
    "place",
    "launch",
    "ec2_events",
    "recover",
    "finalize",
    "reconcile",
    "cancel",
    "resume",
    "vend",
)
SERVICE_NAME = "spotrelay"
RUNTIME = lambda_.Runtime.PYTHON_3_11
DEFAULT_TIMEOUT = Duration.seconds(60)
TIMEOUTS = {"dispatcher": Duration.seconds(120), "reconcile": Duration.seconds(120)}
MEMORY_MB = 512
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
DEAD_LETTER_RETENTION = Duration.days(14)  # SQS's longest: two weeks to notice an outage and redrive
# Keys the stack sets on every function, next to the settings model's keys.
POWERTOOLS_KEYS = ("POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_LOG_LEVEL", "LOG_LEVEL")

DESCRIPTIONS = {
    "dispatcher": "Admits queued jobs within quotas, budget and max concurrency; starts their JobLifecycle",
    "place": "Ranks the GPU pools that fit a job and picks one (JobLifecycle Place)",
    "launch": "Launches the job's worker on the chosen pool and parks the task token (JobLifecycle Run)",
    "ec2_events": "Spot interruption, rebalance and state-change events: block pools, fail task tokens",
    "recover": "After an interruption or failure: waits for the checkpoint and chooses how to go on",
    "finalize": "Terminates the worker, totals the cost, records the outcome, wakes the dispatcher",
    "reconcile": "Safety net: terminates orphaned instances, repairs stuck jobs and attempts",
    "cancel": "Stops a job wherever it is and terminates its instance",
    "resume": "Queues a FAILED or CANCELLED job again, as a new run from its newest checkpoint",
    "vend": "Gives a worker instance's agent credentials for its own job only (token vending machine)",
}


def pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def handler_modules() -> tuple[str, ...]:
    """The module each function's handler lives in (`functions.place`, ...)."""
    return tuple(f"functions.{name}" for name in FUNCTION_NAMES)


def runtime_imports(code_root: Path, entry_points: Iterable[str]) -> frozenset[str]:
    """The modules under `code_root` that importing `entry_points` can run: the entry points, every
    module they import (at module level or inside a function: a lazy import runs on Lambda too),
    transitively, and every package on the way (importing `a.b.c` runs `a/__init__.py` and
    `a/b/__init__.py`, whose own imports count). Imports under `if TYPE_CHECKING:` never run and do not
    count; modules outside `code_root` (boto3, Powertools, pydantic) come from the runtime and the layer.
    A module imported by a computed name (`importlib.import_module(name)`) is not seen: our code has none."""
    found: set[str] = set()
    pending = list(entry_points)
    while pending:
        name = pending.pop()
        source = _source(code_root, name)
        if name in found or source is None:
            continue
        found.add(name)
        parts = name.split(".")
        pending.extend(".".join(parts[:end]) for end in range(1, len(parts)))
        package = name if source.name == "__init__.py" else ".".join(parts[:-1])
        pending.extend(_imported_names(source, package))
    return frozenset(found)


def _source(code_root: Path, module: str) -> Path | None:
    """The file `module` is loaded from, if it is under `code_root` (None for a class or constant
    imported by `from module import Name`, and for modules from elsewhere)."""
    base = code_root.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(source: Path, package: str) -> Iterator[str]:
    """What the import statements of `source` (a module of `package`) name that can run: each module,
    and for `from m import x` also `m.x` (which may be a submodule; `runtime_imports` drops it if not)."""
    for node in _run_time_nodes(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []  # `from .. import x`
            origin = ".".join([*base, *([node.module] if node.module else [])])
            yield origin
            yield from (f"{origin}.{alias.name}" for alias in node.names)


def _run_time_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of the tree except the bodies of `if TYPE_CHECKING:` (their `else:` does run)."""
    for child in ast.iter_child_nodes(node):
        yield child
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for orelse in child.orelse:
                yield orelse
                yield from _run_time_nodes(orelse)
        else:
            yield from _run_time_nodes(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def asset_files(code_root: Path) -> tuple[str, ...]:
    """The asset's files, relative to `code_root`: the sources of `runtime_imports` of the handlers."""
    modules = runtime_imports(code_root, handler_modules())
    sources = (_source(code_root, module) for module in modules)
    return tuple(sorted(source.relative_to(code_root).as_posix() for source in sources if source is not None))


def asset_excludes(files: Iterable[str]) -> list[str]:
    """CDK exclude globs that keep exactly `files` (and their directories) of the asset's root.

    The last matching rule wins; a pattern without a slash matches a name in any directory. So "*" and
    ".*" (which "*" does not cover: .venv, .git) exclude everything, then a "!" rule takes back each
    directory on the way to a kept file (CDK does not look inside an excluded directory) and the file."""
    kept = sorted(files)
    directories = sorted({str(parent) for file in kept for parent in PurePosixPath(file).parents} - {"."})
    return ["*", ".*", *(f"!{directory}" for directory in directories), *(f"!{file}" for file in kept)]


class Functions(Construct):
    """`functions[name]`, `roles[name]`, `log_groups[name]` for every name in FUNCTION_NAMES;
    `dead_letter_queues[name]` for DEAD_LETTERED_FUNCTIONS, encrypted with `dead_letter_key`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: SpotRelayConfig,
        code_root: Path,
        settings_values: Mapping[str, str],
    ) -> None:
        super().__init__(scope, id)
        if set(FUNCTION_NAMES) != set(SETTINGS_BY_FUNCTION):
            raise ValueError(f"functions {sorted(FUNCTION_NAMES)} != settings models {sorted(SETTINGS_BY_FUNCTION)}")
        layer_arn = config.powertools_layer_arn
        self.layer = lambda_.LayerVersion.from_layer_version_arn(
            self, "PowertoolsLayer", Fn.sub(layer_arn) if "${" in layer_arn else layer_arn
        )
        self.code = lambda_.Code.from_asset(str(code_root), exclude=asset_excludes(asset_files(code_root)))
        self.functions: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        self.dead_letter_key = stack_key(
            self,
            "DeadLetterKey",
            description=f"{Stack.of(self).stack_name}: encrypts the events the functions could not handle (DLQs)",
        )
        values = dict(settings_values)
        for name in FUNCTION_NAMES:  # dispatcher first: finalize's settings name it
            self._add_function(name, config, values)
            if name == "dispatcher":
                values[ENV_DISPATCHER_FUNCTION] = self.functions[name].function_name

    def _add_function(self, name: str, config: SpotRelayConfig, values: Mapping[str, str]) -> None:
        settings_keys = SETTINGS_BY_FUNCTION[name].env_keys()
        unknown = sorted(settings_keys - set(values))
        if unknown:
            raise ValueError(
                f"function '{name}': its settings model wants environment variables {unknown}, "
                "which the stack does not provide (add them to the settings values in stacks/scheduler_stack.py)"
            )
        environment = {
            "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": config.log_level,
            "LOG_LEVEL": config.log_level,
        } | {key: values[key] for key in sorted(settings_keys)}

        id = pascal(name)
        role = iam.Role(
            self,
            f"{id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"spotrelay {name} function",
        )
        log_group = logs.LogGroup(self, f"{id}Logs", retention=LOG_RETENTION)
        log_group.grant_write(role)
        dead_letter_queue = self._dead_letter_queue(name, role) if name in DEAD_LETTERED_FUNCTIONS else None
        function = lambda_.Function(
            self,
            id,
            description=f"spotrelay {name}: {DESCRIPTIONS[name]}",
            runtime=RUNTIME,
            architecture=lambda_.Architecture.ARM_64,
            handler=f"functions/{name}.handler",
            code=self.code,
            layers=[self.layer],
            role=role,
            memory_size=MEMORY_MB,
            timeout=TIMEOUTS.get(name, DEFAULT_TIMEOUT),
            environment=environment,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            # Admission reads quotas, budget and running jobs, then starts executions: one at a time,
            # or two dispatchers could both admit into the last free slot.
            reserved_concurrent_executions=1 if name == "dispatcher" else None,
            dead_letter_queue=dead_letter_queue,
        )
        if dead_letter_queue is not None:
            stack = Stack.of(self)
            CfnOutput(stack, function_name_output(name), value=function.function_name)
            CfnOutput(
                stack,
                dead_letter_queue_output(name),
                value=dead_letter_queue.queue_url,
                description=f"{name}: the events Lambda gave up on (spotrelay admin redrive)",
            )
        acknowledge(
            function,
            "L1",
            "Python 3.11 is pinned on purpose: the Powertools layer (python311-arm64 build, carrying "
            "pydantic v2 compiled for 3.11) and the code's tested interpreter must match.",
        )
        acknowledge(
            role,
            "IAM5[Resource::*]",
            "Active X-Ray tracing: xray:PutTraceSegments and xray:PutTelemetryRecords support no "
            "resource-level permissions (CDK adds them for Tracing.ACTIVE); no other '*' is in this policy.",
        )
        self.functions[name] = function
        self.roles[name] = role
        self.log_groups[name] = log_group

    def _dead_letter_queue(self, name: str, role: iam.Role) -> sqs.Queue:
        """Where Lambda sends an asynchronous event of `name` it gave up on; Lambda sends it with the
        function's role (sqs:SendMessage, granted by the function's DeadLetterConfig, and the key)."""
        queue = sqs.Queue(
            self,
            f"{pascal(name)}DeadLetterQueue",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=self.dead_letter_key,
            enforce_ssl=True,
            retention_period=DEAD_LETTER_RETENTION,
        )
        self.dead_letter_key.grant(role, "kms:GenerateDataKey", "kms:Decrypt")
        self.dead_letter_queues[name] = queue
        return queue
