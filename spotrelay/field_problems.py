"""What is wrong with which field: a pydantic ValidationError as one line per error, `path: what is wrong`.

Every reader of a user's document (a job spec, a scenario, its market, a workload file) and of our own
records says it this way, so a user meets one way of naming a field wherever they made the mistake.
A path is written as the YAML or JSON it points into reads: keys joined by dots, list positions in
brackets, and a key that would be misread as more than one (a dot, a bracket, a colon, a space...) quoted
in brackets: `resources.gpus`, `jobs[0].repeat.every`, `run.env.HOME`, `tags["team:owner"]`.

Bounded, as user input can be huge: a value a line shows is at most `SHOWN_MAX_CHARS` (a 1 MB key is
named, not echoed), a line is at most `MAX_PROBLEM_CHARS`, and `field_problems` gives the first
`PROBLEMS_SHOWN` errors, then how many more there are.
"""

from __future__ import annotations

import difflib
import json
import re
import reprlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import date, time
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

Loc = tuple[str | int, ...]

SHOWN_MAX_CHARS = 60  # of a value or a key a message quotes: enough to find it, not all of a 1 MiB string
MAX_PROBLEM_CHARS = 400  # of one line: a huge value cannot crowd out the other problems
# A document with thousands of mistakes (a file of 50,000 unknown keys) is told its first few, not given a
# message as long as the file
PROBLEMS_SHOWN = 20
_CLOSE_MATCH_MAX_CHARS = 100  # difflib compares keys no longer than this (a 1 MB key is no typo)

_SHOWN = reprlib.Repr()  # (its keyword arguments are Python 3.12's)
_SHOWN.maxstring = _SHOWN.maxother = SHOWN_MAX_CHARS
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4
_SHOWN.maxlevel = 2

_PLAIN_KEY = re.compile(r"[\w-]+")  # a key written as is after a dot; any other is quoted
_MAPPING_EXPECTED = frozenset({"model_type", "model_attributes_type", "dict_type"})
_SAYS_ITS_VALUE = frozenset({"value_error", "assertion_error"})  # our validators' messages quote what they refuse


class SpecFieldError(ValueError):
    """A problem a validator finds below the value it validates, named by its path from there: raised by
    the validator of `run.env` with `below=("HOME",)`, it reads `run.env.HOME: ...`; by a model validator
    of `resources` with `below=("gpus",)`, `resources.gpus: ...`. (A problem of the value itself is a
    plain ValueError.) Relative, so the path stays right wherever the model is nested (a stored job's
    `spec.resources.gpus`)."""

    def __init__(self, below: Loc, message: str) -> None:
        super().__init__(message)
        self.below = below


def field_path(loc: Sequence[str | int]) -> str:
    """`jobs[0].repeat.every`: keys after dots, list positions in brackets, any other key quoted in
    brackets (`tags["a.b"]`), a key longer than SHOWN_MAX_CHARS cut."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif len(part) <= SHOWN_MAX_CHARS and _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            key = part if len(part) <= SHOWN_MAX_CHARS else part[: SHOWN_MAX_CHARS - 1] + "…"
            text += f"[{json.dumps(key, ensure_ascii=False)}]"
    return text


def shown(value: object) -> str:
    """`value` as a message quotes it: its repr (a time as ISO 8601, as it was written), in at most about
    SHOWN_MAX_CHARS characters."""
    return value.isoformat() if isinstance(value, date | time) else _SHOWN.repr(value)


def one_line(text: str, limit: int | None = MAX_PROBLEM_CHARS) -> str:
    """`text` with its line breaks and other control characters escaped, in at most `limit` characters
    (None: as long as it is)."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def unknown_key(key: str, allowed: Sequence[str], listed: str | None = None) -> str:
    """`unknown key (did you mean every?); allowed keys here: count, every`; `listed`: the allowed keys as
    said, if not as a list."""
    close = difflib.get_close_matches(key, allowed, n=1) if len(key) <= _CLOSE_MATCH_MAX_CHARS else []
    hint = f" (did you mean {close[0]}?)" if close else ""
    keys = listed or ", ".join(allowed)
    return f"unknown key{hint}; allowed keys here: {keys}" if keys else f"unknown key{hint}"


