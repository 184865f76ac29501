"""The job spec: what a user submits, as YAML (`spotrelay submit job.yaml`) or JSON (an SQS message).

Only `name`, `run.command` or `run.image`, and `resources.gpus` are required. Anything else has a
default a user would expect. Unknown keys, wrong types and requests no EC2 GPU type can satisfy are
rejected with a message that names the field and says what is allowed (`JobSpecError`).
"""

from __future__ import annotations

import json
import re
import stat
import unicodedata
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from spotrelay.catalog import GPU_MODELS, INSTANCE_TYPES, InstanceType, relative_speed
from spotrelay.field_problems import PROBLEMS_SHOWN, SHOWN_MAX_CHARS, SpecFieldError, field_problems, one_line, shown

# Top-level directories of the instance's own files, where a job's checkpoint dir may not be (/mnt, /data,
# /scratch, /home, /opt/<job>, /ckpt are the job's to use)
SYSTEM_DIRECTORIES = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root", "sbin", "sys", "usr"}
)


def _control_character(text: str, allowed: str = "") -> str | None:
    """The first C0/C1 control character (or DEL) of `text` not in `allowed`, or None."""
    return next((c for c in text if (c < " " or "\x7f" <= c <= "\x9f") and c not in allowed), None)


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


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX's portable environment variable names

# An image reference, by the grammar docker and containerd parse it with: distribution/reference
# (https://github.com/distribution/reference, reference.go's grammar and regexp.go's patterns):
#   reference := name [":" tag] ["@" digest];  name := [domain "/"] path-component ["/" path-component]*
#   domain := host [":" port];  host := domain-component ["." domain-component]* | "[" IPv6 "]"
#   path-component := [a-z0-9]+ (separator [a-z0-9]+)*;  separator := [_.] | __ | -+
#   tag := [\w][\w.-]{0,127};  digest := algorithm ":" hex{32,}, e.g. sha256:<64 hex>
# None of them may start with `-`, so an image is never read as one of docker's options. Go's \w is ASCII.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>[\w][\w.-]{{0,127}}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
IMAGE_PATH_MAX_CHARS = 255  # distribution/reference's RepositoryNameTotalLengthMax (the name after the domain)
# Longer than any reference the grammar's own bounds allow in practice (a 253-character host, a 255-character
# name, a 128-character tag, a sha512 digest): checked before the pattern runs
IMAGE_REFERENCE_MAX_CHARS = 1024
IMAGE_REFERENCE_FORM = (
    "use [registry[:port]/]name[:tag][@sha256:<hex>], e.g. nvcr.io/nvidia/pytorch:24.05-py3 or "
    "python@sha256:<64 hex digits>; the name is lower-case letters and digits, separated by / . _ or -"
)

# EC2's tag restrictions (Amazon EC2 User Guide, "Tag your Amazon EC2 resources", "Tag restrictions":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions): at most 50 tags on
# a resource, a key of 1 to 128 characters, a value of 0 to 256, letters, numbers, spaces and + - = . _ : / @
# (EC2 itself takes more, but other services and IMDS tag access do not), no key starting with aws:
# (reserved for AWS, in any case).
TAG_KEY_MAX_CHARS = 128
TAG_VALUE_MAX_CHARS = 256
TAG_PUNCTUATION = "+-=._:/@"
# Of the 50, a worker instance already carries 6: spotrelay:managed, spotrelay:job-id, spotrelay:attempt,
# spotrelay:job-name and Name (spotrelay/aws/compute.py), and the stack's project tag (stacks/, through the
# launch template)
INSTANCE_TAGS_MAX = 50
SPOTRELAY_INSTANCE_TAGS = 6
JOB_TAGS_MAX = INSTANCE_TAGS_MAX - SPOTRELAY_INSTANCE_TAGS
RESERVED_TAG_PREFIXES = ("aws:", "spotrelay:")  # AWS's own, and the tags spotrelay finds its instances by
# The worker's launch template lets the agent read its instance's tags from IMDS (stacks/worker_construct.py,
# instance_metadata_tags), and then EC2 refuses to launch an instance with a tag key of other characters than
# a-z A-Z 0-9 + - = . , _ : @ (no space, no /), or that is `.`, `..` or `_index` (Amazon EC2 User Guide, "View
# tags for your EC2 instances using instance metadata"): such a key would make every launch of the job fail.
IMDS_TAG_KEY = re.compile(r"[A-Za-z0-9+\-=._:@]+")  # the characters both rules allow in a key
IMDS_TAG_KEYS_FORBIDDEN = (".", "..", "_index")


