"""The job's checkpoint dir, read and written by a root agent without following anything the job planted.

The agent runs as root; the job runs as `spotrelay-job` and owns its checkpoint dir. Whatever the job
puts there - a symlink to /etc/shadow, to the agent's state dir or to its credentials, a FIFO, a hard
link, a file or a directory swapped for a symlink between the agent's listing and its open (a TOCTOU
race) - must neither make the agent read a file the job could not read into the job's own checkpoint
(which the job reads back on restore), nor make a restore write anywhere but inside the dir.

So no name under the dir is ever resolved as a path:
- the dir itself is opened once (`open_directory`), one component at a time from `/`; a symlink on the
  way is followed only if root or the agent's own user owns it, never if the job user does (the rule
  of the kernel's fs.protected_symlinks, applied to every directory);
- the walk lists each directory through its fd (`os.scandir(fd)`) and opens a subdirectory relative to
  its parent's fd with O_DIRECTORY|O_NOFOLLOW: a directory swapped for a symlink fails to open (it is
  left out), it is never followed, and the walk cannot leave the dir;
- a file is opened relative to its directory's fd with O_NOFOLLOW|O_NONBLOCK (a symlink fails to open,
  a FIFO does not block the agent) and accepted only if fstat on that fd says it is a regular file.
  The size, the mtime and the sha256 in the manifest and the bytes uploaded all come from that open
  file: a path-based transfer gets `/proc/self/fd/<n>`, which the kernel resolves to the open file
  itself, not through any name of the dir.

Symlinks, FIFOs, sockets and devices are left out of the checkpoint with a warning that names their
relative path (never where a link points), and the checkpoint commits with the rest: a user wants the
files they saved to be saved, and a link in a checkpoint dir is never data (a checkpoint holds bytes).

Hard links: a job can link a file it does not own into its dir only where the kernel lets it
(fs.protected_hardlinks=1, the default on Amazon Linux and Ubuntu, refuses a link to a file the user
could not read and write). Behind that, when the job runs as its own user, a regular file with more
than one link that the job user does not own is left out too: the job makes every file of its dir
itself (and the agent gives it what a restore put there before the job starts).

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

Without `/proc/self/fd` (macOS: laptops run the agent as themselves, never as root), transfers fall
back to the paths; the opens, checks and walk above are the same.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import resource
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
MAX_DEPTH = 64  # directories nested deeper are left out (each level holds one fd while it is walked)
MAX_SYMLINK_HOPS = 40  # as the kernel's MAXSYMLINKS
MAX_MADE = 256  # directories `open_directory(create=True)` makes on the way, at most (the job may remove them)
OPEN_FILES_HEADROOM = 1024  # fds left for sockets, logs and the transfers' own opens
FD_PATHS = Path("/proc/self/fd")
HAS_FD_PATHS = FD_PATHS.is_dir()
_NOT_A_DIRECTORY = (errno.ELOOP, errno.ENOTDIR)  # O_DIRECTORY|O_NOFOLLOW on a symlink: either, by kernel


class NotRead(Exception):
    """An entry of the dir the agent does not read; `why` says what it is (never where a link points)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True)
class LeftOut:
    """An entry left out of a checkpoint, and why."""

    path: str
    why: str


@dataclass(frozen=True)
class Entry:
    """One entry of a walk: its name in the directory `dir_fd` (open while the walk is at it)."""

    dir_fd: int
    name: str
    path: str  # relative to the dir, '/'-separated
    st: os.stat_result  # lstat: the entry itself, never what a link points at


@dataclass(frozen=True)
class OpenFile:
    """A regular file of the dir, open for reading; `st` is fstat of `fd`."""

    path: str
    fd: int
    st: os.stat_result


