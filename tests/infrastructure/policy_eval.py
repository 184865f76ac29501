"""A small, exact evaluator of the IAM statement forms spotrelay's policies use.

moto's IAM evaluation (moto.iam.access_control) ignores conditions, so it cannot tell job A's
credentials from job B's. This one evaluates, for one request:
- `Action` and `Resource` globs (`*`, `?`; actions case-insensitively), no NotAction/NotResource;
- the policy variables `${aws:PrincipalTag/<key>}` (and any `${<context key>}`), in resources and
  condition values: a variable the request has no value for makes its statement not apply;
- conditions StringEquals, StringLike, ForAllValues:StringEquals (true when the key is absent, as in
  IAM), ForAnyValue:StringEquals, Null; several keys or operators must all hold, any listed value may;
- an explicit Deny wins over any Allow; no Allow is an implicit deny;
- a session's permissions are the intersection of its role's policies and its session policy (each is
  evaluated on its own and both must allow).
Anything else (another operator, NotAction, ...) raises, so a policy using it cannot pass by accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_VARIABLE = re.compile(r"\$\{([^}]+)\}")
SUPPORTED_KEYS = {"Sid", "Effect", "Action", "Resource", "Condition"}
OPERATORS = {"Null", "StringEquals", "StringLike", "ForAllValues:StringEquals", "ForAnyValue:StringEquals"}


class Unresolved(Exception):
    """A policy variable with no value in the request."""


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: Mapping[str, str | Sequence[str]] = field(default_factory=dict)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _glob(pattern: str, text: str, *, ignore_case: bool = False) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL) is not None


def _substitute(text: str, context: Mapping[str, str | Sequence[str]]) -> str:
    def value(match: re.Match[str]) -> str:
        found = context.get(match[1])
        if not isinstance(found, str):
            raise Unresolved(match[1])
        return found

    return _VARIABLE.sub(value, text)


def _values(context: Mapping[str, str | Sequence[str]], key: str) -> list[str] | None:
    found = context.get(key)
    if found is None:
        return None
    return [found] if isinstance(found, str) else list(found)


def _condition_holds(operator: str, key: str, expected: list[str], request: Request) -> bool:
    actual = _values(request.context, key)
    if operator == "Null":
        [flag] = expected
        return (actual is None) == (flag == "true")
    if operator == "StringEquals":
        return actual is not None and len(actual) == 1 and actual[0] in expected
    if operator == "StringLike":
        return actual is not None and len(actual) == 1 and any(_glob(p, actual[0]) for p in expected)
    if operator == "ForAllValues:StringEquals":
        return actual is None or all(value in expected for value in actual)
    if operator == "ForAnyValue:StringEquals":
        return actual is not None and any(value in expected for value in actual)
    raise NotImplementedError(f"condition operator {operator}")


def statement_applies(statement: Mapping[str, Any], request: Request) -> bool:
    unknown = set(statement) - SUPPORTED_KEYS
    if unknown:
        raise NotImplementedError(f"statement elements {sorted(unknown)}")
    operators = set(statement.get("Condition", {})) - OPERATORS
    if operators:
        raise NotImplementedError(f"condition operators {sorted(operators)}")
    if not any(_glob(a, request.action, ignore_case=True) for a in _as_list(statement["Action"])):
        return False
    try:
        if not any(_glob(_substitute(r, request.context), request.resource) for r in _as_list(statement["Resource"])):
            return False
        for operator, keys in statement.get("Condition", {}).items():
            for key, expected in keys.items():
                values = [_substitute(str(v), request.context) for v in _as_list(expected)]
                if not _condition_holds(operator, key, values, request):
                    return False
    except Unresolved:
        return False
    return True


def decision(statements: Iterable[Mapping[str, Any]], request: Request) -> str:
    """ "Allow", "Deny" (explicit) or "ImplicitDeny" for one policy set."""
    applying = [s for s in statements if statement_applies(s, request)]
    if any(s["Effect"] == "Deny" for s in applying):
        return "Deny"
    return "Allow" if any(s["Effect"] == "Allow" for s in applying) else "ImplicitDeny"


def allowed(request: Request, *policy_sets: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every policy set allows the request (a role's policies, then a session policy, ...)."""
    return all(decision(list(statements), request) == "Allow" for statements in policy_sets)
