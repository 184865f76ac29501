"""Shared fixtures: where the recorded examples live, and a writer for job files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    """The checkout root: the working directory of the `spotrelay` commands in the README."""
    return REPO_ROOT


@pytest.fixture
def events_dir() -> Path:
    """The recorded examples (`events/jobs`, `events/prices`); tests load them from here and nowhere else."""
    return REPO_ROOT / "events"


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write `text` to `tmp_path / name` and return the path (a job spec, a price table, ...)."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
