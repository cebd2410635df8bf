"""Files in the data directory, opened without following a symbolic link.

Owns the one rule every open, create, rename and unlink under a queue directory keeps: nothing
inside the data directory is reached through a symbolic link, and only regular files are opened
as files. The data directory itself (DIR, chosen by whoever starts snerd) may be a symlink;
below it, a link could point anywhere the daemon's user can write, and a directory shared with
other users would let them aim the daemon's truncates, appends and lock writes at any of that
user's files. So:

- Every directory between DIR and the file is opened with `O_DIRECTORY | O_NOFOLLOW` relative to
  its parent (`dir_fd`, openat(2)), and the file itself with `O_NOFOLLOW` relative to its
  directory: a link anywhere below DIR is refused, and no component can be swapped for a link
  between a check and the use, since nothing is looked up by path twice.
- The file is opened with `O_NONBLOCK` and checked with fstat(2) before anything is read or
  written: opening a FIFO for reading would otherwise block until a writer comes, and a device
  or socket is no log. `O_NONBLOCK` is then cleared (it means nothing for regular files).
- A refusal is a `RefusedFile` (an `OSError`, so every caller that survives a failed open
  survives it too) whose text names the path: "refusing to follow the symlink
  DIR/shard-0/tasks/tasks.log".

Callers pass the data directory as `root`; without one, only the last component is checked
(tests, and files whose directory is the data directory itself).

On top of that it owns the durable-write steps the log, membership.json and the tools share:
a write of all the bytes (`write_all`), exclusive creation of a temp file (`create_exclusive`),
a rename that survives NFS's lost reply (`rename_over`), the directory fsync that makes an
entry durable (`fsync_dir`), and their composition, `atomic_replace`. This module decides nothing
about which files exist or what they hold, and never deletes anything but the one entry it is
asked to (unlinking a symlink removes the link, never its target: unlink(2)).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
from collections.abc import Iterator

__all__ = [
    "PathError",
    "RefusedFile",
    "atomic_replace",
    "atomic_write",
    "create_exclusive",
    "describe_kind",
    "ensure_dir",
    "fsync_dir",
    "make_dirs",
    "open_dir",
    "open_file",
    "read_small",
    "rename_over",
    "replace_file",
    "unlink_file",
    "write_all",
]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC

PathLike = str | os.PathLike[str]


class PathError(OSError):
    """An `OSError` about one path whose `str()` is a whole sentence (the message already
    names the path), not `[Errno N] message: 'path'`."""

    def __init__(self, code: int, message: str, path: str) -> None:
        super().__init__(code, message, path)

    def __str__(self) -> str:
        return str(self.strerror)


class RefusedFile(PathError):
    """An entry of the data directory snerd will not use: a symbolic link, or not the kind of
    file that belongs there (a FIFO, socket, device, or a directory where a file belongs).
    Bad input on disk, never a caller bug. `errno` is ELOOP for a link, ENOTDIR or EISDIR for
    the wrong kind of entry, EINVAL for a special file; `filename` is the path."""


def describe_kind(mode: int) -> str:
    """What kind of entry an `st_mode` is, in words ("a symbolic link", "a FIFO", ...)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"


def _refused(path: str, mode: int, want_dir: bool) -> RefusedFile:
    if stat.S_ISLNK(mode):
        return RefusedFile(
            errno.ELOOP,
            f"refusing to follow the symlink {path} (snerd never follows a symlink inside its "
            "data directory; put the file itself there)",
            path,
        )
    kind = describe_kind(mode)
    if want_dir:
        return RefusedFile(errno.ENOTDIR, f"{path} is {kind}, not a directory", path)
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    return RefusedFile(code, f"{path} is {kind}, not a regular file", path)


def _split(path: PathLike, root: PathLike | None) -> tuple[str, list[str], str]:
    """(the directory to start from, the directory components below it, the last name)."""
    full = os.fspath(path)
    if root is None:
        head, name = os.path.split(full)
        return head or ".", [], name
    base = os.fspath(root)
    rel = os.path.relpath(full, base)
    parts = rel.split(os.sep)
    if rel == os.curdir or os.pardir in parts or os.path.isabs(rel):
        raise ValueError(f"{full} is not inside {base}")
    return base, parts[:-1], parts[-1]


