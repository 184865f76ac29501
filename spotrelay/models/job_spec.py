"""The job spec: what a user submits, as YAML (`spotrelay submit job.yaml`) or JSON (an SQS message).

Only `name`, `run.command` or `run.image`, and `resources.gpus` are required. Anything else has a
default a user would expect. Unknown keys, wrong types and requests no EC2 GPU type can satisfy are
rejected with a message that names the field and says what is allowed (`JobSpecError`).
"""

from __future__ import annotations

import json
import re
import types
import typing
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from spotrelay.catalog import GPU_MODELS, INSTANCE_TYPES, InstanceType, relative_speed


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 is admitted first."""
        return {"high": 0, "normal": 1, "low": 2}[self.value]


class Objective(StrEnum):
    COST_TO_FINISH = "cost-to-finish"  # price x remaining work / speed + expected interruption overhead
    HOURLY = "hourly"  # the hourly price alone


class RecoveryStrategyName(StrEnum):
    EAGER_NEXT_POOL = "eager-next-pool"
    SAME_POOL_FIRST = "same-pool-first"


class SpecFieldError(ValueError):
    """A check across fields that still names the one field a user has to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX's portable environment variable names


class RunSpec(_Spec):
    image: str | None = Field(default=None, min_length=1, description="container image, run with GPUs")
    command: str | None = Field(default=None, min_length=1, description="shell command (in the image if any)")
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env", mode="before")
    @classmethod
    def _text_only(cls, env: Any, info: ValidationInfo) -> Any:
        """The job's environment holds text. A value YAML or JSON read as a number or a boolean is refused,
        not turned back into text: its text is lost (2.10 reads as 2.1, 0755 as 493, 12:30 as 750, yes as
        True). Names are what a shell and the agent can pass on."""
        if not isinstance(env, dict):
            return env
        for key, value in env.items():
            # names: at submission only (a record stored before the rule must still read back)
            if _submitted(info) and not (isinstance(key, str) and ENV_NAME.fullmatch(key)):
                raise SpecFieldError(
                    f"run.env.{key}", "not an environment variable name: use letters, digits and _, not first a digit"
                )
            if not isinstance(value, str):
                raise SpecFieldError(
                    f"run.env.{key}",
                    f"{value} is not text: YAML and JSON read an unquoted value as a number, boolean or date and lose "
                    f"how it was written (2.10 reads as 2.1, 0755 as 493, yes as True); quote it as written, e.g. "
                    f'{key}: "..."',
                )
        return env

    @model_validator(mode="after")
    def _image_or_command(self) -> Self:
        if self.image is None and self.command is None:
            raise ValueError("give run.image, run.command, or both")
        return self