def image_reference_problem(image: str) -> str | None:
    """What makes `image` not an image reference docker would pull, or None if it is one."""
    if len(image) > IMAGE_REFERENCE_MAX_CHARS:
        return f"{len(image)} characters is not an image reference; {IMAGE_REFERENCE_FORM}"
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None:
        if image.startswith("-"):
            return f"{_shown(image)} starts with -, which docker would read as an option; {IMAGE_REFERENCE_FORM}"
        if IMAGE_REFERENCE.fullmatch(image.lower()) is not None:
            return f"{_shown(image)}: the repository name must be lower case; {IMAGE_REFERENCE_FORM}"
        return f"{_shown(image)} is not an image reference; {IMAGE_REFERENCE_FORM}"
    if len(match["path"]) > IMAGE_PATH_MAX_CHARS:
        return f"the name after the registry is longer than {IMAGE_PATH_MAX_CHARS} characters; {IMAGE_REFERENCE_FORM}"
    return None


def tag_problem(key: str, value: str) -> str | None:
    """What EC2 (or spotrelay) would refuse about the instance tag `key: value`, or None."""
    if not 1 <= len(key) <= TAG_KEY_MAX_CHARS:
        return f"a tag key is 1 to {TAG_KEY_MAX_CHARS} characters (got {len(key)})"
    if len(value) > TAG_VALUE_MAX_CHARS:
        return f"a tag value is at most {TAG_VALUE_MAX_CHARS} characters (got {len(value)})"
    if key in IMDS_TAG_KEYS_FORBIDDEN or not IMDS_TAG_KEY.fullmatch(key):
        return (
            "a tag key is ASCII letters, digits and + - = . _ : @ (no space, no /), and not . .. or _index: the "
            "workers read their tags from instance metadata, and EC2 launches no instance with another key then"
        )
    reserved = next((p for p in RESERVED_TAG_PREFIXES if key.lower().startswith(p)), None)
    if reserved is not None:
        return f"keys starting with {reserved} are reserved (for AWS and for spotrelay's own tags)"
    for what, text in (("key", key), ("value", value)):
        odd = next((c for c in text if not _tag_character(c)), None)
        if odd is not None:
            return f"the tag {what} holds {odd!r}: use letters, numbers, spaces and {' '.join(TAG_PUNCTUATION)}"
    return None


def _tag_character(char: str) -> bool:
    return char.isalnum() or unicodedata.category(char) == "Zs" or char in TAG_PUNCTUATION


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


