"""The tiny job the agent tests run, and how a test steers it (through files in a control dir).

The job records what it saw at start (`seen-<attempt>.json`: SPOTRELAY_RESUMED and the sha256 of
every file in its checkpoint dir) and appends one line per start to `runs.log` (its side effect).
It writes `weights.bin` once (atomically) and says `ready-<attempt>`. Then it waits for the test:
- `step-<attempt>-<k>`: rewrite `step.txt` with k and the progress file, then say `stepped-<attempt>-<k>`;
- `exit-<attempt>` containing N: print 30 numbered lines and exit with N.
On SIGTERM it saves `final.bin` (its final checkpoint) and progress 1.5, then exits 0; while
`hold-term-<attempt>` exists it waits first (a job still saving when its agent dies).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

JOB_SCRIPT = r"""
import hashlib, json, os, pathlib, signal, sys, time

ckpt = pathlib.Path(os.environ["SPOTRELAY_CHECKPOINT_DIR"])
control = pathlib.Path(sys.argv[1])
attempt = os.environ["SPOTRELAY_ATTEMPT"]
progress = pathlib.Path(os.environ["SPOTRELAY_PROGRESS_FILE"])


def save(name, data):
    tmp = ckpt / (name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, ckpt / name)


def on_term(signum, frame):
    while (control / f"hold-term-{attempt}").exists():
        time.sleep(0.01)
    save("final.bin", (f"final checkpoint of attempt {attempt}\n" * 2000).encode())
    progress.write_text("1.5")
    print("saved the final checkpoint", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
seen = {
    p.relative_to(ckpt).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(ckpt.rglob("*")) if p.is_file()
}
(control / f"seen-{attempt}.json").write_text(json.dumps({"resumed": os.environ["SPOTRELAY_RESUMED"], "files": seen}))
with open(control / "runs.log", "a") as f:
    f.write(f"attempt {attempt} resumed={os.environ['SPOTRELAY_RESUMED']}\n")
if not (ckpt / "weights.bin").exists():
    save("weights.bin", os.urandom(300_000))
print(f"attempt {attempt} started", flush=True)
(control / f"ready-{attempt}").write_text("")
step = 1
while True:
    if (control / f"step-{attempt}-{step}").exists():
        save("step.txt", f"step {step} of attempt {attempt}\n".encode())
        progress.write_text(str(step / 10))
        (control / f"stepped-{attempt}-{step}").write_text("")
        step += 1
    exit_file = control / f"exit-{attempt}"
    text = exit_file.read_text().strip() if exit_file.exists() else ""
    if text:  # (not an empty file: the test's write_text creates it, then writes)
        code = int(text)
        for i in range(30):
            print(f"line {i} of attempt {attempt}", flush=True)
        sys.exit(code)
    time.sleep(0.01)
"""

T = TypeVar("T")


def write_job(tmp_path: Path) -> tuple[str, Path]:
    """The job's command line and its control dir."""
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(control))}", control


def wait_until(probe: Callable[[], T | bool | None], seconds: float = 15.0, what: str = "the condition") -> T:
    """Poll `probe` until it answers something truthy; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: nothing after {seconds} s")
        time.sleep(0.02)