def field_problem(error: Mapping[str, Any], *, model: type[BaseModel] | None = None, show_input: bool = False) -> str:
    """One pydantic error (an item of `ValidationError.errors()`) as `path: what is wrong`, one bounded line.

    `model`: the model the document was validated as, to say which keys are allowed where one is unknown
    or a mapping is missing, and a field's description where a text does not match its pattern.
    `show_input`: quote the value refused (bounded): for a user's own document, not for a stored record,
    whose values (a job's environment) may go to logs another user reads."""
    loc: Loc = tuple(part for part in error["loc"] if not _is_union_tag(part))
    kind = error["type"]
    value = error.get("input")
    got = f" (got {shown(value)})" if show_input and "input" in error and not isinstance(value, dict) else ""
    ctx_error = (error.get("ctx") or {}).get("error")
    if isinstance(ctx_error, SpecFieldError):
        loc, message = (*loc, *ctx_error.below), str(ctx_error)
    elif kind == "missing":
        message = "required"
    elif kind == "extra_forbidden":
        key = loc[-1] if loc else ""
        message = unknown_key(str(key), _keys(_model_at(model, loc[:-1])))
    elif kind in _MAPPING_EXPECTED and (keys := _keys(_model_at(model, loc))):
        message = f"expected a mapping of keys ({', '.join(keys)}), got {_kind(value)}"
    elif kind == "string_pattern_mismatch" and (described := _description(model, loc)):
        message = f"use {described}{got}"
    else:
        message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if kind not in _SAYS_ITS_VALUE:
            message += got
    where = field_path(loc)
    return one_line(f"{where}: {message}" if where else message)


def field_problems(
    error: ValidationError,
    *,
    model: type[BaseModel] | None = None,
    show_input: bool = False,
    at_most: int = PROBLEMS_SHOWN,
    describe: Callable[[Mapping[str, Any]], str] | None = None,
) -> list[str]:
    """The error's first `at_most` problems (`field_problem`, with `model` and `show_input`), then
    `and N more problems` if there are more. `describe`: the caller's own wording of one error (which
    calls `field_problem` for what it does not word itself), bounded as field_problem's."""
    errors = error.errors(include_url=False)
    lines = [
        one_line(describe(e)) if describe is not None else field_problem(e, model=model, show_input=show_input)
        for e in errors[:at_most]
    ]
    return and_more(lines, len(errors))


def and_more(first: list[str], total: int) -> list[str]:
    """The `first` problems of `total`, then `and N more problems` if there are more."""
    more = total - len(first)
    return [*first, f"and {more} more problem{'s' if more > 1 else ''}"] if more > 0 else first


def _is_union_tag(part: str | int) -> bool:
    # pydantic puts the union member it tried ('function-after[...]', 'list[str]') into the location
    return isinstance(part, str) and "[" in part


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's fields by every key a document may give them under: the alias (`from`), the name."""
    fields = dict(model.model_fields)
    fields.update({f.alias: f for f in model.model_fields.values() if f.alias})
    return fields


def _keys(model: type[BaseModel] | None) -> list[str]:
    """The keys a document may give a mapping read as `model` (none excluded from it, as a base directory
    the loader adds)."""
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items() if not f.exclude]


def _model_at(model: type[BaseModel] | None, loc: Loc) -> type[BaseModel] | None:
    """The model of the mapping at `loc` under `model` (list positions step into the list's items)."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = _fields(model).get(part)
        model = _model_in(field.annotation) if field is not None else None
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated, list, tuple):
        for arg in typing.get_args(annotation):
            if (found := _model_in(arg)) is not None:
                return found
    return None


def _description(model: type[BaseModel] | None, loc: Loc) -> str | None:
    """The description of the field at `loc`, which says what is allowed there."""
    parent = _model_at(model, loc[:-1]) if loc else None
    field = _fields(parent).get(str(loc[-1])) if parent is not None else None
    return field.description if field is not None else None
