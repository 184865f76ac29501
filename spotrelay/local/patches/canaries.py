"""The canaries: what each patched moto attribute looked like when its patch was written (`Expected`), and
the check that moto still is that (`moto_differences`, `check_moto`; `install` refuses any difference).

Each subsystem's module (sibling of this one in spotrelay.local.patches) lists its own `Expected` entries next
to its patch; the package assembles them into `EXPECTED`. `_ORIGINALS` holds the unpatched attributes while the
patches are installed (written by `installation._Patcher`, read here), so that the canary reads moto's own.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import moto

MOTO_VERSION = "5.2.5"
_ORIGINALS: dict[tuple[int, str], Any] = {}  # the unpatched attributes while installed (for the canary)


@dataclass(frozen=True)
class Expected:
    """What a patched moto attribute looked like when the patch was written."""

    owner: Any  # class or module
    name: str
    signature: str | None  # str(inspect.signature(...)); None for a non-callable attribute
    body_lines: tuple[str, ...] = ()  # lines of moto's source the patch depends on (stripped)

    @property
    def where(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))
        module = getattr(self.owner, "__module__", None) or getattr(self.owner, "__name__", "")
        return f"{module}.{owner}.{self.name}" if module != owner else f"{owner}.{self.name}"


class MotoChanged(RuntimeError):
    """moto is not the version spotrelay.local patches: upgrading moto needs these patches revisited."""


def _unwrapped(owner: Any, name: str) -> Any:
    """The attribute as moto defines it (classmethods and staticmethods unwrapped, a property's getter)."""
    raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else getattr(owner, name)
    if isinstance(raw, property):
        return raw.fget
    return raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw


def moto_differences(expectations: Sequence[Expected] | None = None) -> list[str]:
    """Every way moto differs from what the patches expect (empty: safe to patch); by default, of every
    patch's canaries (`spotrelay.local.patches.EXPECTED`)."""
    if expectations is None:  # assembled by the package from its modules, which import this one
        from spotrelay.local.patches import EXPECTED

        expectations = EXPECTED
    problems = []
    if moto.__version__ != MOTO_VERSION:
        problems.append(f"moto {moto.__version__} is installed; spotrelay.local patches moto {MOTO_VERSION}")
    for expected in expectations:
        target = _ORIGINALS.get((id(expected.owner), expected.name))
        if target is None:
            try:
                target = _unwrapped(expected.owner, expected.name)
            except AttributeError:
                problems.append(f"{expected.where}: missing")
                continue
        if expected.signature is not None:
            try:
                signature = str(inspect.signature(target))
            except (TypeError, ValueError):
                problems.append(f"{expected.where}: not a function any more")
                continue
            if signature != expected.signature:
                problems.append(f"{expected.where}: signature {signature} (expected {expected.signature})")
        if expected.body_lines:
            try:
                source_lines = {line.strip() for line in inspect.getsource(target).splitlines()}
            except (OSError, TypeError):
                problems.append(f"{expected.where}: source not available")
                continue
            problems.extend(
                f"{expected.where}: no longer contains {line!r}"
                for line in expected.body_lines
                if line not in source_lines
            )
    return problems


def check_moto() -> None:
    """Raise MotoChanged, naming every difference, unless moto is exactly what the patches expect."""
    problems = moto_differences()
    if problems:
        raise MotoChanged("spotrelay.local cannot patch this moto:\n  " + "\n  ".join(problems))
