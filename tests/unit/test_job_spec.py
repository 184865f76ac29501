"""The job spec: the example loads as written, defaults fill the rest, and every rejection tells the
user which field to change and what it may be."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from spotrelay.catalog import GPU_MODELS
from spotrelay.models import (
    CheckpointSpec,
    Job,
    JobSpecError,
    LimitsSpec,
    Objective,
    PlacementSpec,
    Priority,
    RecoverySpec,
    RecoveryStrategyName,
    load_job_spec,
    parse_job_spec,
)

WriteFile = Callable[[str, str], Path]

MINIMAL = """\
name: train
run: {command: python train.py}
resources: {gpus: 1}
"""


def rejection(write_file: WriteFile, text: str) -> tuple[Path, JobSpecError]:
    """Load `text` as a job file that must be rejected; return its path and the error."""
    path = write_file("job.yaml", text)
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    return path, caught.value


def problem_about(error: JobSpecError, field: str) -> str:
    """The one problem that names `field` (as `field: ...`)."""
    matching = [p for p in error.problems if p.startswith(f"{field}: ")]
    assert len(matching) == 1, f"expected one problem about {field}, got {error.problems}"
    return matching[0]


# --- what loads -------------------------------------------------------------------------------------


def test_example_job_loads_with_the_values_it_gives(events_dir: Path) -> None:
    # Given the recorded example job
    path = events_dir / "jobs" / "resnet50.yaml"

    # When it is loaded
    spec = load_job_spec(path)

    # Then every value written in the file is what the scheduler sees
    assert spec.name == "resnet50"
    assert spec.run.image == "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"
    assert spec.run.command == 'python train.py --arch resnet50 --resume-from "$SPOTRELAY_CHECKPOINT_DIR"'
    assert spec.run.env == {"EPOCHS": "90"}
    assert spec.resources.gpus == 1
    assert spec.resources.gpu_memory_gib == 16
    assert spec.resources.gpu_models == ("T4", "A10G", "L4", "V100", "A100")
    assert spec.resources.min_vcpus == 4
    assert spec.resources.min_memory_gib == 16
    assert spec.checkpoint == CheckpointSpec(dir="/ckpt", interval_minutes=15, grace_seconds=90)
    assert spec.limits == LimitsSpec(
        max_price_per_hour=3.0,
        max_total_cost=50,
        deadline_hours=12,
        max_interruptions=20,
        max_restarts=2,
        on_demand_fallback=True,
    )
    assert spec.work_hours == 6
    assert spec.priority is Priority.NORMAL
    assert spec.tags == {"team": "vision"}
    # and what it leaves out takes the defaults
    assert spec.placement.objective is Objective.COST_TO_FINISH
    assert spec.recovery == RecoverySpec(strategy=RecoveryStrategyName.EAGER_NEXT_POOL, block_minutes=3)


def test_minimal_spec_gets_the_documented_defaults(write_file: WriteFile) -> None:
    # Given a spec with only the required fields: name, run.command and resources.gpus
    path = write_file("job.yaml", MINIMAL)

    # When it is loaded
    spec = load_job_spec(path)

    # Then everything else is the default a user would expect
    assert spec.name == "train"
    assert spec.run.command == "python train.py"
    assert spec.run.image is None
    assert spec.run.env == {}
    assert spec.resources.gpus == 1
    assert spec.resources.gpu_memory_gib is None
    assert spec.resources.gpu_models is None
    assert spec.resources.min_vcpus is None
    assert spec.resources.min_memory_gib is None
    assert spec.checkpoint.dir == "/ckpt"
    assert spec.checkpoint.interval_minutes == 15
    assert spec.checkpoint.grace_seconds == 90
    assert spec.limits.max_price_per_hour is None
    assert spec.limits.max_total_cost is None
    assert spec.limits.deadline_hours is None
    assert spec.limits.max_interruptions == 20
    assert spec.limits.max_restarts == 2
    assert spec.limits.on_demand_fallback is True
    assert spec.work_hours is None
    assert spec.priority is Priority.NORMAL
    assert spec.tags == {}
    assert spec.placement == PlacementSpec(objective=Objective.COST_TO_FINISH, restart_overhead_minutes=6)
    assert spec.placement.restart_overhead_hours == 0.1
    assert spec.recovery.strategy is RecoveryStrategyName.EAGER_NEXT_POOL
    assert spec.recovery.block_minutes == 3


def test_image_alone_is_enough_to_run(write_file: WriteFile) -> None:
    # Given a spec that names an image but no command
    path = write_file(
        "job.yaml", "name: serve\nrun: {image: 'nvcr.io/nvidia/pytorch:24.08-py3'}\nresources: {gpus: 2}\n"
    )

    # When it is loaded
    spec = load_job_spec(path)

    # Then the image runs with its own entry point
    assert spec.run.image == "nvcr.io/nvidia/pytorch:24.08-py3"
    assert spec.run.command is None
    assert spec.resources.gpus == 2


def test_recovery_strategy_shorthand_equals_the_long_form(write_file: WriteFile) -> None:
    # Given one spec that names the recovery strategy alone, and one that spells it out
    short = write_file("short.yaml", MINIMAL + "recovery: same-pool-first\n")
    long = write_file("long.yaml", MINIMAL + "recovery: {strategy: same-pool-first}\n")

    # When both are loaded
    short_spec, long_spec = load_job_spec(short), load_job_spec(long)

    # Then the shorthand picks that strategy and keeps the other recovery defaults
    assert short_spec.recovery.strategy is RecoveryStrategyName.SAME_POOL_FIRST
    assert short_spec.recovery.block_minutes == 3
    assert short_spec == long_spec


@pytest.mark.parametrize(("written", "hours"), [("12", 0.2), ("2.5", 2.5 / 60), ("120", 2.0)])
def test_the_restart_overhead_is_given_in_minutes(write_file: WriteFile, written: str, hours: float) -> None:
    # Given a job that says how long a restart takes (boot, image pull, checkpoint restore)
    path = write_file("job.yaml", MINIMAL + f"placement: {{restart_overhead_minutes: {written}}}\n")

    # When it is loaded
    spec = load_job_spec(path)

    # Then placement reads it in hours, and the objective keeps its default
    assert spec.placement.restart_overhead_minutes == float(written)
    assert spec.placement.restart_overhead_hours == pytest.approx(hours)
    assert spec.placement.objective is Objective.COST_TO_FINISH


def test_json_text_parses_the_same_as_yaml(events_dir: Path, write_file: WriteFile) -> None:
    # Given the example job as YAML, and the same document written as JSON (as an SQS message carries it)
    yaml_path = events_dir / "jobs" / "resnet50.yaml"
    document = yaml.safe_load(yaml_path.read_text())
    pretty = write_file("pretty.json", json.dumps(document, indent=2))
    compact = write_file("compact.json", json.dumps(document, separators=(",", ":")))

    # When each is loaded
    from_yaml = load_job_spec(yaml_path)

    # Then the specs are equal
    assert load_job_spec(pretty) == from_yaml
    assert load_job_spec(compact) == from_yaml


def test_tab_indented_json_parses_the_same_as_yaml(events_dir: Path, write_file: WriteFile) -> None:
    # Given the example job as JSON indented with tabs (valid JSON: Go's json.MarshalIndent(v, "", "\t"),
    # JavaScript's JSON.stringify(v, null, "\t"))
    yaml_path = events_dir / "jobs" / "resnet50.yaml"
    tabbed = write_file("tabbed.json", json.dumps(yaml.safe_load(yaml_path.read_text()), indent="\t"))

    # When it is loaded
    spec = load_job_spec(tabbed)

    # Then it is the same spec as the YAML
    assert spec == load_job_spec(yaml_path)


def test_deadline_is_checked_against_the_fastest_accepted_gpu_not_the_fastest_in_the_catalog(
    write_file: WriteFile,
) -> None:
    # Given 10 h of V100 work restricted to T4 and V100 (fastest accepted: V100, 1.0x), with a 10.5 h deadline
    fits = MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_models: [T4, V100]}") + "work_hours: 10\n"
    path = write_file("fits.yaml", fits + "limits: {deadline_hours: 10.5}\n")

    # When it is loaded
    spec = load_job_spec(path)

    # Then it is accepted: the V100 finishes in 10 h
    assert spec.limits.deadline_hours == 10.5


def test_gpu_models_ignore_case(write_file: WriteFile) -> None:
    # Given a spec naming GPU models in lower case, one twice
    path = write_file("casual.yaml", MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_models: [a100, A100, l4]}"))
    # When it is loaded, Then it has the catalog's model names, each once
    assert load_job_spec(path).resources.gpu_models == ("A100", "L4")
    # and a priority in capitals is the same priority
    assert load_job_spec(write_file("loud.yaml", MINIMAL + "priority: HIGH\n")).priority is Priority.HIGH


# --- what is rejected -------------------------------------------------------------------------------

TOP_LEVEL_KEYS = "name, run, resources, checkpoint, limits, work_hours, priority, tags, placement, recovery"


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        pytest.param(
            MINIMAL + "colour: blue\n",
            "colour",
            ["unknown key", f"allowed keys here: {TOP_LEVEL_KEYS}"],
            id="unknown-top-level-key",
        ),
        pytest.param(
            MINIMAL + "limits: {max_price: 2}\n",
            "limits.max_price",
            [
                "unknown key",
                "allowed keys here: max_price_per_hour, max_total_cost, deadline_hours, max_interruptions, "
                "max_restarts, on_demand_fallback",
            ],
            id="unknown-nested-key",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: two}"),
            "resources.gpus",
            ["valid integer", "'two'"],
            id="gpus-wrong-type",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 0}"),
            "resources.gpus",
            ["greater than or equal to 1", "got 0"],
            id="gpus-zero",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 9}"),
            "resources.gpus",
            ["no EC2 GPU instance type has 9 GPUs", "allowed 1..8"],
            id="gpus-more-than-any-type",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_memory_gib: 200}"),
            "resources.gpu_memory_gib",
            ["no accepted GPU has 200 GiB", "the most is 179.062 GiB"],
            id="gpu-memory-beyond-every-gpu",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_memory_gib: 32, gpu_models: [T4, L4]}"),
            "resources.gpu_memory_gib",
            ["no accepted GPU has 32 GiB", "the most is 24 GiB"],
            id="gpu-memory-beyond-the-accepted-models",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_models: [L4, RTX4090]}"),
            "resources.gpu_models",
            ["unknown GPU model 'RTX4090'", f"allowed: {', '.join(GPU_MODELS)}"],
            id="unknown-gpu-model",
        ),
        pytest.param(
            MINIMAL.replace("name: train", "name: 'my job!'"),
            "name",
            ["use letters, digits, . _ -, at most 63, starting with a letter or digit (got 'my job!')"],
            id="name-with-a-space",
        ),
        pytest.param(
            MINIMAL.replace("{command: python train.py}", "{command: python train.py, env: {DEBUG: yes}}"),
            "run.env.DEBUG",
            ["True is not text", 'quote it as written, e.g. DEBUG: "..."'],
            id="env-value-a-yaml-boolean",
        ),
        pytest.param(
            MINIMAL.replace("{command: python train.py}", "{command: python train.py, env: {TORCH: 2.10}}"),
            "run.env.TORCH",
            ["2.1 is not text", "2.10 reads as 2.1", "quote it"],
            id="env-value-a-number-yaml-rewrites",
        ),
        pytest.param(
            MINIMAL.replace("{command: python train.py}", "{command: python train.py, env: {'MY VAR': a}}"),
            'run.env["MY VAR"]',
            ["not an environment variable name", "letters, digits and _"],
            id="env-name-with-a-space",
        ),
        pytest.param(
            MINIMAL + "limits: {max_price_per_hour: -0.5}\n",
            "limits.max_price_per_hour",
            ["greater than 0", "got -0.5"],
            id="negative-max-price",
        ),
        pytest.param(
            MINIMAL.replace("{gpus: 1}", "{gpus: 1, gpu_models: [T4, V100]}")
            + "work_hours: 10\nlimits: {deadline_hours: 5}\n",
            "limits.deadline_hours",
            ["5 h is shorter than the work", "at least 10.00 h on the fastest accepted GPU"],
            id="deadline-shorter-than-work-on-fastest-accepted-gpu",
        ),
        pytest.param(
            MINIMAL + "limits: {deadline_hours: 5}\n",
            "limits.deadline_hours",
            ["needs work_hours", "give work_hours, or no deadline"],
            id="deadline-without-work-hours",
        ),
        pytest.param(
            MINIMAL.replace("{command: python train.py}", "{env: {EPOCHS: '90'}}"),
            "run",
            ["give run.image, run.command, or both"],
            id="no-command-no-image",
        ),
        pytest.param(
            MINIMAL.replace("name: train\n", ""),
            "name",
            ["required"],
            id="missing-name",
        ),
        pytest.param(
            MINIMAL + "placement: {restart_overhead_minutes: '6'}\n",
            "placement.restart_overhead_minutes",
            ["valid number", "got '6'"],
            id="restart-overhead-as-text",
        ),
        pytest.param(
            MINIMAL + "placement: {restart_overhead_minutes: true}\n",
            "placement.restart_overhead_minutes",
            ["valid number", "got True"],
            id="restart-overhead-boolean",
        ),
        pytest.param(
            MINIMAL + "placement: {restart_overhead_minutes: 0}\n",
            "placement.restart_overhead_minutes",
            ["greater than 0", "got 0"],
            id="restart-overhead-zero",
        ),
        pytest.param(
            MINIMAL + "placement: {restart_overhead_minutes: 121}\n",
            "placement.restart_overhead_minutes",
            ["less than or equal to 120", "got 121"],
            id="restart-overhead-over-two-hours",
        ),
        pytest.param(
            MINIMAL + "priority: urgent\n",
            "priority",
            ["'high', 'normal' or 'low'", "got 'urgent'"],
            id="bad-priority",
        ),
        pytest.param(
            MINIMAL + "recovery: next-cheapest\n",
            "recovery.strategy",
            ["'eager-next-pool' or 'same-pool-first'", "got 'next-cheapest'"],
            id="bad-recovery-shorthand",
        ),
    ],
)
def test_rejection_names_the_field_and_what_is_allowed(
    write_file: WriteFile, text: str, field: str, says: list[str]
) -> None:
    # Given a job file with one thing wrong
    # When it is loaded
    path, error = rejection(write_file, text)

    # Then exactly one problem names the field, and says what is wrong and what is allowed
    problem = problem_about(error, field)
    for phrase in says:
        assert phrase in problem
    # and the one-line message starts with the file
    assert str(error).startswith(f"{path}: ")
    assert "\n" not in str(error)


def test_boolean_gpu_count_is_rejected(write_file: WriteFile) -> None:
    # Given `gpus: yes` (YAML 1.1 reads it as true), a wrong type like `gpus: two`
    # When it is loaded
    _, error = rejection(write_file, MINIMAL.replace("{gpus: 1}", "{gpus: yes}"))

    # Then it is rejected as not a number of GPUs, rather than silently read as 1 GPU
    assert "valid integer" in problem_about(error, "resources.gpus")


def test_several_problems_are_all_reported(write_file: WriteFile) -> None:
    # Given a file with two independent mistakes
    # When it is loaded
    _, error = rejection(write_file, MINIMAL + "priority: urgent\nlimits: {max_price_per_hour: 0}\n")

    # Then both are reported, so the user fixes them in one go
    problem_about(error, "priority")
    problem_about(error, "limits.max_price_per_hour")
    assert len(error.problems) == 2


def test_invalid_yaml_names_the_line(write_file: WriteFile) -> None:
    # Given a file whose fourth line is indented wrongly
    text = "name: train\nrun:\n  command: python train.py\n resources: {gpus: 1}\n"

    # When it is loaded
    path, error = rejection(write_file, text)

    # Then the message names the file and that line
    assert str(error).startswith(f"{path}: line 4: not valid YAML or JSON")
    assert "\n" not in str(error)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("- name: train\n- name: eval\n", "got list", id="list"),
        pytest.param("just a sentence\n", "got str", id="scalar"),
        pytest.param("", "got nothing", id="empty"),
    ],
)
def test_document_that_is_not_a_mapping_is_rejected(write_file: WriteFile, text: str, kind: str) -> None:
    # Given a file that is valid YAML but not a mapping of keys
    # When it is loaded
    path, error = rejection(write_file, text)

    # Then the message says a mapping was expected and what was found
    assert error.problems == [f"expected a mapping of keys (name, run, resources, ...), {kind}"]
    assert str(error).startswith(f"{path}: ")


def test_missing_file_is_rejected_naming_the_path(tmp_path: Path) -> None:
    # Given a path with no file
    path = tmp_path / "nowhere" / "job.yaml"

    # When it is loaded
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)

    # Then the message names the path and says it cannot be read
    assert str(caught.value) == f"{path}: cannot read: No such file or directory"


def test_error_message_is_one_line_starting_with_the_path(write_file: WriteFile) -> None:
    # Given a job file with an unknown key
    # When it is loaded
    path, error = rejection(write_file, MINIMAL + "gpus: 2\n")

    # Then str() is `path: problem` on one line, and `source` is the path
    assert str(error) == f"{path}: gpus: unknown key; allowed keys here: {TOP_LEVEL_KEYS}"
    assert error.source == str(path)


def test_spec_is_frozen(events_dir: Path) -> None:
    # Given a loaded spec
    spec = load_job_spec(events_dir / "jobs" / "resnet50.yaml")

    # When code tries to change it
    # Then it cannot: a spec is what the user submitted
    with pytest.raises(ValueError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


def test_a_job_stored_before_a_rule_was_added_still_reads_back() -> None:
    # Given the record of a job submitted before a deadline needed work_hours and env names were checked
    spec = {"name": "train", "run": {"command": "python train.py", "env": {"MY VAR": "1"}}, "resources": {"gpus": 1}}
    spec["limits"] = {"deadline_hours": 5}
    now = "2026-11-30T12:00:00Z"
    record = json.dumps({"job_id": "train-0123456789ab", "spec": spec, "submitted_at": now, "updated_at": now})
    # When the control plane reads it, Then it loads (the dispatcher and reconcile read every live job)
    job = Job.model_validate_json(record)
    assert job.spec.limits.deadline_hours == 5
    # And the same spec submitted now is refused
    with pytest.raises(JobSpecError, match=r'run\.env\["MY VAR"\]: not an environment variable name'):
        parse_job_spec(spec)
    spec["run"] = {"command": "python train.py"}
    with pytest.raises(JobSpecError, match=r"limits\.deadline_hours: needs work_hours"):
        parse_job_spec(spec)


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        (
            "twice.yaml",
            MINIMAL + "limits: {max_total_cost: 5}\nlimits: {deadline_hours: 9}\n",
            "line 5: limits is given twice",
        ),
        (
            "twice.json",
            '{"name": "a", "run": {"command": "x"}, "resources": {"gpus": 1}, "name": "b"}',
            "name given twice",
        ),
    ],
)
def test_a_key_given_twice_is_refused_not_overwritten(write_file: WriteFile, name: str, text: str, says: str) -> None:
    # A second block pasted below the first would otherwise replace it silently
    with pytest.raises(JobSpecError) as refused:
        load_job_spec(write_file(name, text))
    assert says in str(refused.value)
    assert str(refused.value).startswith(f"{write_file(name, text)}: ")
