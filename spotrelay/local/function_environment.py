"""A Lambda function's environment, seen only by the thread that runs its handler.

Why: the in-process Lambdas (`spotrelay.local.lambdas`) must not set a function's variables in the
process-wide `os.environ` around each handler call and pop them after. Other threads (moto's Step
Functions executions, the local server's request threads, test code) read `os.environ` meanwhile;
botocore iterates it whenever it makes a client, and a key popped in the middle of that iteration
raises KeyError. Serializing invocations with a lock does not help: the readers take no lock.

What: `install()` turns `os.environ` into an `_OverlaidEnviron` by assigning its `__class__` (a
subclass of `os._Environ` that adds nothing to the instance). It stays the same object, so code
holding it from before (`from os import environ`, moto does) sees the overlay too, and `os.getenv`
(which calls `os.environ.get`) needs nothing of its own. While no function environment is active on
the current thread, every method is `os._Environ`'s own: reads and writes go to the shared mapping
and, for writes, to the C-level environment (`putenv`/`unsetenv`), exactly as without it. So
installing it is harmless, and installing it twice is a no-op.

`function_environment(variables, hidden_prefixes)` activates, for the `with` block and only in the
current thread's context (a `ContextVar`: each thread starts with an empty context, asyncio tasks
the handler creates copy it), a view of the environment: the shared base mapping, with `variables`
applied and every other variable whose name starts with one of `hidden_prefixes` hidden. Lookups
(`[]`, `get`, `os.getenv`, `in`), iteration, `len`, `copy()`, `dict(os.environ)`,
`{**os.environ}` and `repr` on that thread see the view; every other thread sees the base. Blocks
nest: an inner block's view is made from the base (not from the outer view) and the outer view is
back when it ends. Nothing is inserted into or removed from the shared mapping, and the C-level
environment is not touched, by entering or leaving a block.

Writes made on the thread while a view is active (`os.environ[k] = v`, `del`, `pop`, `update`,
`setdefault`, ...) go to the view only: the handler sees them for the rest of its invocation, no
other thread ever does, and they are gone when the block ends (`putenv` is not called).

Limits: `os.environb` and the C-level environment always show the base. A thread a handler starts
itself, or a subprocess it starts without `env=`, gets the base environment, not the function's;
pass `env=dict(os.environ)` to give a subprocess the function's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _FunctionView:
    """What one invocation sees on top of the base environment, and the writes it made."""

    assigned: dict[str, str]  # the function's variables, then whatever the handler set
    hidden_prefixes: tuple[str, ...]
    removed: set[str] = field(default_factory=set)  # what the handler deleted

    def shows_base(self, key: str) -> bool:
        """Whether the base's value of `key` (if the base has one) is what this view shows."""
        return key not in self.assigned and key not in self.removed and not key.startswith(self.hidden_prefixes)


_CURRENT_VIEW: ContextVar[_FunctionView | None] = ContextVar("spotrelay_function_environment", default=None)


class _OverlaidEnviron(os._Environ[str]):
    """`os.environ`, whose reads and writes on a thread with an active view go through the view."""

    _data: MutableMapping[Any, Any]  # os._Environ's shared mapping (bytes keys on POSIX)

    def _key(self, key: str) -> str:
        return self.decodekey(self.encodekey(key))  # the type check and case folding os.environ applies

    def _base_keys(self) -> list[str]:
        return [self.decodekey(k) for k in list(self._data)]  # list() of a dict is atomic

    def __getitem__(self, key: str) -> str:
        view = _CURRENT_VIEW.get()
        if view is None:
            return super().__getitem__(key)
        key = self._key(key)
        if key in view.assigned:
            return view.assigned[key]
        if not view.shows_base(key):
            raise KeyError(key)
        return super().__getitem__(key)

    def __setitem__(self, key: str, value: str) -> None:
        view = _CURRENT_VIEW.get()
        if view is None:
            super().__setitem__(key, value)
            return
        key = self._key(key)
        self.encodevalue(value)  # the type check os.environ applies
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"illegal environment variable {key!r}")  # what putenv would refuse
        view.assigned[key] = value
        view.removed.discard(key)

    def __delitem__(self, key: str) -> None:
        view = _CURRENT_VIEW.get()
        if view is None:
            super().__delitem__(key)
            return
        if key not in self:
            raise KeyError(key)
        key = self._key(key)
        view.assigned.pop(key, None)
        view.removed.add(key)

    def __iter__(self) -> Iterator[str]:
        view = _CURRENT_VIEW.get()
        if view is None:
            yield from super().__iter__()
            return
        base_keys = self._base_keys()
        assigned = list(view.assigned)
        yield from (k for k in base_keys if view.shows_base(k))
        yield from assigned

    def __len__(self) -> int:
        if _CURRENT_VIEW.get() is None:
            return super().__len__()
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        if _CURRENT_VIEW.get() is None:
            return super().__repr__()
        return f"environ({dict(self)!r})"


def install() -> None:
    """Make `os.environ` an `_OverlaidEnviron` (in place; a no-op if it is one already)."""
    environ = os.environ
    if isinstance(environ, _OverlaidEnviron):
        return
    if type(environ) is not os._Environ:
        raise RuntimeError(f"os.environ is a {type(environ).__qualname__}, not os._Environ: cannot overlay it")
    environ.__class__ = _OverlaidEnviron


def installed() -> bool:
    return isinstance(os.environ, _OverlaidEnviron)


@contextmanager
def function_environment(variables: Mapping[str, str], hidden_prefixes: tuple[str, ...] = ()) -> Iterator[None]:
    """On this thread only, for the block: the base environment with `variables` applied and other
    variables whose names start with `hidden_prefixes` hidden (see the module docstring)."""
    install()
    token = _CURRENT_VIEW.set(_FunctionView(dict(variables), hidden_prefixes))
    try:
        yield
    finally:
        _CURRENT_VIEW.reset(token)
