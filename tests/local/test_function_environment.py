"""os.environ with a per-thread function environment: what the thread in the block sees, what every
other reader (another thread, a subprocess started with `env={**os.environ}`) sees, and that
installing it changes nothing outside a block."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from spotrelay.local import function_environment
from spotrelay.local.function_environment import function_environment as function_env

PRINT_ENVIRONMENT = "import json, os; print(json.dumps(dict(os.environ)))"


def environment_of_a_subprocess(env: dict[str, str] | None = None) -> dict[str, str]:
    printed = subprocess.run(
        [sys.executable, "-c", PRINT_ENVIRONMENT], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    environment: dict[str, str] = json.loads(printed)
    return environment


@pytest.fixture(autouse=True)
def process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCESS_VARIABLE", "process")
    monkeypatch.setenv("SPOTRELAY_OTHER_FUNCTION_TABLE", "other-table")


def test_installing_twice_leaves_os_environ_the_same_object_that_behaves_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given os.environ, held as `from os import environ` holds it, and its contents
    held = os.environ
    before = dict(os.environ)
    # When the overlay is installed, twice
    function_environment.install()
    function_environment.install()
    # Then os.environ is the same object, with the same contents
    assert os.environ is held
    assert function_environment.installed()
    assert dict(os.environ) == before
    # And a write outside any function environment still reaches the process's (C-level) environment
    monkeypatch.setenv("WRITTEN_BY_THE_TEST", "yes")
    monkeypatch.delenv("PROCESS_VARIABLE")
    inherited = environment_of_a_subprocess()
    assert inherited["WRITTEN_BY_THE_TEST"] == "yes"
    assert "PROCESS_VARIABLE" not in inherited


def test_in_a_block_every_way_of_reading_os_environ_shows_the_functions_environment() -> None:
    # Given a function's variables
    variables = {"SPOTRELAY_JOBS_TABLE": "jobs", "PROCESS_VARIABLE": "overridden"}
    # When os.environ is read in the block
    with function_env(variables, ("SPOTRELAY_",)):
        as_dict = dict(os.environ)
        # Then every way of reading it agrees: the function's variables, the other function's hidden
        assert as_dict == os.environ.copy() == {**os.environ} == dict(os.environ.items())
        assert list(os.environ) == list(as_dict)
        assert len(os.environ) == len(as_dict)
        assert os.environ["SPOTRELAY_JOBS_TABLE"] == os.getenv("SPOTRELAY_JOBS_TABLE") == "jobs"
        assert os.environ.get("PROCESS_VARIABLE") == "overridden"
        assert "SPOTRELAY_OTHER_FUNCTION_TABLE" not in os.environ
        assert os.getenv("SPOTRELAY_OTHER_FUNCTION_TABLE") is None
        with pytest.raises(KeyError):
            os.environ["SPOTRELAY_OTHER_FUNCTION_TABLE"]
        assert "'SPOTRELAY_JOBS_TABLE': 'jobs'" in repr(os.environ)
        # And a subprocess given `env={**os.environ}` (how the CDK CLI is started) gets it too
        inherited = environment_of_a_subprocess({**os.environ})
        assert inherited["SPOTRELAY_JOBS_TABLE"] == "jobs"
        assert "SPOTRELAY_OTHER_FUNCTION_TABLE" not in inherited
    # And after the block, the process's environment is back
    assert (os.environ["PROCESS_VARIABLE"], os.environ["SPOTRELAY_OTHER_FUNCTION_TABLE"]) == ("process", "other-table")
    assert "SPOTRELAY_JOBS_TABLE" not in os.environ
    assert environment_of_a_subprocess({**os.environ})["PROCESS_VARIABLE"] == "process"


def test_another_thread_sees_the_process_environment_while_a_block_is_open() -> None:
    # Given a thread that reads os.environ when told to
    read = threading.Event()
    seen: dict[str, str] = {}

    def reader() -> None:
        assert read.wait(60)
        seen.update(os.environ)

    thread = threading.Thread(target=reader)
    thread.start()
    before = dict(os.environ)
    # When it reads while this thread is in a block that set, changed, wrote and deleted variables
    with function_env({"SPOTRELAY_JOBS_TABLE": "jobs", "PROCESS_VARIABLE": "overridden"}, ("SPOTRELAY_",)):
        os.environ["WRITTEN_IN_THE_BLOCK"] = "yes"
        del os.environ["PROCESS_VARIABLE"]
        assert "PROCESS_VARIABLE" not in os.environ
        assert os.environ["WRITTEN_IN_THE_BLOCK"] == "yes"
        read.set()
        thread.join(60)
    # Then it saw the process's environment, untouched
    assert not thread.is_alive()
    assert seen == before


def test_blocks_nest_and_each_end_restores_what_its_thread_saw_before() -> None:
    # Given a block (a handler that invokes another function, as finalize wakes the dispatcher)
    with function_env({"SPOTRELAY_JOBS_TABLE": "jobs", "CALLER_ONLY": "caller"}, ("SPOTRELAY_",)):
        os.environ["WRITTEN_BY_THE_CALLER"] = "yes"
        # When a nested block opens
        with function_env({"SPOTRELAY_QUEUE_URL": "queue"}, ("SPOTRELAY_",)):
            # Then it sees the process's environment with its own variables, none of the caller's
            assert os.environ.get("SPOTRELAY_QUEUE_URL") == "queue"
            assert {"SPOTRELAY_JOBS_TABLE", "CALLER_ONLY", "WRITTEN_BY_THE_CALLER"}.isdisjoint(os.environ)
            assert os.environ["PROCESS_VARIABLE"] == "process"
        # And when it ends, even by an exception, the caller sees its own environment again
        with pytest.raises(LookupError), function_env({"SPOTRELAY_QUEUE_URL": "queue"}, ("SPOTRELAY_",)):
            raise LookupError
        assert "SPOTRELAY_QUEUE_URL" not in os.environ
        assert (os.environ["SPOTRELAY_JOBS_TABLE"], os.environ["WRITTEN_BY_THE_CALLER"]) == ("jobs", "yes")
    assert "SPOTRELAY_JOBS_TABLE" not in os.environ
    assert "WRITTEN_BY_THE_CALLER" not in os.environ


def test_a_write_in_a_block_is_checked_as_os_environ_checks_it() -> None:
    # Given a block, When a write os.environ would refuse is made in it, Then it is refused alike
    with function_env({}, ()):
        with pytest.raises(TypeError):
            os.environ["NOT_A_STRING"] = 1  # type: ignore[assignment]
        with pytest.raises(ValueError, match="illegal"):
            os.environ["A=B"] = "value"
        with pytest.raises(KeyError):
            del os.environ["NEVER_SET_ANYWHERE"]