def kind_of(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def why_not_read(st: os.stat_result, job_uid: int | None) -> str | None:
    """Why the agent does not read a file with this stat (None: it does)."""
    if not stat.S_ISREG(st.st_mode):
        return kind_of(st.st_mode)
    if job_uid is not None and st.st_nlink > 1 and st.st_uid != job_uid:
        return "a hard link to a file the job user does not own"
    return None


def trusted_link_owner(uid: int, job_uid: int | None) -> bool:
    """Whether a symlink owned by `uid` on the way to the dir is followed: root's or the agent's, never the job's."""
    return uid in (0, os.geteuid()) and uid != job_uid


def open_directory(path: Path, *, job_uid: int | None = None, create: bool = False) -> int:
    """An fd of the directory at `path`, resolved one component at a time from `/` (or the working dir
    for a relative path). A symlink on the way, the last component included, is followed only if
    `trusted_link_owner` says so; one the job user may have made fails with ELOOP. With `create`, a
    component that does not exist is made (as `mkdir -p` would, but inside the directory already
    reached, so never through a symlink of the job's)."""
    parts = list(path.parts[1:] if path.is_absolute() else Path.cwd().parts[1:] + path.parts)
    fd = os.open("/", DIRECTORY_FLAGS)
    pending = parts[::-1]  # a stack: the next component last
    hops = made = 0
    try:
        while pending:
            name = pending.pop()
            try:
                next_fd = os.open(name, DIRECTORY_FLAGS, dir_fd=fd)
            except FileNotFoundError as e:
                if not create:
                    raise FileNotFoundError(e.errno, e.strerror, str(path)) from None
                made += 1
                if made > MAX_MADE:
                    raise OSError(errno.EBUSY, f"{name} keeps disappearing", str(path)) from None
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened (or refused) next
                    os.mkdir(name, 0o777, dir_fd=fd)
                pending.append(name)
                continue
            except OSError as e:
                if e.errno not in _NOT_A_DIRECTORY:
                    raise type(e)(e.errno, e.strerror, str(path)) from None
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise NotADirectoryError(errno.ENOTDIR, f"{name} is {kind_of(st.st_mode)}", str(path)) from None
                if not trusted_link_owner(st.st_uid, job_uid):
                    raise OSError(errno.ELOOP, f"{name} is a symlink the job user may have made", str(path)) from None
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise OSError(errno.ELOOP, "too many symlinks", str(path)) from None
                target = Path(os.readlink(name, dir_fd=fd))
                if target.is_absolute():
                    os.close(fd)
                    fd = os.open("/", DIRECTORY_FLAGS)
                pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                continue
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


def fd_path(fd: int) -> Path | None:
    """A path the kernel resolves to the open file (or directory) `fd` itself; None without /proc."""
    return FD_PATHS / str(fd) if HAS_FD_PATHS else None


def make_room_for(open_files: int) -> None:
    """Raise the soft limit on open files (up to the hard one) so that `open_files` more fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = open_files + OPEN_FILES_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))


def sha256_of_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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


class ConfinedDir:
    """A directory held by its fd; every name under it is resolved from that fd, never through a symlink."""

    def __init__(self, fd: int, where: Path, *, job_uid: int | None = None) -> None:
        self.fd = fd
        self.where = where  # for messages and the fallback without /proc
        self.job_uid = job_uid

    @classmethod
    def open(cls, path: Path, *, job_uid: int | None = None) -> ConfinedDir:
        return cls(open_directory(path, job_uid=job_uid), path, job_uid=job_uid)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ConfinedDir:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def path_under(self, path: str) -> Path:
        """Where a path-based transfer finds `path` under the dir: through the dir's fd (/proc/self/fd),
        so that no name above it is resolved again; the plain path without /proc."""
        through = fd_path(self.fd)
        return through / path if through is not None else self.where / path

    def path_of_open(self, f: OpenFile) -> Path:
        """Where a path-based transfer reads the open file `f`: the open file itself (/proc/self/fd),
        not whatever has its name by then; the plain path without /proc."""
        through = fd_path(f.fd)
        return through if through is not None else self.where / f.path

    # --- walking ----------------------------------------------------------------------------------------

    def walk(
        self, *, left_out: list[LeftOut] | None = None, skip_top_dirs: Callable[[str], bool] = lambda name: False
    ) -> Iterator[Entry]:
        """Every entry under the dir, sorted, a directory before what it holds (top-level directories
        `skip_top_dirs` names are not). Symlinks are entries, never followed; a directory that cannot be
        opened as one any more (swapped for a symlink since it was listed) or nested deeper than
        MAX_DEPTH is not walked, and is added to `left_out`."""
        yield from self._walk(self.fd, "", 0, left_out if left_out is not None else [], skip_top_dirs)

    def _walk(
        self, dir_fd: int, prefix: str, depth: int, left_out: list[LeftOut], skip_top_dirs: Callable[[str], bool]
    ) -> Iterator[Entry]:
        with os.scandir(dir_fd) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            path = prefix + name
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since the listing
            if not stat.S_ISDIR(st.st_mode):
                yield Entry(dir_fd=dir_fd, name=name, path=path, st=st)
                continue
            if depth == 0 and skip_top_dirs(name):
                continue
            yield Entry(dir_fd=dir_fd, name=name, path=path, st=st)
            if depth + 1 >= MAX_DEPTH:
                left_out.append(LeftOut(path, f"a directory nested more than {MAX_DEPTH} deep"))
                continue
            try:
                sub = os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except PermissionError:  # an agent that is not root, and a directory of the job's it may not read
                left_out.append(LeftOut(path, "a directory the agent may not read"))
                continue
            except OSError as e:
                if e.errno not in _NOT_A_DIRECTORY:
                    raise
                left_out.append(LeftOut(path, "a directory replaced by something else while it was read"))
                continue
            try:
                yield from self._walk(sub, path + "/", depth + 1, left_out, skip_top_dirs)
            finally:
                os.close(sub)

    def regular_files(
        self, *, left_out: list[LeftOut] | None = None, skip_top_dirs: Callable[[str], bool] = lambda name: False
    ) -> dict[str, os.stat_result]:
        """The regular files under the dir (lstat), keyed by relative path; the rest goes to `left_out`."""
        left_out = left_out if left_out is not None else []
        found: dict[str, os.stat_result] = {}
        for entry in self.walk(left_out=left_out, skip_top_dirs=skip_top_dirs):
            if stat.S_ISDIR(entry.st.st_mode):
                continue
            why = why_not_read(entry.st, self.job_uid)
            if why is None:
                found[entry.path] = entry.st
            else:
                left_out.append(LeftOut(entry.path, why))
        return found

    # --- one file -------------------------------------------------------------------------------------

    def _open_parent(self, path: str) -> tuple[int, str]:
        """(an fd of the directory holding `path`, its last name); the fd is the caller's to close
        unless it is the dir's own."""
        *parents, name = path.split("/")
        fd = self.fd
        try:
            for part in parents:
                try:
                    next_fd = os.open(part, DIRECTORY_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno not in _NOT_A_DIRECTORY:
                        raise
                    raise NotRead(path, "under a directory replaced by a symlink or a file") from None
                if fd != self.fd:
                    os.close(fd)
                fd = next_fd
        except BaseException:
            if fd != self.fd:
                os.close(fd)
            raise
        return fd, name

    def open_file(self, path: str) -> OpenFile:
        """`path` open for reading, if it is a regular file the agent reads (`why_not_read`). Raises
        NotRead when it is not (a symlink, or under one, a FIFO, a socket, a device, a foreign hard
        link), FileNotFoundError when it is gone."""
        dir_fd, name = self._open_parent(path)
        try:
            before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            why = why_not_read(before, self.job_uid)
            if why is not None:  # not even opened: a FIFO or a device is never touched
                raise NotRead(path, why)
            try:
                fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
            except OSError as e:  # swapped since the lstat above
                if e.errno == errno.ELOOP:
                    raise NotRead(path, "a symlink") from None
                if e.errno == errno.ENXIO:
                    raise NotRead(path, "a socket") from None
                if e.errno == errno.EAGAIN:
                    raise NotRead(path, "a file another process holds a lease on") from None
                if e.errno in (errno.EACCES, errno.EPERM):  # an agent that is not root
                    raise NotRead(path, "a file the agent may not read") from None
                raise
        finally:
            if dir_fd != self.fd:
                os.close(dir_fd)
        try:
            st = os.fstat(fd)
            why = why_not_read(st, self.job_uid)
            if why is not None:
                raise NotRead(path, why)
        except BaseException:
            os.close(fd)
            raise
        return OpenFile(path=path, fd=fd, st=st)

    def lstat(self, path: str) -> os.stat_result:
        """The entry at `path` itself (a symlink's own stat), reached without following a symlink."""
        dir_fd, name = self._open_parent(path)
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        finally:
            if dir_fd != self.fd:
                os.close(dir_fd)

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """The bytes of a small regular file (None: not one, gone, or longer than `max_bytes`)."""
        try:
            f = self.open_file(path)
        except (NotRead, OSError):
            return None
        try:
            if f.st.st_size > max_bytes:
                return None
            data = os.read(f.fd, max_bytes + 1)
        finally:
            os.close(f.fd)
        return data if len(data) <= max_bytes else None


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
