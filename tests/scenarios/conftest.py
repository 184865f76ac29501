"""Scenario tests: each scenario of events/scenarios replayed once per session (the synthesized stack in
moto, on the virtual clock), its result shared by the tests that read it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from spotrelay.local.replay import ReplayResult, replay
from spotrelay.local.scenario import load_scenario

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = REPO_ROOT / "events" / "scenarios"


_RESULTS: dict[tuple[str, int | None], ReplayResult] = {}


@pytest.fixture(scope="session")
def replayed(synthesized_template: Path) -> Callable[..., ReplayResult]:
    """replayed("happy-path") -> the replay of events/scenarios/happy-path.yaml (once per session)."""

    def run(name: str, seed: int | None = None) -> ReplayResult:
        key = (name, seed)
        if key not in _RESULTS:
            _RESULTS[key] = replay(load_scenario(SCENARIOS / f"{name}.yaml"), seed=seed, template=synthesized_template)
        result = _RESULTS[key]
        # Whatever a test reads of it, no scenario may break an invariant (spotrelay.local.invariants)
        assert result.invariant_checks > 0
        assert result.violations == [], [v.detail for v in result.violations]
        return result

    return run
