"""Hostile or huge job files, and the spec rules a security review asked for: every one is a `JobSpecError`
that names the file and what is wrong (the field, or the bound), decided before the document is expanded."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from spotrelay.models import Job, JobSpec, JobSpecError, load_job_spec, parse_job_spec
from spotrelay.models.job_spec import JOB_SPEC_LIMITS, JOB_TAGS_MAX, decode_document

WriteFile = Callable[[str, str], Path]

MINIMAL = """\
name: train
run: {command: python train.py}
resources: {gpus: 1}
"""
MINIMAL_SPEC: dict[str, Any] = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}


def billion_laughs(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**levels strings."""
    lines = ['  l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return MINIMAL + "defaults:\n" + "\n".join(lines) + "\n"


def refused(path: Path) -> str:
    """Load `path`, which must be refused; the one-line message."""
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    return message


def problem_about(error: JobSpecError, field: str) -> str:
    matching = [p for p in error.problems if p.startswith(f"{field}: ")]
    assert len(matching) == 1, f"expected one problem about {field}, got {error.problems}"
    return matching[0]


# --- bounded before and while parsing -------------------------------------------------------------------


def test_a_billion_laughs_is_refused_while_composed_not_expanded(write_file: WriteFile) -> None:
    # Given ~500 bytes of YAML whose aliases expand to 9**9 strings
    text = billion_laughs()
    assert len(text) < 600

    # When it is loaded
    message = refused(write_file("bomb.yaml", text))

    # Then it is refused for its expanded size, on the line where the bound is crossed
    assert f"more than {JOB_SPEC_LIMITS.max_nodes:,} keys and values" in message
    assert "line " in message


def test_an_alias_inside_its_own_anchor_is_refused(write_file: WriteFile) -> None:
    message = refused(write_file("loop.yaml", MINIMAL + "tags: &loop [*loop]\n"))
    assert message.endswith("line 4: *loop is inside &loop itself")


def test_aliases_a_real_spec_would_use_still_load(write_file: WriteFile) -> None:
    # Given a spec that repeats a value through an anchor
    text = MINIMAL.replace("python train.py", "&cmd python train.py") + "tags: {entry: *cmd}\n"

    # When it is loaded, Then it is the value given
    assert load_job_spec(write_file("anchors.yaml", text)).tags == {"entry": "python train.py"}


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("deep.json", "[" * 100_000 + "]" * 100_000, id="json-past-the-recursion-limit"),
        pytest.param("deep33.json", "[" * 33 + "]" * 33, id="json-33-levels"),
        pytest.param("deep.yaml", "name: " + "[" * 5_000 + "]" * 5_000 + "\n", id="yaml-flow"),
        pytest.param("block.yaml", "name:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(1, 60)), id="yaml"),
    ],
)
def test_deep_nesting_is_refused_naming_the_bound(write_file: WriteFile, name: str, text: str) -> None:
    message = refused(write_file(name, text))
    assert f"nested more than {JOB_SPEC_LIMITS.max_depth} levels deep: not a job spec" in message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(MINIMAL + "tags: {? [a, b] : c}\n", "line 4: a key is one word or number, not a list", id="list"),
        pytest.param(
            MINIMAL + "tags:\n  ? {a: b}\n  : c\n", "line 5: a key is one word or number, not a mapping", id="mapping"
        ),
    ],
)
def test_a_list_or_mapping_used_as_a_key_is_refused(write_file: WriteFile, text: str, says: str) -> None:
    assert refused(write_file("key.yaml", text)).endswith(says)


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_tens_of_thousands_of_keys_are_refused(write_file: WriteFile, suffix: str) -> None:
    # Given a spec whose environment holds 12,000 variables (24,000 keys and values)
    env = {f"V{i}": "x" for i in range(12_000)}
    spec = MINIMAL_SPEC | {"run": {"command": "python train.py", "env": env}}
    text = json.dumps(spec) if suffix == "json" else MINIMAL + "".join(f"V{i}: x\n" for i in range(12_000))

    # When it is loaded, Then it is refused for its size, not parsed key by key
    message = refused(write_file(f"wide.{suffix}", text))
    assert f"more than {JOB_SPEC_LIMITS.max_nodes:,} keys and values" in message


