"""`local up`'s instances, the parts a hostile or careless caller reaches: what an interruption request may
say, and which processes an instance's end kills (never one that only reuses a pid the job had)."""

from __future__ import annotations

import io
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotrelay.agent.runner import JobProcess, _proc_stat
from spotrelay.agent.state import AgentState, StateFile
from spotrelay.local.up_workers import InterruptError, LocalInstance, _interrupt_request, kill_processes


def request(body: bytes | str, length: int | None = None) -> dict[str, Any]:
    raw = body.encode() if isinstance(body, str) else body
    return {"CONTENT_LENGTH": str(len(raw) if length is None else length), "wsgi.input": io.BytesIO(raw)}


def test_an_interruption_request_is_read_as_the_cli_sends_it() -> None:
    sent = {"instance_id": None, "job_id": "train-1", "notice_seconds": 30, "rebalance_first": True}
    assert _interrupt_request(request(json.dumps(sent))) == {**sent, "notice_seconds": 30.0}


@pytest.mark.parametrize(
    ("body", "length", "says"),
    [
        ("", None, "at most 4096 bytes"),
        ("{}" + " " * 5000, None, "at most 4096 bytes"),
        ("{}", -1, "at most 4096 bytes"),
        ("not json", None, "not JSON"),
        ("[1, 2]", None, "a JSON object"),
        ('{"job_id": 7}', None, "are strings"),
        ('{"job_id": "j", "notice_seconds": "2m"}', None, "a number of seconds"),
        ('{"job_id": "j", "notice_seconds": true}', None, "a number of seconds"),
        ('{"job_id": "j", "rebalance_first": "false"}', None, "true or false"),
        ('{"job_id": "j", "force": 1}', None, "unknown keys \\['force'\\]"),
    ],
)
def test_a_malformed_interruption_request_is_refused_saying_why(body: str, length: int | None, says: str) -> None:
    with pytest.raises(InterruptError, match=says) as refused:
        _interrupt_request(request(body, length))
    assert refused.value.status == 400


def sleeper() -> subprocess.Popen[bytes]:
    """A process leading its own group, as a job's supervisor does."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def instance_whose_job_was(process: JobProcess, directory: Path) -> LocalInstance:
    state = StateFile(directory / "state", "train-1", 1)
    state.save(AgentState(job_id="train-1", attempt=1, process=process))
    return LocalInstance("i-0123456789abcdef0", "train-1", 1, directory)


def test_an_instances_end_kills_its_job_but_not_a_process_that_reused_the_jobs_pid(tmp_path: Path) -> None:
    other, job = sleeper(), sleeper()
    try:
        now = datetime.now(UTC)
        other_stat, job_stat = _proc_stat(other.pid), _proc_stat(job.pid)
        assert other_stat is not None
        assert job_stat is not None
        # Given an instance whose agent recorded a job that has since ended, its pid now another process's
        files: dict[str, Any] = {"exit_file": tmp_path / "exit", "log_file": tmp_path / "log", "started_at": now}
        reused = JobProcess(pid=other.pid, start_ticks=other_stat[1] - 1, **files)
        kill_processes(instance_whose_job_was(reused, tmp_path / "a"))
        # Then that process lives on
        assert other.poll() is None
        # And an instance whose job still runs has it killed when the instance ends
        running = JobProcess(pid=job.pid, start_ticks=job_stat[1], **files)
        kill_processes(instance_whose_job_was(running, tmp_path / "b"))
        assert job.wait(timeout=30) == -9
        assert other.poll() is None
    finally:
        for process in (other, job):
            process.kill()
            process.wait()
