"""One synthesis of the default stack (cdk.json context) per test session, shared by every module."""

from __future__ import annotations

import pytest

from infrastructure.synth import Synthesized, synthesize


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    return synthesize(tmp_path_factory.mktemp("cdk.out"))