def test_keys_given_twice_are_found_in_one_pass_and_named_briefly() -> None:
    # Given a JSON object of 5,000 keys each given twice
    pairs = ", ".join(f'"k{i % 5_000}": 1' for i in range(10_000))

    # When it is decoded
    with pytest.raises(JobSpecError) as caught:
        decode_document("{" + pairs + "}", "twice.json")

    # Then the message names the first few and counts the rest
    (problem,) = caught.value.problems
    assert problem.startswith("k0, k1, k10, ")
    assert problem.endswith(" and 4980 more given twice in one object; keep one")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "holds a NUL byte (at byte 8): a binary file", id="png"),
        pytest.param(b"name: caf\xe9\n", "not UTF-8 text (byte 0xe9 at 9)", id="latin-1"),
        pytest.param("name: train\n".encode("utf-16"), "holds a NUL byte", id="utf-16"),
    ],
)
def test_a_binary_or_non_utf8_file_is_refused_as_not_text(tmp_path: Path, data: bytes, says: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    assert says in refused(path)


def test_a_utf8_byte_order_mark_is_no_part_of_the_text(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(MINIMAL_SPEC).encode())
    assert load_job_spec(path).name == "train"


def test_a_file_larger_than_any_spec_is_refused_unread(write_file: WriteFile) -> None:
    # Given a valid spec followed by 1.5 MiB of comment
    path = write_file("huge.yaml", MINIMAL + "#" * (3 * JOB_SPEC_LIMITS.max_bytes // 2) + "\n")

    # When it is loaded, Then it is refused for its size
    assert refused(path) == f"{path}: larger than 1 MiB: too large for a job spec"


def test_a_spec_with_thousands_of_mistakes_is_told_its_first_few(write_file: WriteFile) -> None:
    text = MINIMAL + "".join(f"unknown{i}: 1\n" for i in range(200))
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(write_file("typos.yaml", text))
    assert len(caught.value.problems) == 21
    assert caught.value.problems[-1] == "and 180 more problems"


def test_a_huge_value_is_quoted_briefly(write_file: WriteFile) -> None:
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(write_file("long.yaml", MINIMAL.replace("name: train", "name: " + "x" * 100_000)))
    assert len(str(caught.value)) < 500


def test_a_key_with_a_line_break_keeps_the_message_on_one_line(write_file: WriteFile) -> None:
    message = refused(write_file("break.yaml", MINIMAL + '"a\\nb": 1\n'))
    assert '["a\\nb"]: unknown key' in message


# --- non-finite numbers ---------------------------------------------------------------------------------


def float_fields(model: type[BaseModel] = JobSpec, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every float field of the spec's models, nested ones too."""
    found = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        nested = [a for a in (annotation, *getattr(annotation, "__args__", ())) if isinstance(a, type)]
        models = [a for a in nested if issubclass(a, BaseModel)]
        if models:
            found += float_fields(models[0], (*prefix, name))
        elif float in nested:
            found.append((*prefix, name))
    return found


def test_every_float_field_of_the_spec_is_found() -> None:
    # (so the next test covers them all)
    assert len(float_fields()) == 10
    assert ("limits", "deadline_hours") in float_fields()


@pytest.mark.parametrize("path", float_fields(), ids=".".join)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_a_non_finite_number_is_refused_naming_the_field(path: tuple[str, ...], value: float) -> None:
    # Given a spec with a non-finite number in this field (YAML .inf/.nan, JSON Infinity/NaN)
    spec = json.loads(json.dumps(MINIMAL_SPEC))
    *parents, name = path
    where = spec
    for parent in parents:
        where = where.setdefault(parent, {})
    where[name] = value

    # When it is submitted, Then it is refused naming the field: its record could not be read back
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(spec)
    assert "finite number" in problem_about(caught.value, ".".join(path))


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        pytest.param("inf.yaml", MINIMAL + "work_hours: .inf\n", "work_hours", id="yaml-inf"),
        pytest.param("nan.yaml", MINIMAL + "limits: {max_wait_hours: .nan}\n", "limits.max_wait_hours", id="yaml-nan"),
        pytest.param(
            "nan.json",
            json.dumps(MINIMAL_SPEC)[:-1] + ', "placement": {"restart_overhead_minutes": NaN}}',
            "placement.restart_overhead_minutes",
            id="json-nan",
        ),
        pytest.param(
            "inf.json", json.dumps(MINIMAL_SPEC)[:-1] + ', "work_hours": Infinity}', "work_hours", id="json-inf"
        ),
    ],
)
def test_non_finite_numbers_as_yaml_and_json_write_them_are_refused(
    write_file: WriteFile, name: str, text: str, field: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        load_job_spec(write_file(name, text))
    assert "finite number" in problem_about(caught.value, field)


# --- run.image ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "python",
        "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:v1.2_rc-3",
        "localhost:5000/train",
        "[::1]:5000/train:latest",
        "python@sha256:" + "0123456789abcdef" * 4,
        "ghcr.io/org/train:v1@sha256:" + "ab" * 32,
        "a__b/c--d/e.f",
    ],
)
def test_an_image_reference_is_accepted(image: str) -> None:
    spec = parse_job_spec(MINIMAL_SPEC | {"run": {"image": image}})
    assert spec.run.image == image


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("--privileged", "starts with -, which docker would read as an option"),
        ("-v/:/host", "starts with -, which docker would read as an option"),
        ("PyTorch/PyTorch:2.4", "the repository name must be lower case"),
        ("python:", "is not an image reference"),
        ("python:-latest", "is not an image reference"),
        ("python@sha256:abc", "is not an image reference"),
        ("ubuntu bash", "is not an image reference"),
        ("registry.io//train", "is not an image reference"),
        ("python:" + "1" * 129, "is not an image reference"),
        ("a" * 256, "the name after the registry is longer than 255 characters"),
        ("a" * 2_000, "2000 characters is not an image reference"),
    ],
)
def test_a_run_image_that_is_not_an_image_reference_is_refused(image: str, says: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(MINIMAL_SPEC | {"run": {"image": image}})
    problem = problem_about(caught.value, "run.image")
    assert says in problem
    assert "use [registry[:port]/]name[:tag][@sha256:<hex>]" in problem


# --- tags -----------------------------------------------------------------------------------------------


def test_tags_within_ec2s_rules_are_accepted() -> None:
    tags = {"team": "vision", "cost-center": "a+b=c.d_e:f/g@h-i j", "equipe": "données", "empty": ""}
    tags |= {"k" * 128: "v" * 256}
    tags |= {f"t{i}": "x" for i in range(JOB_TAGS_MAX - len(tags))}
    assert parse_job_spec(MINIMAL_SPEC | {"tags": tags}).tags == tags


@pytest.mark.parametrize(
    ("tags", "field", "says"),
    [
        # keys instance metadata cannot serve (the workers read their tags there): EC2 would refuse every launch
        ({"cost center": "x"}, 'tags["cost center"]', "a tag key is ASCII letters, digits and + - = . _ : @"),
        ({"team/ml": "x"}, 'tags["team/ml"]', "a tag key is ASCII letters, digits and + - = . _ : @"),
        ({"_index": "x"}, "tags._index", "and not . .. or _index"),
        ({"aws:createdBy": "me"}, 'tags["aws:createdBy"]', "keys starting with aws: are reserved"),
        ({"AWS:x": "me"}, 'tags["AWS:x"]', "keys starting with aws: are reserved"),
        ({"spotrelay:job-id": "other-0123456789ab"}, 'tags["spotrelay:job-id"]', "keys starting with spotrelay:"),
        ({"": "v"}, 'tags[""]', "a tag key is 1 to 128 characters (got 0)"),
        ({"k" * 129: "v"}, 'tags["' + "k" * 59 + '…"]', "a tag key is 1 to 128 characters (got 129)"),
        ({"team": "v" * 257}, "tags.team", "a tag value is at most 256 characters (got 257)"),
        ({"team": "a;b"}, "tags.team", "the tag value holds ';': use letters, numbers, spaces and + - = . _ : / @"),
        ({"te$am": "a"}, 'tags["te$am"]', "a tag key is ASCII letters, digits and"),
        ({f"t{i}": "x" for i in range(JOB_TAGS_MAX + 1)}, "tags", f"{JOB_TAGS_MAX + 1} tags; a job may have at most"),
    ],
)
def test_tags_ec2_would_refuse_are_refused_at_submission(tags: dict[str, str], field: str, says: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(MINIMAL_SPEC | {"tags": tags})
    assert says in problem_about(caught.value, field)


def test_a_job_stored_before_the_image_and_tag_rules_still_reads_back() -> None:
    # Given the record of a job submitted before run.image and tags were checked
    spec = MINIMAL_SPEC | {"run": {"image": "Old/Image:"}, "tags": {"aws:x": "1", "a;b": "c"}}
    now = "2026-11-30T12:00:00Z"
    record = json.dumps({"job_id": "train-0123456789ab", "spec": spec, "submitted_at": now, "updated_at": now})

    # When the control plane reads it, Then it loads
    job = Job.model_validate_json(record)
    assert job.spec.run.image == "Old/Image:"
    # And the same spec submitted now is refused
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(spec)
    problem_about(caught.value, "run.image")
    problem_about(caught.value, 'tags["aws:x"]')


# --- text a process and a path can be given -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"run": {"command": "echo a\x00b"}}, "run.command", "holds the control character '\\x00'"),
        ({"run": {"command": "echo \x1b[2J"}}, "run.command", "holds the control character '\\x1b'"),
        ({"run": {"command": "x", "env": {"A": "a\x00b"}}}, "run.env.A", "holds a NUL character"),
        ({"checkpoint": {"dir": "/ck\x00pt"}}, "checkpoint.dir", "use a plain absolute path"),
        ({"checkpoint": {"dir": "/"}}, "checkpoint.dir", "use a plain absolute path"),
        ({"checkpoint": {"dir": "/ckpt/../etc"}}, "checkpoint.dir", "use a plain absolute path"),
        ({"checkpoint": {"dir": "/etc/hostname/ck"}}, "checkpoint.dir", "/etc is the system's"),
        ({"checkpoint": {"dir": "/proc/x"}}, "checkpoint.dir", "/proc is the system's"),
    ],
)
def test_what_no_process_or_directory_can_take_is_refused(fields: dict[str, Any], field: str, says: str) -> None:
    # a job its instance could never start would fail (and burn an instance) on every attempt
    with pytest.raises(JobSpecError) as raised:
        parse_job_spec({**MINIMAL_SPEC, **fields})
    assert f"{field}: " in str(raised.value)
    assert says in str(raised.value)


