"""The job's checkpoint dir, read and written by a root agent without following anything the job planted.

The agent runs as root; the job runs as `spotrelay-job` and owns its checkpoint dir. Whatever the job
puts there - a symlink to /etc/shadow, to the agent's state dir or to its credentials, a FIFO, a hard
link, a file or a directory swapped for a symlink between the agent's listing and its open (a TOCTOU
race) - must neither make the agent read a file the job could not read into the job's own checkpoint
(which the job reads back on restore), nor make a restore write anywhere but inside the dir.

Two modules, one concern each; this package re-exports what they hold:
- `spotrelay.agent.confined.directory`: reading the dir - the dir opened one component at a time from `/`
  (`open_directory`), walked and its files opened through directory fds (`ConfinedDir`), never through a
  name the job controls; what is left out of a checkpoint, and why;
- `spotrelay.agent.confined.restore`: writing it - a restore's private staging dir (`RestoreStaging`), its
  install into the checkpoint dir by renames relative to directory fds, the job's old files removed through
  fds (`remove_entry`), and `RestoreIncomplete` when what the job did to these dirs stops the restore.
"""

from spotrelay.agent.confined.directory import (
    DIRECTORY_FLAGS,
    FD_PATHS,
    FILE_FLAGS,
    HAS_FD_PATHS,
    MAX_DEPTH,
    MAX_MADE,
    MAX_SYMLINK_HOPS,
    OPEN_FILES_HEADROOM,
    ConfinedDir,
    Entry,
    LeftOut,
    NotRead,
    OpenFile,
    fd_path,
    kind_of,
    make_room_for,
    open_directory,
    sha256_of_fd,
    trusted_link_owner,
    why_not_read,
)
from spotrelay.agent.confined.restore import (
    MAX_REMOVE_DEPTH,
    REMOVE_ATTEMPTS,
    RestoreIncomplete,
    RestoreStaging,
    reason,
    remove_entry,
)

__all__ = [
    "DIRECTORY_FLAGS",
    "FD_PATHS",
    "FILE_FLAGS",
    "HAS_FD_PATHS",
    "MAX_DEPTH",
    "MAX_MADE",
    "MAX_REMOVE_DEPTH",
    "MAX_SYMLINK_HOPS",
    "OPEN_FILES_HEADROOM",
    "REMOVE_ATTEMPTS",
    "ConfinedDir",
    "Entry",
    "LeftOut",
    "NotRead",
    "OpenFile",
    "RestoreIncomplete",
    "RestoreStaging",
    "fd_path",
    "kind_of",
    "make_room_for",
    "open_directory",
    "reason",
    "remove_entry",
    "sha256_of_fd",
    "trusted_link_owner",
    "why_not_read",
]
