"""The job's checkpoint dir opened, walked and read by a root agent without following anything the job
planted (the threat: `spotrelay.agent.confined`). Its sibling `spotrelay.agent.confined.restore` writes
the dir (a restore) with the same primitives.

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
