"""The job spec: what a user submits, as YAML (`spotrelay submit job.yaml`) or JSON (an SQS message).

Only `name`, `run.command` or `run.image`, and `resources.gpus` are required. Anything else has a
default a user would expect. Unknown keys, wrong types and requests no EC2 GPU type can satisfy are
rejected with a message that names the field and says what is allowed (`JobSpecError`).

This module holds the whole spec (`JobSpec`) and its parsing (`parse_job_spec`, `load_job_spec`); every
public name of its siblings is importable from here too:
- spotrelay.models.spec_sections: the spec's sections (`RunSpec`, `ResourcesSpec`, ...), their enums, and
  the submission context that keeps later rules off stored records;
- spotrelay.models.spec_rules: the rules of images, instance tags and names, with their sources;
- spotrelay.models.documents: reading a YAML or JSON file or message within bounds;
- spotrelay.models.spec_errors: `JobSpecError`, how a refusal is reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from spotrelay.catalog import relative_speed
from spotrelay.field_problems import SpecFieldError, field_problems
from spotrelay.models.documents import (
    JOB_SPEC_LIMITS,
    MAX_INTEGER_DIGITS,
    OCTAL_LOOKING,
    DocumentLimits,
    decode_document,
    decode_json,
    document_text,
    read_document,
)
from spotrelay.models.spec_errors import JobSpecError
from spotrelay.models.spec_rules import (
    ENV_NAME,
    IMAGE_PATH_MAX_CHARS,
    IMAGE_REFERENCE,
    IMAGE_REFERENCE_FORM,
    IMAGE_REFERENCE_MAX_CHARS,
    IMDS_TAG_KEY,
    IMDS_TAG_KEYS_FORBIDDEN,
    INSTANCE_TAGS_MAX,
    JOB_TAGS_MAX,
    RESERVED_TAG_PREFIXES,
    SPOTRELAY_INSTANCE_TAGS,
    SYSTEM_DIRECTORIES,
    TAG_KEY_MAX_CHARS,
    TAG_PUNCTUATION,
    TAG_VALUE_MAX_CHARS,
    image_reference_problem,
    tag_problem,
)
from spotrelay.models.spec_sections import (
    DEFAULT_RESTART_OVERHEAD_MINUTES,
    MAX_HOURS,
    SUBMISSION,
    CheckpointSpec,
    LimitsSpec,
    Objective,
    PlacementSpec,
    Priority,
    RecoverySpec,
    RecoveryStrategyName,
    ResourcesSpec,
    RunSpec,
    _Spec,
    _submitted,
    _within_max_hours,
)

__all__ = [
    "DEFAULT_RESTART_OVERHEAD_MINUTES",
    "ENV_NAME",
    "IMAGE_PATH_MAX_CHARS",
    "IMAGE_REFERENCE",
    "IMAGE_REFERENCE_FORM",
    "IMAGE_REFERENCE_MAX_CHARS",
    "IMDS_TAG_KEY",
    "IMDS_TAG_KEYS_FORBIDDEN",
    "INSTANCE_TAGS_MAX",
    "JOB_SPEC_LIMITS",
    "JOB_TAGS_MAX",
    "MAX_HOURS",
    "MAX_INTEGER_DIGITS",
    "OCTAL_LOOKING",
    "RESERVED_TAG_PREFIXES",
    "SPOTRELAY_INSTANCE_TAGS",
    "SUBMISSION",
    "SYSTEM_DIRECTORIES",
    "TAG_KEY_MAX_CHARS",
    "TAG_PUNCTUATION",
    "TAG_VALUE_MAX_CHARS",
    "CheckpointSpec",
    "DocumentLimits",
    "JobSpec",
    "JobSpecError",
    "LimitsSpec",
    "Objective",
    "PlacementSpec",
    "Priority",
    "RecoverySpec",
    "RecoveryStrategyName",
    "ResourcesSpec",
    "RunSpec",
    "decode_document",
    "decode_json",
    "document_text",
    "image_reference_problem",
    "job_spec_json_schema",
    "load_job_spec",
    "parse_job_spec",
    "read_document",
    "tag_problem",
]


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

    @field_validator("work_hours")
    @classmethod
    def _work_within_reach(cls, hours: float | None, info: ValidationInfo) -> float | None:
        return _within_max_hours(hours, info)

    @field_validator("priority", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        """`priority: HIGH` is `high`, as `gpu_models: [a100]` is the A100."""
        return value.lower() if isinstance(value, str) else value

    @field_validator("tags")
    @classmethod
    def _instance_tags(cls, tags: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """Tags within EC2's rules for the job's instances (checked now; not yet put on them: the launch
        request, spotrelay.control, carries no tags). At submission only: a record stored before the rule
        must still read back."""
        if not _submitted(info):
            return tags
        if len(tags) > JOB_TAGS_MAX:
            raise ValueError(
                f"{len(tags)} tags; a job may have at most {JOB_TAGS_MAX} (EC2 allows {INSTANCE_TAGS_MAX} on an "
                f"instance, and spotrelay puts {SPOTRELAY_INSTANCE_TAGS} there itself)",
            )
        for key, value in tags.items():
            if (problem := tag_problem(key, value)) is not None:
                raise SpecFieldError((key,), problem)
        return tags

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
                ("limits", "deadline_hours"),
                "needs work_hours (the job's run time on the reference GPU, a V100): without an estimate of the "
                "work nobody can tell when on-demand is needed to finish in time; give work_hours, or no deadline",
            )
        if work is None:
            return self
        fastest = max(relative_speed(t) for t in self.resources.fitting_types())
        shortest = work / fastest
        if deadline < shortest:
            raise SpecFieldError(
                ("limits", "deadline_hours"),
                f"{deadline:g} h is shorter than the work: work_hours {work:g} takes at least "
                f"{shortest:.2f} h on the fastest accepted GPU; allow more time or less work",
            )
        return self

    def min_run_hours(self, remaining_work_hours: float) -> float:
        """The least wall-clock time `remaining_work_hours` can take on a type this job accepts."""
        return remaining_work_hours / max(relative_speed(t) for t in self.resources.fitting_types())


def parse_job_spec(data: Any, source: str = "job spec") -> JobSpec:
    """Validate a decoded job spec (a dict from YAML or JSON)."""
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise JobSpecError(source, [f"expected a mapping of keys (name, run, resources, ...), got {kind}"])
    try:
        return JobSpec.model_validate(data, context={SUBMISSION: True}, extra="forbid")
    except ValidationError as e:
        raise JobSpecError(source, field_problems(e, model=JobSpec, show_input=True)) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a job spec from a YAML or JSON file."""
    path = Path(path)
    return parse_job_spec(decode_document(read_document(path), str(path)), str(path))


def job_spec_json_schema() -> str:
    return json.dumps(JobSpec.model_json_schema(), indent=2)
