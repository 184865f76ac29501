"""The job's output forwarded to the agent's log: the lines the job writes to its log file, read on from
where the agent (or the agent before a restart) left off.

One concern of the worker agent (`spotrelay.agent.agent`, which holds the loop that calls this every poll);
its siblings are `heartbeat` (the heartbeat thread), `handover` (the migration back to spot),
`background` (the periodic and rebalance checkpoints), `startup` (what comes before the job runs) and
`settings` (the agent's settings model).
"""

from __future__ import annotations

import os
from pathlib import Path

from spotrelay.agent.logs import JobLogger

OUTPUT_BYTES_PER_TICK = 4 * 1024 * 1024  # the job's output forwarded per poll, at most


class OutputTail:
    """Forwards the job's new log lines to the agent's log."""

    def __init__(self, path: Path, log: JobLogger, from_end: bool, start: int | None = None) -> None:
        self.path = path
        self.log = log
        self.offset = start if start is not None else path.stat().st_size if from_end and path.exists() else 0
        self.partial = b""

    def forward(self, limit: int = OUTPUT_BYTES_PER_TICK) -> None:
        try:
            with self.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # truncated under us: read it from the start
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read(limit)
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.log.info("job output", extra={"line": line.decode("utf-8", errors="replace")[:4000]})

    def forward_complete_lines(self) -> int:
        """Forward every complete line written so far; returns the offset of the first byte not forwarded
        (a line the job is still writing is left for whoever reads on)."""
        for _ in range(4):  # bounded: at most 16 MiB
            before = self.offset
            self.forward()
            if self.offset == before:
                break
        return self.offset - len(self.partial)

    def drain(self) -> None:
        """Forward everything, a last line without its newline too (the job has ended)."""
        self.forward_complete_lines()
        if self.partial:
            self.log.info("job output", extra={"line": self.partial.decode("utf-8", errors="replace")[:4000]})
            self.partial = b""