def _open_dir_at(dfd: int, name: str, *, create: bool) -> int:
    """Open the directory `name` in `dfd` without following a link (creating it if asked)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=dfd)
        # mkdir(2) makes an entry in the parent: durable once the parent is fsynced.
        _fsync_dir_fd(dfd)
    return _open_dir_at(dfd, name, create=False)


def _fsync_dir_fd(dfd: int) -> None:
    """fsync a directory descriptor; EINVAL (a filesystem that cannot) is ignored."""
    try:
        os.fsync(dfd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def _explain(dfd: int, name: str, shown: str, want_dir: bool, exc: OSError) -> OSError:
    """Turn ELOOP/ENOTDIR/EISDIR from an O_NOFOLLOW open into a `RefusedFile` naming what the
    entry is (lstat(2) relative to its directory); anything else is returned as it is."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
        return exc
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return exc
    if want_dir and stat.S_ISDIR(st.st_mode):
        return exc
    if not want_dir and stat.S_ISREG(st.st_mode):
        return exc
    return _refused(shown, st.st_mode, want_dir)


@contextlib.contextmanager
def _parent(
    path: PathLike, root: PathLike | None, *, create: bool = False
) -> Iterator[tuple[int, str, str]]:
    """The open directory holding `path` (walked from `root` without following links), the
    file's name in it, and the path as shown in messages."""
    base, dirs, name = _split(path, root)
    shown = os.fspath(path)
    # DIR itself is followed: whoever starts snerd chose it (and may have made it a link).
    dfd = os.open(base, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        walked = base
        for part in dirs:
            walked = os.path.join(walked, part)
            try:
                sub = _open_dir_at(dfd, part, create=create)
            except OSError as exc:
                raise _explain(dfd, part, walked, True, exc) from None
            os.close(dfd)
            dfd = sub
        yield dfd, name, shown
    finally:
        os.close(dfd)


def open_file(
    path: PathLike,
    flags: int,
    mode: int = 0o644,
    *,
    root: PathLike | None = None,
    create_dirs: bool = False,
) -> int:
    """open(2) `path` with `flags`, never through a symbolic link: each directory below `root`
    is opened with O_NOFOLLOW relative to its parent, the file with O_NOFOLLOW relative to its
    directory, and what was opened must be a regular file. `create_dirs` creates missing
    directories below `root` (each new entry fsynced). O_CLOEXEC is always added.

    Raises `RefusedFile` for a link or an entry of the wrong kind, and the usual `OSError`s
    otherwise (FileNotFoundError, FileExistsError for O_CREAT | O_EXCL, including over a link).
    """
    wanted_nonblock = flags & _O_NONBLOCK
    with _parent(path, root, create=create_dirs) as (dfd, name, shown):
        try:
            fd = os.open(
                name, flags | _O_NOFOLLOW | _O_CLOEXEC | _O_NOCTTY | _O_NONBLOCK, mode, dir_fd=dfd
            )
        except OSError as exc:
            raise _explain(dfd, name, shown, False, exc) from None
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            raise _refused(shown, st_mode, False)
        if not wanted_nonblock:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(path: PathLike, *, root: PathLike | None = None, create: bool = False) -> int:
    """A read-only descriptor of the directory `path`, reached below `root` without following
    a link (for os.scandir, fsync, and `dir_fd=` calls). `create` makes missing ones."""
    full = os.fspath(path)
    if root is not None and os.path.relpath(full, os.fspath(root)) == os.curdir:
        return os.open(full, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    with _parent(path, root, create=create) as (dfd, name, shown):
        try:
            return _open_dir_at(dfd, name, create=create)
        except OSError as exc:
            raise _explain(dfd, name, shown, True, exc) from None


def make_dirs(path: PathLike, *, root: PathLike) -> None:
    """Create the directory `path` and any missing ones between `root` and it, without
    following a link; each new entry is fsynced in its parent. `root` itself (and its
    parents) is created too when missing: it is DIR, where the operator wants the queue."""
    ensure_dir(os.fspath(root))
    os.close(open_dir(path, root=root, create=True))


def ensure_dir(root: str) -> None:
    """mkdir -p `root` (links on the way followed: it is where the operator put the queue),
    fsyncing each parent of a new directory so the new entries last."""
    missing: list[str] = []
    p = os.path.abspath(root)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o755)
        fd = os.open(os.path.dirname(d), os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            _fsync_dir_fd(fd)
        finally:
            os.close(fd)


def read_small(path: PathLike, limit: int | None, *, root: PathLike | None = None) -> bytes:
    """Up to `limit` bytes (None: all) of a small file (a lock file, a hint, membership.json),
    opened as `open_file` opens it. FileNotFoundError when it does not exist."""
    fd = open_file(path, os.O_RDONLY, root=root)
    try:
        chunks: list[bytes] = []
        left = sys.maxsize if limit is None else limit
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def unlink_file(path: PathLike, *, root: PathLike | None = None) -> None:
    """unlink(2) the entry `path` in its directory, reached without following a link. A link
    is removed itself, never its target. FileNotFoundError when there is none."""
    with _parent(path, root) as (dfd, name, _shown):
        os.unlink(name, dir_fd=dfd)


def replace_file(src: PathLike, dst: PathLike, *, root: PathLike | None = None) -> None:
    """rename(2) `src` over `dst`, both in one directory reached without following a link.
    rename replaces the entry `dst`, even a link, and never writes through one."""
    src_dir, src_name = os.path.split(os.fspath(src))
    dst_dir, dst_name = os.path.split(os.fspath(dst))
    if os.path.normpath(src_dir or ".") != os.path.normpath(dst_dir or "."):
        raise ValueError(f"{src} and {dst} are not in one directory")
    with _parent(dst, root) as (dfd, _name, _shown):
        os.replace(src_name, dst_name, src_dir_fd=dfd, dst_dir_fd=dfd)


# --------------------------------------------------------------------------------------------
# Durable writes: whole writes, exclusive creation, atomic replacement, directory fsyncs
# --------------------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, removed or renamed in it are durable.

    fsync(2): "Calling fsync() does not necessarily ensure that the entry in the directory
    containing the file has also reached disk. For that an explicit fsync() on a file descriptor
    for the directory is also needed." Some filesystems (and FUSE mounts) answer EINVAL for a
    directory: there is nothing more we can do there, so that one error is ignored.

    The path is followed even through a link: an fsync reads and writes nothing, and the files
    in the directory were opened without following one (`open_file`).
    """
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> int:
    """Write all of `data`; return the number of write(2) calls.

    write(2): "the number of bytes written may be less than count if, for example, there is
    insufficient space on the underlying physical medium, or the call was interrupted by a
    signal handler". A short write is followed by a write of the rest (Linux also caps one
    write at 0x7ffff000 bytes); when space really ran out, that next write raises ENOSPC.
    """
    view = memoryview(data)
    calls = 0
    while view:
        n = os.write(fd, view)
        calls += 1
        if n <= 0:  # not expected for a regular file; never loop forever
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[n:]
    return calls


def rename_over(src: str, dst: str, root: str | None = None) -> None:
    """rename(2) `src` over `dst` (one directory, reached without following a link below
    `root`), tolerating the NFS case where the rename happened but the reply was lost.

    rename(2), NFS notes: a retransmitted RENAME can fail although the first one succeeded. If
    `dst` now is the inode `src` was, the rename did happen.
    """
    src_stat = os.lstat(src)
    try:
        replace_file(src, dst, root=root)
    except OSError:
        try:
            dst_stat = os.lstat(dst)
        except OSError:
            raise
        if (dst_stat.st_ino, dst_stat.st_dev) != (src_stat.st_ino, src_stat.st_dev):
            raise


def create_exclusive(path: str, root: str | None) -> int:
    """Create `path` afresh for writing: a leftover entry (a crash's temp file, or a link
    someone planted) is unlinked first — the link itself, never its target (unlink(2)) — and
    the file is created with O_CREAT | O_EXCL, which fails rather than open anything that
    appeared meanwhile (open(2): with O_EXCL, "symbolic links are not followed")."""
    with contextlib.suppress(FileNotFoundError):
        unlink_file(path, root=root)
    return open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=root)


def atomic_replace(path: str | os.PathLike[str], data: bytes, *, tmp_suffix: str = ".tmp") -> None:
    """Replace a small file atomically and durably: temp file in the same directory, write,
    fsync, rename over `path`, fsync the directory (membership.json uses this).

    rename(2) is atomic: a reader sees the old content or the new, never a mix; the fsync before
    the rename makes sure the name never points at a file whose data is not on disk, and the
    directory fsync makes the rename itself durable (upstream bug 6.1.5 skipped it). The temp
    file is `path + tmp_suffix` (upstream's `membership.json.tmp`), so callers must serialise
    writers (membership.json is written under `.membership.lock`). On error the temp file is
    removed and `path` is untouched. The temp file is created exclusively (`create_exclusive`)
    and the rename replaces the entry `path`, so no link there is ever written through.
    """
    target = os.fspath(path)
    tmp = target + tmp_suffix
    fd = create_exclusive(tmp, None)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        rename_over(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_file(tmp)
        raise
    fsync_dir(os.path.dirname(target) or ".")


#: The same function under the other name callers know it by.
atomic_write = atomic_replace
