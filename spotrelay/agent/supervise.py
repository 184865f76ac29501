"""The job's supervisor: `python -m spotrelay.agent.supervise EXIT_FILE [--user UID:GID] -- COMMAND...`.

With `--user`, COMMAND runs as that uid and gid with no supplementary groups (the supervisor itself
stays as it was started, root on an instance, to write EXIT_FILE where the agent keeps its state).

A small process between the agent and the job, so that the job's exit status outlives the agent:
it leads the job's process group, runs COMMAND as its child, waits for it and writes
`{"exit_code": N}` to EXIT_FILE (atomically: a temporary file, then a rename) before it exits with
the same code. If the agent dies and systemd restarts it, the new agent finds the job still running
(this process's pid) or finished (the exit file): it never needs to be the job's parent.

It survives the SIGTERM the agent sends to the whole group at a notice (a handler that only notes
it, so the job, which execs with default dispositions, still gets its SIGTERM) and then waits until
every process of the group has ended, not just its child: `/bin/sh -c 'python train.py'` loses its
shell to the SIGTERM at once while python is still writing its checkpoint. SIGKILL ends everything,
and the agent that sent it knows the outcome. When the job ends on its own, processes it left in its
group are ended (SIGTERM, then SIGKILL), as systemd does with a service's leftovers. Standard
library only: it starts before the job and lives as long, so it should cost next to nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType

GROUP_POLL_SECONDS = 0.02
LEFTOVER_GRACE_SECONDS = 10.0


class _Signals:
    terminated = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    """Stay alive to record the job's exit; the job got the same signal (it is in our group)."""
    _Signals.terminated = True


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` other than this one (zombies do not count); [] where
    there is no /proc."""
    members = []
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if fields[0] not in {"Z", "X"} and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_for_group(pgid: int, seconds: float | None) -> bool:
    """Until no other process of the group is left (True), or `seconds` have passed (False)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while group_members(pgid):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_SECONDS)
    return True


def end_leftovers(pgid: int) -> None:
    """The job's main process exited on its own: end what it left behind in its group (as systemd
    does with a service's leftover processes), SIGTERM first, SIGKILL after a while."""
    for signum, wait in ((signal.SIGTERM, LEFTOVER_GRACE_SECONDS), (signal.SIGKILL, LEFTOVER_GRACE_SECONDS)):
        members = group_members(pgid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        if wait_for_group(pgid, wait):
            return


def write_exit_file(path: str, exit_code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"exit_code": exit_code}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


USAGE = "usage: python -m spotrelay.agent.supervise EXIT_FILE [--user UID:GID] -- COMMAND...\n"


def parse_arguments(argv: list[str]) -> tuple[str, tuple[int, int] | None, list[str]] | None:
    """(exit file, (uid, gid) or None, command), or None if `argv` is not `EXIT_FILE [--user U:G] -- CMD...`."""
    if len(argv) >= 5 and argv[1] == "--user" and argv[3] == "--":
        uid, _, gid = argv[2].partition(":")
        if not (uid.isdigit() and gid.isdigit()) or int(uid) == 0:
            return None
        return argv[0], (int(uid), int(gid)), argv[4:]
    if len(argv) >= 3 and argv[1] == "--":
        return argv[0], None, argv[2:]
    return None


def start_job(command: list[str], user: tuple[int, int] | None) -> subprocess.Popen[bytes]:
    if user is None:
        return subprocess.Popen(command)
    uid, gid = user
    return subprocess.Popen(command, user=uid, group=gid, extra_groups=[])


def main(argv: list[str]) -> int:
    parsed = parse_arguments(argv)
    if parsed is None:
        sys.stderr.write(USAGE)
        return 2
    exit_file, user, command = parsed
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_term)
    try:
        job = start_job(command, user)
    except OSError as e:
        sys.stderr.write(f"spotrelay: cannot start the job: {e}\n")
        write_exit_file(exit_file, 127)
        return 127
    exit_code = job.wait()
    pgid = os.getpgid(0)
    if _Signals.terminated:
        # A notice: `/bin/sh -c` dies of the SIGTERM at once while the program it runs is still
        # saving its checkpoint. The job has ended when its whole group has (the agent SIGKILLs the
        # group when the grace period is over).
        wait_for_group(pgid, None)
    else:
        end_leftovers(pgid)
    write_exit_file(exit_file, exit_code)
    return exit_code if exit_code >= 0 else 128 - exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
