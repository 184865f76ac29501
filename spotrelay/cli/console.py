"""Where the commands print, and their one-line errors."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a one-line error and exit non-zero."""
    err.print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def option_seconds(text: str, option: str) -> float:
    """The seconds of a duration option (`2m`, `30s`, `1h`; spotrelay.market.parse_duration), or the option's
    one-line error and exit 2."""
    from spotrelay.market import parse_duration

    try:
        return parse_duration(text, option) * 3600
    except ValueError as e:
        fail(str(e))


def tables() -> Console:
    """Where tables go: the terminal at its width, or 160 columns when stdout is a file or a pipe (rich
    would assume 80 and truncate ids)."""
    return out if out.is_terminal else Console(highlight=False, width=160)