class ResourcesSpec(_Spec):
    gpus: int = Field(strict=True, ge=1, description="GPUs the job uses")
    gpu_memory_gib: float | None = Field(strict=True, default=None, gt=0, description="minimum memory of each GPU")
    gpu_models: tuple[str, ...] | None = Field(default=None, min_length=1, description="accepted GPU models")
    min_vcpus: int | None = Field(strict=True, default=None, ge=1)
    min_memory_gib: float | None = Field(strict=True, default=None, gt=0)

    @field_validator("gpu_models")
    @classmethod
    def _known_models(cls, models: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if models is None:
            return None
        canonical = {m.lower(): m for m in GPU_MODELS}  # `a100` is the A100
        unknown = [m for m in models if m.lower() not in canonical]
        if unknown:
            raise ValueError(f"unknown GPU model {', '.join(map(repr, unknown))}; allowed: {', '.join(GPU_MODELS)}")
        return tuple(dict.fromkeys(canonical[m.lower()] for m in models))

    def misfit(self, instance_type: InstanceType) -> str | None:
        """Why `instance_type` cannot run this job, or None if it can."""
        t = instance_type
        if self.gpu_models is not None and t.gpu_model not in self.gpu_models:
            return f"GPU {t.gpu_model} not in gpu_models"
        if t.gpu_count < self.gpus:
            return f"{t.gpu_count} GPU(s) < {self.gpus} requested"
        if self.gpu_memory_gib is not None and t.gpu_memory_gib < self.gpu_memory_gib:
            return f"{t.gpu_memory_gib:g} GiB per GPU < {self.gpu_memory_gib:g} GiB requested"
        if self.min_vcpus is not None and t.vcpus < self.min_vcpus:
            return f"{t.vcpus} vCPUs < {self.min_vcpus} requested"
        if self.min_memory_gib is not None and t.memory_gib < self.min_memory_gib:
            return f"{t.memory_gib:g} GiB RAM < {self.min_memory_gib:g} GiB requested"
        return None

    def fitting_types(self) -> list[InstanceType]:
        return [t for t in INSTANCE_TYPES.values() if self.misfit(t) is None]

    @model_validator(mode="after")
    def _some_type_fits(self) -> Self:
        if self.fitting_types():
            return self
        if self.gpus > max(t.gpu_count for t in INSTANCE_TYPES.values()):
            most = max(t.gpu_count for t in INSTANCE_TYPES.values())
            raise SpecFieldError("resources.gpus", f"no EC2 GPU instance type has {self.gpus} GPUs; allowed 1..{most}")
        candidates = [t for t in INSTANCE_TYPES.values() if self.gpu_models is None or t.gpu_model in self.gpu_models]
        if self.gpu_memory_gib is not None and all(t.gpu_memory_gib < self.gpu_memory_gib for t in candidates):
            most_mem = max(t.gpu_memory_gib for t in candidates)
            raise SpecFieldError(
                "resources.gpu_memory_gib",
                f"no accepted GPU has {self.gpu_memory_gib:g} GiB; the most is {most_mem:g} GiB",
            )
        raise SpecFieldError(
            "resources",
            "no EC2 GPU instance type satisfies gpus, gpu_memory_gib, gpu_models, min_vcpus and "
            "min_memory_gib together; relax one of them",
        )


class CheckpointSpec(_Spec):
    dir: str = Field(default="/ckpt", pattern=r"^/", description="absolute path on the instance")
    interval_minutes: float = Field(strict=True, default=15, gt=0, le=24 * 60)
    # The spot notice gives two minutes; the agent needs some of them to upload the last delta. 0: the job
    # is not given time to save at the notice (it saves only every interval_minutes), so a preemption may
    # lose up to an interval of work, which the deadline's safety net then keeps as slack.
    grace_seconds: int = Field(strict=True, default=90, ge=0, le=110)


class LimitsSpec(_Spec):
    max_price_per_hour: float | None = Field(strict=True, default=None, gt=0, description="USD per instance-hour")
    max_total_cost: float | None = Field(strict=True, default=None, gt=0, description="USD across all attempts")
    deadline_hours: float | None = Field(strict=True, default=None, gt=0, description="from submission")
    max_interruptions: int = Field(strict=True, default=20, ge=0)
    max_restarts: int = Field(strict=True, default=2, ge=0, description="restarts after the user's code fails")
    on_demand_fallback: bool = Field(
        default=True, description="may use on-demand: to meet the deadline, and once max_wait_hours are spent"
    )
    max_wait_hours: float = Field(
        strict=True,
        default=24,
        gt=0,
        description=(
            "patience: hours from the first placement that finds no pool to a launch; then on-demand if the job "
            "may (a deadline, work_hours, on_demand_fallback, an on-demand type within the cap and budget), "
            "else NoCapacity (on-demand launches refused too: after as long again)"
        ),
    )


# Validation context of a spec being submitted (`parse_job_spec`), not a stored record read back: rules
# added later apply to new jobs only
SUBMISSION = "submission"


def _submitted(info: ValidationInfo) -> bool:
    """Whether this is a spec being submitted (`parse_job_spec`), not a stored record read back."""
    return bool((info.context or {}).get(SUBMISSION))


# Boot, image pull and checkpoint restore after a (re)launch. The Can't Be Late paper evaluates restart
# overheads of 3 and 12 minutes (0.05 h, 0.2 h); the default is a middle value.
DEFAULT_RESTART_OVERHEAD_MINUTES = 6.0


class PlacementSpec(_Spec):
    objective: Objective = Objective.COST_TO_FINISH
    restart_overhead_minutes: float = Field(
        strict=True,
        default=DEFAULT_RESTART_OVERHEAD_MINUTES,
        gt=0,
        le=120,
        description="boot + image pull + checkpoint restore before the job makes progress again",
    )

    @property
    def restart_overhead_hours(self) -> float:
        return self.restart_overhead_minutes / 60


class RecoverySpec(_Spec):
    strategy: RecoveryStrategyName = RecoveryStrategyName.EAGER_NEXT_POOL
    # 3 min: the next launch avoids the lost pool, as SkyPilot's EAGER_NEXT_REGION blocks the lost region
    # for the relaunch only, and as Karpenter keeps an interrupted offering out (its 3 min ICE-cache TTL).
    # Longer blocks kept jobs off pools whose outages were shorter (60 min cost 2.2% more per job on the
    # bench's fleet workload, its spotrelay replayed with either value); the interruption record still ranks
    # a flaky pool down.
    block_minutes: float = Field(
        strict=True, default=3, gt=0, le=7 * 24 * 60, description="how long a lost pool is avoided"
    )


class JobSpec(_Spec):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
        description="letters, digits, . _ -, at most 63, starting with a letter or digit",
    )
    run: RunSpec
    resources: ResourcesSpec
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    work_hours: float | None = Field(
        strict=True, default=None, gt=0, description="run time on the reference GPU (V100)"
    )
    priority: Priority = Priority.NORMAL
    tags: dict[str, str] = Field(default_factory=dict)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    recovery: Annotated[RecoverySpec, Field(default_factory=RecoverySpec)]

    @field_validator("priority", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        """`priority: HIGH` is `high`, as `gpu_models: [a100]` is the A100."""
        return value.lower() if isinstance(value, str) else value

    @field_validator("recovery", mode="before")
    @classmethod
    def _strategy_shorthand(cls, value: Any) -> Any:
        """`recovery: same-pool-first` is short for `recovery: {strategy: same-pool-first}`."""
        return {"strategy": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _deadline_fits_work(self, info: ValidationInfo) -> Self:
        deadline, work = self.limits.deadline_hours, self.work_hours
        if deadline is None:
            return self
        # At submission only (`parse_job_spec`): a record stored before this rule must still read back
        if work is None and _submitted(info):
            raise SpecFieldError(
                "limits.deadline_hours",
                "needs work_hours (the job's run time on the reference GPU, a V100): without an estimate of the "
                "work nobody can tell when on-demand is needed to finish in time; give work_hours, or no deadline",
            )
        if work is None:
            return self
        fastest = max(relative_speed(t) for t in self.resources.fitting_types())
        shortest = work / fastest
        if deadline < shortest:
            raise SpecFieldError(
                "limits.deadline_hours",
                f"{deadline:g} h is shorter than the work: work_hours {work:g} takes at least "
                f"{shortest:.2f} h on the fastest accepted GPU; allow more time or less work",
            )
        return self

    def min_run_hours(self, remaining_work_hours: float) -> float:
        """The least wall-clock time `remaining_work_hours` can take on a type this job accepts."""
        return remaining_work_hours / max(relative_speed(t) for t in self.resources.fitting_types())


class JobSpecError(ValueError):
    """An invalid job spec. `problems` are `field: what is wrong and what is allowed`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {'; '.join(problems)}")


def parse_job_spec(data: Any, source: str = "job spec") -> JobSpec:
    """Validate a decoded job spec (a dict from YAML or JSON)."""
    if not isinstance(data, dict):
        raise JobSpecError(source, [f"expected a mapping of keys (name, run, resources, ...), got {_kind(data)}"])
    try:
        return JobSpec.model_validate(data, context={SUBMISSION: True})
    except ValidationError as e:
        raise JobSpecError(source, [_describe(err) for err in e.errors()]) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a job spec from a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise JobSpecError(str(path), [f"cannot read: {e.strerror}"]) from None
    return parse_job_spec(decode_document(text, str(path)), str(path))


def decode_document(text: str, source: str) -> Any:
    """YAML (of which JSON is a subset), with the line of a syntax error in the message. A key given twice in
    one mapping is refused: both parsers would keep the last silently (a second `limits:` block pasted
    below the first would replace it)."""
    if text.lstrip().startswith(("{", "[")):
        # JSON as JSON: YAML would refuse tab-indented JSON, which many JSON writers produce.
        try:
            return json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, source))
        except json.JSONDecodeError as e:
            raise JobSpecError(source, [f"line {e.lineno}: not valid JSON ({e.msg})"]) from None
    import yaml  # here, not at the top: the Lambda functions parse JSON and their runtime has no PyYAML

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise JobSpecError(source, [f"line {line}: {key} is given twice; keep one"])
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise JobSpecError(source, [f"{where}not valid YAML or JSON ({problem})"]) from None


def _unique_keys(pairs: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise JobSpecError(source, [f"{', '.join(twice)} given twice in one object; keep one"])
    return dict(pairs)


def job_spec_json_schema() -> str:
    return json.dumps(JobSpec.model_json_schema(), indent=2)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _describe(err: Any) -> str:
    """One pydantic error as `field.path: message`, with the field a user has to change."""
    loc: tuple[str | int, ...] = tuple(p for p in err["loc"] if not _is_union_tag(p))
    ctx_error = err.get("ctx", {}).get("error")
    if isinstance(ctx_error, SpecFieldError):
        return f"{ctx_error.field}: {ctx_error}"
    field = ".".join(str(p) for p in loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        return f"{field}: unknown key; allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{field}: required"
    if kind == "string_pattern_mismatch" and (described := _description(loc)):
        return f"{field}: use {described} (got {err['input']!r})"
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind not in {"value_error", "assertion_error"} and "input" in err and not isinstance(err["input"], dict):
        message += f" (got {err['input']!r})"
    return f"{field}: {message}"


def _description(loc: tuple[str | int, ...]) -> str | None:
    """The description of the field at `loc`, which says what is allowed there."""
    model = _model_at(loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model is not None and loc else None
    return field.description if field is not None else None


def _is_union_tag(part: str | int) -> bool:
    # pydantic puts the union member it tried (e.g. 'function-after[...]') into the location.
    return isinstance(part, str) and "[" in part


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = JobSpec
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
