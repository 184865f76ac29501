"""Scenario tests: each scenario of events/scenarios replayed once per session (the synthesized stack in
moto, on the virtual clock), its result shared by the tests that read it."""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path

import pytest

from spotrelay.local import DeployError, synthesize, template_path
from spotrelay.local.replay import ReplayResult, replay
from spotrelay.local.scenario import load_scenario

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = REPO_ROOT / "events" / "scenarios"


@pytest.fixture(scope="session")
def synthesized_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cdk.out/SpotRelay.template.json, synthesized now (once, under a lock across test workers) if missing."""
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


_RESULTS: dict[tuple[str, int | None], ReplayResult] = {}


@pytest.fixture(scope="session")
def replayed(synthesized_template: Path) -> Callable[..., ReplayResult]:
    """replayed("happy-path") -> the replay of events/scenarios/happy-path.yaml (once per session)."""

    def run(name: str, seed: int | None = None) -> ReplayResult:
        key = (name, seed)
        if key not in _RESULTS:
            _RESULTS[key] = replay(load_scenario(SCENARIOS / f"{name}.yaml"), seed=seed, template=synthesized_template)
        return _RESULTS[key]

    return run
