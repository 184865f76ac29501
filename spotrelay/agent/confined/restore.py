"""A restore into the job's checkpoint dir by a root agent, without following anything the job planted
(the threat: `spotrelay.agent.confined`): the staging dir, its install, and the removal of what was there.
Its sibling `spotrelay.agent.confined.directory` holds the primitives it is built on (`open_directory`,
`ConfinedDir`, the open flags).

A restore writes only into a directory it has just made itself (mkdir, which fails on anything already
there, a symlink included; mode 0700: nobody else can enter it) and reaches it only through its fd
(`/proc/self/fd/<n>/...`), so no name the job controls is resolved on the way to a write. The restored
files are then put in place with renames relative to directory fds: a rename replaces a planted
symlink, it never follows it. The dirs on the way to the checkpoint dir are made one component at a
time from `/` (`open_directory(create=True)`), never through a symlink of the job's.

The job owns the dir that holds the staging dir, so it can still rename or remove the staging dir (not
what is in it), put something at a name the agent is about to make or rename to, or swap a directory
of its own that the agent is removing. None of that makes the agent follow a link, open a FIFO or
touch anything outside the job's dirs, nor does it crash the agent: the restore stops with
`RestoreIncomplete`, which names the entry (relative to the checkpoint dir's parent) and what was
wrong, and says whether the checkpoint dir now holds part of the checkpoint. The job's old files are
removed through fds too (`remove_entry`): a directory swapped for a symlink or a FIFO meanwhile is
unlinked itself, never opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from types import TracebackType

from spotrelay.agent.confined.directory import _NOT_A_DIRECTORY, DIRECTORY_FLAGS, ConfinedDir, open_directory

REMOVE_ATTEMPTS = 3  # a name the job keeps refilling or swapping between a directory and something else
MAX_REMOVE_DEPTH = 256  # one fd and one frame per level


def remove_entry(dir_fd: int, name: str, *, spare: os.stat_result | None = None, depth: int = 0) -> None:
    """Remove `name` from the directory `dir_fd`, a directory with all it holds, through fds only: a
    directory is opened relative to its parent with O_DIRECTORY|O_NOFOLLOW and emptied through its fd,
    so a symlink or a FIFO swapped in for it is never followed nor opened (it is unlinked itself);
    anything else is unlinked (a symlink itself, never its target). Entries that vanish meanwhile are
    fine. A directory that is `spare` (an fstat: the agent's own staging dir, which the job may have
    renamed) is left as it is. Raises OSError when the entry cannot be removed: the job keeps filling
    or swapping it, or it is nested deeper than MAX_REMOVE_DEPTH."""
    for _ in range(REMOVE_ATTEMPTS):
        try:
            fd = os.open(name, DIRECTORY_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in _NOT_A_DIRECTORY:
                raise
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno not in (errno.EISDIR, errno.EPERM):  # a directory again since the open
                    raise
                continue
            return
        try:
            if spare is not None and os.path.samestat(os.fstat(fd), spare):
                return
            if depth >= MAX_REMOVE_DEPTH:
                raise OSError(errno.ELOOP, f"nested more than {MAX_REMOVE_DEPTH} deep", name)
            with os.scandir(fd) as listing:
                names = [entry.name for entry in listing]
            for sub in names:
                remove_entry(fd, sub, spare=spare, depth=depth + 1)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=dir_fd)  # what has the name by now: an empty directory only
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            continue  # refilled, or swapped for something else, since it was emptied
        return
    raise OSError(errno.EBUSY, "it kept changing while it was removed", name)


# --- restore --------------------------------------------------------------------------------------------


def reason(e: OSError) -> str:
    """What an OSError says, without the paths it names (a /proc/self/fd path, or where a link points)."""
    return e.strerror or str(e)


class RestoreIncomplete(Exception):
    """A restore that could not be completed because of what happened to the directories it works in
    (the job moved, removed or replaced its staging dir, or put something where it renames to). `path`
    is the entry, relative to the checkpoint dir's parent ("." for the parent itself); `why` says what
    was wrong (never where a link points); `partial` whether the checkpoint dir holds part of the
    checkpoint now (moved in entry by entry into a mount point: the job must not start from it)."""

    def __init__(self, path: str, why: str, *, partial: bool = False) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why
        self.partial = partial


class RestoreStaging:
    """The private directory a restore downloads into, and how it becomes the checkpoint dir.

    Next to the dir (`<parent>/<STAGING_PREFIX>restore-<name>`: on the same file system, one rename
    installs it), or inside it when the dir is a mount point (`<dir>/<STAGING_PREFIX>restore`: its
    entries are moved in). Made fresh with mkdir (whatever had its name is removed first), mode 0700,
    and used only through its fd. Anything that goes wrong because of what the job did to these dirs
    raises RestoreIncomplete (`spotrelay.agent.checkpointer.Checkpointer.restore` says what then)."""

    def __init__(self, target: Path, *, prefix: str, job_uid: int | None = None) -> None:
        self.target = target
        self.mount_point = target.is_dir() and os.path.ismount(target)
        home = target if self.mount_point else target.parent
        self.name = f"{prefix}restore" if self.mount_point else f"{prefix}restore-{target.name}"
        self.replaced_name = f"{prefix}replaced-{target.name}"
        self.where = home / self.name
        self.left_behind: list[str] = []  # the job's old files install could not remove (the next restore does)
        self.home_fd = -1
        self.dir: ConfinedDir | None = None
        try:
            try:
                self.home_fd = open_directory(home, job_uid=job_uid, create=not self.mount_point)
            except OSError as e:
                raise RestoreIncomplete(self._label(None), f"cannot be used: {reason(e)}") from e
            try:
                remove_entry(self.home_fd, self.name)  # an earlier restore's leftovers, or anything planted there
            except OSError as e:
                raise RestoreIncomplete(self._label(self.name), f"what was there cannot be removed: {reason(e)}") from e
            try:
                os.mkdir(self.name, 0o700, dir_fd=self.home_fd)
            except FileExistsError as e:
                raise RestoreIncomplete(
                    self._label(self.name), "something else was already there as it was made"
                ) from e
            except OSError as e:
                raise RestoreIncomplete(self._label(self.name), f"cannot be made: {reason(e)}") from e
            try:
                fd = os.open(self.name, DIRECTORY_FLAGS, dir_fd=self.home_fd)
            except OSError as e:  # a symlink or a FIFO in its place (never followed, never opened), or gone
                raise RestoreIncomplete(self._label(self.name), "replaced or removed right after it was made") from e
            self.dir = ConfinedDir(fd, self.where, job_uid=job_uid)
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise RestoreIncomplete(self._label(self.name), "replaced right after it was made")
        except BaseException:
            self.close()
            raise

    def _label(self, name: str | None) -> str:
        """`name` of the staging dir's home (None: the home itself) relative to the checkpoint dir's parent."""
        if self.mount_point:
            return self.target.name if name is None else f"{self.target.name}/{name}"
        return "." if name is None else name

    def close(self) -> None:
        if self.dir is not None:
            self.dir.close()
            self.dir = None
        if self.home_fd >= 0:
            os.close(self.home_fd)
            self.home_fd = -1

    def __enter__(self) -> RestoreStaging:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    @property
    def confined(self) -> ConfinedDir:
        assert self.dir is not None, "the staging dir is closed"
        return self.dir

    def path_of(self, path: str) -> Path:
        """Where a download of `path` goes: inside the staging dir, through its fd."""
        return self.confined.path_under(path)

    def _is_mine(self, name: str) -> bool:
        try:
            st = os.stat(name, dir_fd=self.home_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return os.path.samestat(st, os.fstat(self.confined.fd))

    def check_mine(self) -> None:
        """Raise RestoreIncomplete unless the staging dir is still where it was made."""
        if not self._is_mine(self.name):
            raise RestoreIncomplete(self._label(self.name), "moved or replaced while the checkpoint was restored")

    def discard(self) -> None:
        """Empty the staging dir through its fd (wherever it is by now) and remove it if it is still
        where it was made (nothing else of that name). Never raises OSError: it runs while another
        error is on its way out."""
        if self.dir is not None:
            try:
                with os.scandir(self.dir.fd) as listing:
                    names = [entry.name for entry in listing]
            except OSError:
                names = []
            for name in names:
                with contextlib.suppress(OSError):
                    remove_entry(self.dir.fd, name)
            with contextlib.suppress(OSError):
                if self._is_mine(self.name):
                    os.rmdir(self.name, dir_fd=self.home_fd)
        self.close()

    def install(self) -> None:
        """Make the staging dir's contents the checkpoint dir's: by one rename of the dir (the dir it
        replaces is moved aside first and removed after), or for a mount point by moving its entries in,
        once everything else is gone from it. Raises RestoreIncomplete when the staging dir is no longer
        where it was made, or when something the job put in the way makes a rename fail."""
        self.check_mine()
        mine = os.fstat(self.confined.fd)
        if self.mount_point:
            self._move_entries_in(mine)
        else:
            self._rename_in(mine)
        self.close()

    def _rename_in(self, mine: os.stat_result) -> None:
        target = self.target.name
        os.fchmod(self.confined.fd, 0o755)  # as a plain mkdir makes it; `give_to` hands it to the job user
        try:
            remove_entry(self.home_fd, self.replaced_name, spare=mine)
        except OSError as e:
            raise RestoreIncomplete(self.replaced_name, f"what was there cannot be removed: {reason(e)}") from e
        try:
            os.replace(target, self.replaced_name, src_dir_fd=self.home_fd, dst_dir_fd=self.home_fd)
        except FileNotFoundError:
            pass
        except OSError as e:  # something planted where it goes: the dir stays as it was
            raise RestoreIncomplete(target, f"could not be moved aside: {reason(e)}") from e
        try:
            os.replace(self.name, target, src_dir_fd=self.home_fd, dst_dir_fd=self.home_fd)
        except OSError as e:  # something planted at the dir's name meanwhile (a directory renames only over one)
            self._put_back()
            raise RestoreIncomplete(target, f"the restored dir could not be put in place: {reason(e)}") from e
        if not self._is_mine(target):  # what had the staging dir's name by then was renamed in instead
            raise RestoreIncomplete(target, "replaced while it was installed")
        try:
            remove_entry(self.home_fd, self.replaced_name, spare=mine)
        except OSError:
            self.left_behind.append(self.replaced_name)

    def _put_back(self) -> None:
        """The dir moved aside back at its name, if nothing took the name meanwhile (best effort)."""
        with contextlib.suppress(OSError):
            os.stat(self.target.name, dir_fd=self.home_fd, follow_symlinks=False)
            return
        with contextlib.suppress(OSError):
            os.rename(self.replaced_name, self.target.name, src_dir_fd=self.home_fd, dst_dir_fd=self.home_fd)

    def _move_entries_in(self, mine: os.stat_result) -> None:
        staging = self.confined
        with os.scandir(self.home_fd) as listing:
            old = sorted(entry.name for entry in listing if entry.name != self.name)
        for name in old:
            try:
                remove_entry(self.home_fd, name, spare=mine)
            except OSError as e:
                raise RestoreIncomplete(self._label(name), f"the job's old files cannot be removed: {reason(e)}") from e
        self.check_mine()  # not renamed to one of the names just removed
        with os.scandir(staging.fd) as listing:
            new = sorted(entry.name for entry in listing)
        for done, name in enumerate(new):
            try:
                os.replace(name, name, src_dir_fd=staging.fd, dst_dir_fd=self.home_fd)
            except OSError as e:  # something planted at its name since the old entries were removed
                raise RestoreIncomplete(
                    self._label(name), f"could not be put in place: {reason(e)}", partial=done > 0
                ) from e
        with contextlib.suppress(OSError):
            if self._is_mine(self.name):
                os.rmdir(self.name, dir_fd=self.home_fd)