def test_multi_line_commands_and_a_checkpoint_dir_of_the_jobs_own_are_fine() -> None:
    spec = parse_job_spec(
        {**MINIMAL_SPEC, "run": {"command": "set -e\n\tpython train.py\r\n"}, "checkpoint": {"dir": "/mnt/ckpt"}}
    )
    assert spec.checkpoint.dir == "/mnt/ckpt"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("limits: {max_interruptions: " + "9" * 5000 + "}", "a number of 5000 characters"),
        ("limits: {max_interruptions: 0x" + "f" * 5000 + "}", "a number of 5002 characters"),
        ("work_hours: " + "1:" * 3000 + "1.5", "a number of 6003 characters"),
    ],
)
def test_a_yaml_number_too_long_for_any_field_is_refused_not_a_traceback(text: str, says: str) -> None:
    with pytest.raises(JobSpecError, match=says):
        decode_document(text, "job.yaml")


@pytest.mark.parametrize("field", ["work_hours", "limits.deadline_hours", "limits.max_wait_hours"])
def test_hours_no_job_spans_are_refused_before_a_date_overflows(field: str) -> None:
    # `spotrelay status` adds max_wait_hours to a date: 1e300 hours overflowed it (a traceback)
    fields: dict[str, Any] = {"work_hours": 1e300} if field == "work_hours" else {"limits": {field[7:]: 1e300}}
    with pytest.raises(JobSpecError, match=rf"{field}: at most 100,000 hours"):
        parse_job_spec({**MINIMAL_SPEC, **fields})