class JobSpecError(ValueError):
    """An invalid job spec. `problems` are `field: what is wrong and what is allowed`, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = one_line(source, limit=None)
        # each problem bounded: a 1 MB unknown key is named, not echoed whole onto the one error line
        self.problems = [one_line(p) for p in problems]
        super().__init__(f"{self.source}: {'; '.join(self.problems)}")


def parse_job_spec(data: Any, source: str = "job spec") -> JobSpec:
    """Validate a decoded job spec (a dict from YAML or JSON)."""
    if not isinstance(data, dict):
        kind = "nothing" if data is None else type(data).__name__
        raise JobSpecError(source, [f"expected a mapping of keys (name, run, resources, ...), got {kind}"])
    try:
        return JobSpec.model_validate(data, context={SUBMISSION: True}, extra="forbid")
    except ValidationError as e:
        raise JobSpecError(source, field_problems(e, model=JobSpec, show_input=True)) from None


# --- reading a document: bounded before and while it is parsed (a file or a message is a user's input) ---


@dataclass(frozen=True)
class DocumentLimits:
    """How much of a YAML or JSON document is read and parsed before it is refused."""

    max_bytes: int  # of the file, read no further
    max_depth: int  # mappings and lists inside one another
    max_nodes: int  # values, keys, mappings and lists, as expanded: a YAML alias counts its anchor's again
    what: str = "a job spec"  # what the document should be, for the messages


# A job spec is about 1 KiB, 3 levels deep and a few dozen nodes (events/jobs/resnet50.yaml: 693 bytes,
# depth 3); a job with a hundred environment variables and tags is still under 1,000 nodes, and the queue
# takes at most 256 KiB (spotrelay.aws.stack). Far above a real spec, and where PyYAML (pure Python, about
# 10,000 nodes a second) stops within a second: a 300-byte YAML "billion laughs" expands to 10^9 nodes.
JOB_SPEC_LIMITS = DocumentLimits(max_bytes=1024 * 1024, max_depth=32, max_nodes=10_000)
MAX_INTEGER_DIGITS = 100  # no field of a spec or a scenario needs more
OCTAL_LOOKING = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1 octal: 010 is 8 (0o10 and 0x10 say what they are)


def load_job_spec(path: str | Path) -> JobSpec:
    """Read a job spec from a YAML or JSON file."""
    path = Path(path)
    return parse_job_spec(decode_document(read_document(path), str(path)), str(path))


def read_document(path: Path, limits: DocumentLimits = JOB_SPEC_LIMITS) -> str:
    """The text of a YAML or JSON file, read no further than `limits.max_bytes`: refused if it is larger, or
    is not UTF-8 text (a binary file)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the open, a device never end
            raise JobSpecError(str(path), ["not a regular file: give a YAML or JSON file"])
        with path.open("rb") as file:
            data = file.read(limits.max_bytes + 1)
    except JobSpecError:
        raise
    except (OSError, ValueError) as e:  # ValueError: a name no file can have (a NUL, an unpaired surrogate)
        raise JobSpecError(str(path), [f"cannot read: {getattr(e, 'strerror', None) or e}"]) from None
    return document_text(data, str(path), limits)


def document_text(data: bytes, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> str:
    """`data` (at most `limits.max_bytes`, or one byte more to say it is larger) as text."""
    if len(data) > limits.max_bytes:
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])
    if (nul := data.find(b"\0")) >= 0:
        raise JobSpecError(
            source, [f"holds a NUL byte (at byte {nul}): a binary file, not {limits.what} (YAML or JSON text)"]
        )
    try:
        return data.decode("utf-8-sig")  # a byte order mark some editors write is no part of the text
    except UnicodeDecodeError as e:
        raise JobSpecError(
            source,
            [f"not UTF-8 text (byte 0x{data[e.start]:02x} at {e.start}): {limits.what} is YAML or JSON, in UTF-8"],
        ) from None


def decode_document(text: str, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> Any:
    """YAML (of which JSON is a subset), with the line of a syntax error in the message, within `limits`.

    A key given twice in one mapping is refused: both parsers would keep the last silently (a second
    `limits:` block pasted below the first would replace it). So is a key that is a list or a mapping
    (YAML's `? [a, b]`): no field is named by one."""
    if len(text) > limits.max_bytes:  # at least as many bytes as characters
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])
    if text.lstrip().startswith(("{", "[")):
        # JSON as JSON: YAML would refuse tab-indented JSON, which many JSON writers produce.
        return decode_json(text, source, limits)
    import yaml  # here, not at the top: the Lambda functions parse JSON and their runtime has no PyYAML

    try:
        return yaml.load(text, Loader=_bounded_loader(source, limits))  # a SafeLoader: no Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise JobSpecError(source, [f"{where}not valid YAML or JSON ({problem})"]) from None


