"""The sections of a job spec (`run`, `resources`, `checkpoint`, `limits`, `placement`, `recovery`), the
enums their fields take, and what the validators share: `_Spec`'s configuration and the submission context
(`SUBMISSION`: rules added later apply to specs being submitted, not to stored records read back).

The whole spec, `JobSpec`, and its parsing are in spotrelay.models.job_spec; the rules the validators
apply to images, tags and names in spotrelay.models.spec_rules.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from spotrelay.catalog import GPU_MODELS, INSTANCE_TYPES, InstanceType
from spotrelay.field_problems import SpecFieldError
from spotrelay.models.spec_errors import _shown
from spotrelay.models.spec_rules import ENV_NAME, SYSTEM_DIRECTORIES, _control_character, image_reference_problem


class _Spec(BaseModel):
    # allow_inf_nan=False: YAML's .inf/.nan and JSON's Infinity/NaN are refused naming the field. pydantic
    # writes a non-finite float as null, so a record holding one would not read back (null is no float) or
    # would mean something else (a null deadline is none). For every reader, not only at submission: no
    # stored record can hold one (each was written as null), so the rule makes no old record unreadable.
    # extra="allow": a stored record's spec with a field a newer version added reads, and keeps it
    # (spotrelay.models.records); a spec being submitted is validated with extra="forbid" (parse_job_spec),
    # so an unknown key there is still refused, naming it.
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


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


class RunSpec(_Spec):
    image: str | None = Field(default=None, min_length=1, description="container image, run with GPUs")
    command: str | None = Field(default=None, min_length=1, description="shell command (in the image if any)")
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("image")
    @classmethod
    def _image_reference(cls, image: str | None, info: ValidationInfo) -> str | None:
        """An image reference, not an option for docker (`--privileged`). At submission only: a record
        stored before the rule must still read back."""
        if image is not None and _submitted(info) and (problem := image_reference_problem(image)) is not None:
            raise ValueError(problem)
        return image

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
                    (key,), "not an environment variable name: use letters, digits and _, not first a digit"
                )
            if isinstance(value, str) and _submitted(info) and "\x00" in value:
                raise SpecFieldError((key,), "holds a NUL character, which no environment variable can")
            if not isinstance(value, str):
                raise SpecFieldError(
                    (key,),
                    f"{value} is not text: YAML and JSON read an unquoted value as a number, boolean or date and lose "
                    f"how it was written (2.10 reads as 2.1, 0755 as 493, yes as True); quote it as written, e.g. "
                    f'{key}: "..."',
                )
        return env

    @field_validator("command")
    @classmethod
    def _runnable_command(cls, command: str | None, info: ValidationInfo) -> str | None:
        """Text a process can be given: no NUL (execve takes none: the agent could not start the job, on
        every attempt) and no other control character but tab and line breaks. At submission only."""
        if command is not None and _submitted(info) and (odd := _control_character(command, allowed="\t\n\r")):
            raise ValueError(f"holds the control character {odd!r}; a command is text")
        return command

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
            raise SpecFieldError(("gpus",), f"no EC2 GPU instance type has {self.gpus} GPUs; allowed 1..{most}")
        candidates = [t for t in INSTANCE_TYPES.values() if self.gpu_models is None or t.gpu_model in self.gpu_models]
        if self.gpu_memory_gib is not None and all(t.gpu_memory_gib < self.gpu_memory_gib for t in candidates):
            most_mem = max(t.gpu_memory_gib for t in candidates)
            raise SpecFieldError(
                ("gpu_memory_gib",),
                f"no accepted GPU has {self.gpu_memory_gib:g} GiB; the most is {most_mem:g} GiB",
            )
        raise ValueError(
            "no EC2 GPU instance type satisfies gpus, gpu_memory_gib, gpu_models, min_vcpus and "
            "min_memory_gib together; relax one of them",
        )


class CheckpointSpec(_Spec):
    dir: str = Field(default="/ckpt", pattern=r"^/", description="absolute path on the instance")

    @field_validator("dir")
    @classmethod
    def _a_directory_the_agent_can_make(cls, path: str, info: ValidationInfo) -> str:
        """A plain absolute path, of a directory of its own, outside the system's: the agent makes it and
        restores the checkpoint into it (as root), so `/`, `/etc/...`, `..` parts or a NUL would fail the
        job on every attempt or overwrite the instance's own files. At submission only."""
        if not _submitted(info):
            return path
        parts = path.split("/")[1:]
        if _control_character(path) or any(part in ("", ".", "..") for part in parts):
            raise ValueError(
                f"use a plain absolute path such as /ckpt: no empty, . or .. parts (got {_shown(path)})",
            )
        if parts[0] in SYSTEM_DIRECTORIES:
            raise ValueError(
                f"/{parts[0]} is the system's; use a directory of the job's own, such as /ckpt or /mnt/ckpt",
            )
        return path

    interval_minutes: float = Field(strict=True, default=15, gt=0, le=24 * 60)
    # The spot notice gives two minutes; the agent needs some of them to upload the last delta. 0: the job
    # is not given time to save at the notice (it saves only every interval_minutes), so a preemption may
    # lose up to an interval of work, which the deadline's safety net then keeps as slack.
    grace_seconds: int = Field(strict=True, default=90, ge=0, le=110)


# Hours no job spans (over 11 years): a longer deadline, patience or amount of work is refused at submission,
# before a date it is added to overflows (`spotrelay status` adds max_wait_hours to when the wait began)
MAX_HOURS = 100_000


def _within_max_hours(hours: float | None, info: ValidationInfo) -> float | None:
    if hours is not None and _submitted(info) and hours > MAX_HOURS:
        raise ValueError(f"at most {MAX_HOURS:,} hours (over 11 years; got {hours:g})")
    return hours


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

    @field_validator("deadline_hours", "max_wait_hours")
    @classmethod
    def _hours_within_reach(cls, hours: float | None, info: ValidationInfo) -> float | None:
        return _within_max_hours(hours, info)


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


# The longest an instance is kept to debug a failed job (recovery.keep_failed_instance_minutes' bound; a record
# that says more is not believed: spotrelay.models.records.Attempt.kept_end)
MAX_KEEP_MINUTES = 24 * 60


class RecoverySpec(_Spec):
    strategy: RecoveryStrategyName = RecoveryStrategyName.EAGER_NEXT_POOL
    # 3 min: the next launch avoids the lost pool, as SkyPilot's EAGER_NEXT_REGION blocks the lost region
    # for the relaunch only, and as Karpenter keeps an interrupted offering out (its 3 min ICE-cache TTL).
    # Longer blocks keep jobs off pools whose outages are shorter (a 60-minute block costs more per job on the
    # bench's fleet workload, its spotrelay replayed with either value); the interruption record still ranks
    # a flaky pool down.
    block_minutes: float = Field(
        strict=True, default=3, gt=0, le=7 * 24 * 60, description="how long a lost pool is avoided"
    )
    # A failed job's instance kept to look at (SkyPilot's users asked for it: skypilot-org/skypilot#1163): the
    # attempt whose code failed for the last time (JobFailed past max_restarts) keeps its instance this long,
    # billed to the job; `status` prints the `aws ssm start-session` line that reaches it.
    keep_failed_instance_minutes: int = Field(
        strict=True,
        default=0,
        ge=0,
        le=MAX_KEEP_MINUTES,
        description="minutes to keep the instance of a job whose code failed, to debug it (billed; 0: not kept)",
    )
