"""One way of saying what is wrong with which field, for every document and record we read."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spotrelay.field_problems import (
    MAX_PROBLEM_CHARS,
    PROBLEMS_SHOWN,
    SpecFieldError,
    field_path,
    field_problem,
    field_problems,
)


class _Repeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int
    every: float = 24.0


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z]+$", description="lower-case letters")
    repeat: _Repeat | None = None
    tags: dict[str, str] = {}
    start: float = Field(default=0.0, alias="from")

    @field_validator("tags")
    @classmethod
    def _no_empty_values(cls, tags: dict[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if not value:
                raise SpecFieldError((key,), "a tag needs a value")
        return tags


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[_Entry]


def problems_of(document: object, *, show_input: bool = False) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        _File.model_validate(document)
    return field_problems(caught.value, model=_File, show_input=show_input)


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("resources", "gpus"), "resources.gpus"),
        (("jobs", 0, "repeat", "every"), "jobs[0].repeat.every"),
        (("run", "env", "MY_VAR"), "run.env.MY_VAR"),
        (("tags", "cost-center"), "tags.cost-center"),
        # a key that would read as more than one part of the path, or run into the message, is quoted
        (("tags", "team:owner"), 'tags["team:owner"]'),
        (("on_demand_usd_per_hour", "p3.2xlarge"), 'on_demand_usd_per_hour["p3.2xlarge"]'),
        (("run", "env", "MY VAR"), 'run.env["MY VAR"]'),
        (("tags", ""), 'tags[""]'),
        (("a\nb",), '["a\\nb"]'),
        ((), ""),
    ],
)
def test_a_path_reads_as_the_document_it_points_into(loc: tuple[str | int, ...], path: str) -> None:
    assert field_path(loc) == path


def test_a_huge_key_is_named_not_echoed() -> None:
    assert field_path(("tags", "k" * 1_000_000)) == 'tags["' + "k" * 59 + '…"]'


def test_each_problem_names_its_field_and_what_is_allowed_there() -> None:
    # Given a file whose second job has a bad name, an unknown key, a key of `repeat` misspelt, a tag
    # without a value and no count
    document = {
        "jobs": [
            {"name": "ok"},
            {"name": "Bad", "colour": 1, "repeat": {"evry": 1}, "tags": {"team": ""}, "from": "soon"},
        ]
    }

    # When it is read, Then each problem is one line naming the field by its path
    assert problems_of(document, show_input=True) == [
        "jobs[1].name: use lower-case letters (got 'Bad')",
        "jobs[1].repeat.count: required",
        "jobs[1].repeat.evry: unknown key (did you mean every?); allowed keys here: count, every",
        "jobs[1].tags.team: a tag needs a value",
        "jobs[1].from: Input should be a valid number, unable to parse string as a number (got 'soon')",
        "jobs[1].colour: unknown key; allowed keys here: name, repeat, tags, from",
    ]


def test_a_value_is_quoted_only_when_asked_and_then_bounded() -> None:
    # Given a name far too long, with a line break
    document = {"jobs": [{"name": "a\n" + "x" * 1_000_000}]}

    # Then a stored record's problem does not quote it, and a user's own quotes a bounded, one-line part
    (hidden,) = problems_of(document)
    (quoted,) = problems_of(document, show_input=True)
    assert hidden == "jobs[0].name: use lower-case letters"
    assert quoted.startswith("jobs[0].name: use lower-case letters (got 'a\\nxxx")
    assert len(quoted) < 120


def test_a_mapping_given_something_else_is_told_its_keys() -> None:
    assert problems_of({"jobs": [3]}, show_input=True) == [
        "jobs[0]: expected a mapping of keys (name, repeat, tags, from), got int"
    ]


def test_a_document_with_thousands_of_mistakes_is_told_its_first_few() -> None:
    # Given 100 entries, each with an unknown key 10,000 characters long
    document = {"jobs": [{"name": "ok", "k" * 10_000 + str(i): 1} for i in range(100)]}

    # Then the first problems are shown, each within its bound, then how many more there are
    problems = problems_of(document, show_input=True)
    assert len(problems) == PROBLEMS_SHOWN + 1
    assert problems[-1] == f"and {100 - PROBLEMS_SHOWN} more problems"
    assert all(len(p) <= MAX_PROBLEM_CHARS for p in problems)


def test_a_problem_of_a_nested_model_keeps_its_whole_path() -> None:
    # Given the same entry nested one level deeper than a document's root (as a stored job holds its spec)
    class Stored(BaseModel):
        entry: _Entry

    with pytest.raises(ValidationError) as caught:
        Stored.model_validate({"entry": {"name": "ok", "tags": {"team": ""}}})

    # Then the validator's field is named below where the model sits
    (error,) = caught.value.errors()
    assert field_problem(error) == "entry.tags.team: a tag needs a value"
