"""Shared fixtures: where the recorded examples live, and a writer for job files."""

from __future__ import annotations

import fcntl
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


@pytest.fixture(scope="session")
def synthesized_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cdk.out/SpotRelay.template.json, synthesized now (once, under a lock across test workers) if missing."""
    from spotrelay.local import DeployError, synthesize, template_path  # moto: only for the tests that deploy

    template = template_path(REPO_ROOT / "cdk.out")
    if template.is_file():
        return template
    lock_file = tmp_path_factory.getbasetemp().parent / "spotrelay-synth.lock"
    with lock_file.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.is_file():
            try:
                synthesize(REPO_ROOT)
            except DeployError as e:
                pytest.skip(f"no synthesized template, and it cannot be made here: {e}")
    return template