def decode_json(text: str, source: str, limits: DocumentLimits = JOB_SPEC_LIMITS) -> Any:
    """JSON within `limits` (the dispatcher reads queue messages with it): its size bounds its nodes (JSON
    has no aliases); its nesting is bounded by Python's recursion limit while parsing, then by
    `limits.max_depth`; an integer of more than MAX_INTEGER_DIGITS digits is refused as it is read (Python
    would spend quadratic time on it, and refuses past 4,300 digits with a ValueError); a key given twice
    in one object is refused."""
    if len(text) > limits.max_bytes:  # at least as many bytes as characters
        raise JobSpecError(source, [f"larger than {_size(limits.max_bytes)}: too large for {limits.what}"])

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
            raise JobSpecError(
                source, [f"a number of {len(digits.lstrip('-'))} digits: no field of {limits.what} takes one"]
            )
        return int(digits)

    try:
        document = json.loads(text, object_pairs_hook=lambda pairs: _unique_keys(pairs, source), parse_int=integer)
    except json.JSONDecodeError as e:
        raise JobSpecError(source, [f"line {e.lineno}: not valid JSON ({e.msg})"]) from None
    except RecursionError:
        raise JobSpecError(source, [_too_deep(limits)]) from None
    _check_shape(document, source, limits)
    return document


def _bounded_loader(source: str, limits: DocumentLimits) -> Any:
    """A SafeLoader class that refuses, while it composes the document and before anything is built from
    it: nesting deeper than `limits.max_depth`, more than `limits.max_nodes` nodes with every alias
    expanded (a billion laughs is a few hundred bytes of aliases), an alias inside its own anchor, a key
    that is not a single value, and a key given twice."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self.nodes = 0  # composed so far, aliases expanded
            self.depth = 0
            self.expanded: dict[int, int] = {}  # id(node) -> its nodes, expanded, once it is composed

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]  # (untyped in types-PyYAML)
                anchored = self.anchors.get(event.anchor)
                if anchored is not None:  # (an unknown alias is the composer's error)
                    if id(anchored) not in self.expanded:
                        raise self._refused(event, f"*{event.anchor} is inside &{event.anchor} itself")
                    self._count(self.expanded[id(anchored)], event)
                return super().compose_node(parent, index)
            event = self.peek_event()  # type: ignore[no-untyped-call]  # (untyped in types-PyYAML)
            self.depth += 1
            if self.depth > limits.max_depth:
                raise self._refused(event, _too_deep(limits))
            self._count(1, event)
            before = self.nodes - 1
            node = super().compose_node(parent, index)
            self.expanded[id(node)] = self.nodes - before
            self.depth -= 1
            return node

        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except JobSpecError:
                raise
            except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as e:
                # PyYAML's own constructors raise these, not a YAMLError, for a value its tag cannot hold: a
                # date that is none (2024-13-45), `!!int abc`, `!!bool maybe`, `!!float ''`
                kind = str(node.tag).rsplit(":", 1)[-1]
                why = f" ({e})" if type(e) is ValueError else ""
                raise JobSpecError(
                    source,
                    [
                        f"line {node.start_mark.line + 1}: {_shown(node.value)} reads as a YAML {kind}, and is not a "
                        f"valid one{why}; quote it if it is text"
                    ],
                ) from None

        def scan_flow_scalar_non_spaces(self, double: bool, start_mark: Any) -> Any:
            try:
                return super().scan_flow_scalar_non_spaces(double, start_mark)
            except ValueError:  # chr() of an escape past the last code point: "\U00110000"
                raise yaml.scanner.ScannerError(
                    "while scanning a double-quoted scalar",
                    start_mark,
                    "an escape past U+10FFFF, the last Unicode character",
                    self.get_mark(),
                ) from None

        def _count(self, nodes: int, event: Any) -> None:
            self.nodes += nodes
            if self.nodes > limits.max_nodes:
                raise self._refused(event, _too_many(limits))

        def _refused(self, event: Any, problem: str) -> JobSpecError:
            return JobSpecError(source, [f"line {event.start_mark.line + 1}: {problem}"])

        def construct_yaml_int(self, node: Any) -> Any:
            self._short_number(node)
            self._plain_number(node)
            if OCTAL_LOOKING.fullmatch(str(node.value)):
                raise self._number_refused(node, "YAML 1.1 reads a number with a leading 0 as octal (010 is 8)")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node: Any) -> Any:
            self._short_number(node)
            self._plain_number(node)
            return super().construct_yaml_float(node)

        def _plain_number(self, node: Any) -> None:
            if ":" in str(node.value):  # YAML 1.1's base 60: `work_hours: 1:30` would be 90 hours
                raise self._number_refused(node, "YAML 1.1 reads 1:30 as a base-60 number (90)")

        def _number_refused(self, node: Any, why: str) -> JobSpecError:
            line = node.start_mark.line + 1
            return JobSpecError(
                source, [f"line {line}: {node.value} is ambiguous: {why}; write the number plainly (1.5, 10)"]
            )

        def _short_number(self, node: Any) -> None:
            # as decode_json's: Python spends quadratic time on a long integer and refuses one past 4,300
            # digits (a ValueError, or an OverflowError made float); no field takes one anyway
            if len(str(node.value)) > MAX_INTEGER_DIGITS:
                line = node.start_mark.line + 1
                raise JobSpecError(
                    source, [f"line {line}: a number of {len(str(node.value))} characters: no field takes one"]
                )

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if not isinstance(node, yaml.MappingNode):  # (`!!map [1]`): PyYAML's error, naming the line
                return super().construct_mapping(node, deep=deep)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                    raise JobSpecError(source, [f"line {line}: a key is one word or number, not a {kind}"])
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise JobSpecError(source, [f"line {line}: {_shown(key, quoted=False)} is given twice; keep one"])
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
    return BoundedLoader


def _check_shape(document: Any, source: str, limits: DocumentLimits) -> None:
    """Refuse a decoded JSON document nested deeper than `limits.max_depth` or with more nodes than
    `limits.max_nodes` (as YAML's are refused while composed). Iterative: no recursion on deep input."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limits.max_depth:  # (counted as YAML's are: a value inside 32 lists is at depth 33)
            raise JobSpecError(source, [_too_deep(limits)])
        if isinstance(value, dict | list):
            children = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
        nodes += 1
        if nodes > limits.max_nodes:
            raise JobSpecError(source, [_too_many(limits)])


