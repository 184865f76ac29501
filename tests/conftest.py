"""Shared fixtures: where the recorded examples live, and a writer for job files; and the order tests run
in, the slowest first, so that the two workers of `make unit` (pytest -n 2, one test at a time to whichever
is free) finish together instead of one running the long replays alone at the end."""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

# Seconds per test (setup + call + teardown) of the tests that take one or more, as measured on the 2-core
# runner: `pytest -n 2 --record-durations tests/durations.json` writes it again. A test missing from it
# counts as fast; a stale figure only makes the order a little less good, never a test fail.
DURATIONS = REPO_ROOT / "tests" / "durations.json"
RECORDED_FROM_SECONDS = 1.0
# Tests using these fixtures start before all others whatever the file says: the scenario replays, the
# longest of the suite, and growing as the replayed agent does more.
FIRST_FIXTURES = frozenset({"replayed"})


# The property tests draw the same examples on every run: `make test` must not pass or fail by luck (a
# rounding edge hypothesis drew once failed a fresh clone), and no example is bound by wall-clock time
# (hypothesis' default deadline). `pytest --hypothesis-profile=explore` draws new examples each run.
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile("deterministic")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help=f"after a run of the whole suite, write the tests that took {RECORDED_FROM_SECONDS:g} s or more to PATH "
        "(tests/durations.json: the order tests run in)",
    )


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text())
    return {str(nodeid): float(seconds) for nodeid, seconds in loaded.items()}


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, on the plain node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The replays first, then the modules holding the longest tests, each module's tests the longest first.
    A module stays in one piece, so its module-scoped fixtures are made once per worker. Every worker collects
    the same order (xdist checks), and the controller hands the tests out in it."""
    seconds = recorded_durations()

    def rank(test: pytest.Item) -> tuple[bool, float]:
        first = bool(FIRST_FIXTURES.intersection(getattr(test, "fixturenames", ())))
        return not first, -seconds.get(test.nodeid, 0.0)

    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted((sorted(tests, key=rank) for tests in modules.values()), key=lambda tests: rank(tests[0]))
    items[:] = [test for tests in ordered for test in tests]  # sorts are stable: ties keep pytest's order


class DurationRecorder:
    """Sums each test's setup, call and teardown as reported (by the workers, under xdist) and writes the
    slow ones at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        slow = {
            n: round(s, 1) for n, s in sorted(self.seconds.items(), key=lambda x: -x[1]) if s >= RECORDED_FROM_SECONDS
        }
        self.path.write_text(json.dumps(slow, indent=1) + "\n")


class WorkerBalance:
    """Under xdist, on the controller: when each worker reported its last test, from the session's start,
    and how long its tests took, printed at the end (`make unit` keeps the two within a minute). A report,
    never an assertion: it reads the wall clock only to say how the run went."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last: dict[str, float] = {}
        self.busy: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        worker = getattr(report, "worker_id", None) or getattr(getattr(report, "node", None), "gateway", None)
        name = worker if isinstance(worker, str) else getattr(worker, "id", None)
        if name is None:
            return
        self.last[name] = time.monotonic() - self.started
        self.busy[name] = self.busy.get(name, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if len(self.last) < 2:
            return
        parts = [f"{w} done at {self.last[w]:.0f} s ({self.busy[w]:.0f} s of tests)" for w in sorted(self.last)]
        spread = max(self.last.values()) - min(self.last.values())
        terminalreporter.write_line(f"workers: {'; '.join(parts)}; the last finished {spread:.0f} s after the first")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # on the controller (or without xdist): it sees every report
        config.pluginmanager.register(DurationRecorder(Path(path)), "spotrelay-duration-recorder")
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(WorkerBalance(), "spotrelay-worker-balance")


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