def test_a_huge_unknown_key_is_named_within_one_bounded_line() -> None:
    with pytest.raises(JobSpecError) as raised:
        parse_job_spec({**MINIMAL_SPEC, "k" * 1_000_000: 1})
    assert len(str(raised.value)) < 1_000
    assert "unknown key" in str(raised.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("work_hours: 1:30", r"1:30 is ambiguous: YAML 1.1 reads 1:30 as a base-60 number \(90\)"),
        ("resources: {gpus: 1, min_vcpus: 010}", "010 is ambiguous: YAML 1.1 reads a number with a leading 0 as octal"),
    ],
)
def test_numbers_yaml_would_silently_change_are_refused(text: str, says: str) -> None:
    with pytest.raises(JobSpecError, match=says):
        decode_document(text, "job.yaml")


def test_a_fifo_is_refused_rather_than_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    with pytest.raises(JobSpecError, match="not a regular file"):
        load_job_spec(fifo)


@pytest.mark.parametrize("key", ["ключ", "keyé", "²", "team\u00a0ml", "a,b"])
def test_tag_keys_instance_metadata_cannot_serve_are_refused(key: str) -> None:
    with pytest.raises(JobSpecError, match="a tag key is ASCII letters, digits and"):
        parse_job_spec({**MINIMAL_SPEC, "tags": {key: "x"}})