def _too_deep(limits: DocumentLimits) -> str:
    return f"nested more than {limits.max_depth} levels deep: not {limits.what}"


def _too_many(limits: DocumentLimits) -> str:
    return f"more than {limits.max_nodes:,} keys and values (a YAML alias counts as all it repeats): not {limits.what}"


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n // 1024} KiB"


def _unique_keys(pairs: list[tuple[str, Any]], source: str) -> dict[str, Any]:
    unique = dict(pairs)
    if len(unique) < len(pairs):
        twice = sorted(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
        keys = ", ".join(_shown(key, quoted=False) for key in twice[:PROBLEMS_SHOWN])
        more = f" and {len(twice) - PROBLEMS_SHOWN} more" if len(twice) > PROBLEMS_SHOWN else ""
        raise JobSpecError(source, [f"{keys}{more} given twice in one object; keep one"])
    return unique


def _shown(value: object, *, quoted: bool = True) -> str:
    """A value a user gave, as a message quotes it: bounded (spotrelay.field_problems.shown); `quoted=False`:
    as its text."""
    if quoted:
        return shown(value)
    text = str(value) if not isinstance(value, str) else value
    return text if len(text) <= SHOWN_MAX_CHARS else text[: SHOWN_MAX_CHARS - 3] + "..."


def job_spec_json_schema() -> str:
    return json.dumps(JobSpec.model_json_schema(), indent=2)
