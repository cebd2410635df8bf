"""The data directory at start: created when missing, refused when it cannot hold a queue.

Owns `prepare_data_directory`, the first thing the daemon (`snerdmq DIR`) and the embedded engine
do with DIR, before the filesystem check, the legacy-layout adoption or membership.json: it makes
DIR (and missing parents) and proves this process can create a file in it. What it refuses is a
`DataDirectoryError`, whose text is one sentence naming the path and the problem, and what to do:

- DIR exists and is not a directory (a regular file, a FIFO; a symlink to one);
- DIR cannot be created: a parent is not a directory, the filesystem is read-only, permission is
  denied, the name is too long;
- DIR exists but no file can be created in it: a read-only mount (EROFS), no write or search
  permission for this user (EACCES, EPERM; root passes a chmod but not a read-only mount).

A full filesystem (ENOSPC, EDQUOT) is not refused: the daemon runs on one, refusing enqueues
until space comes back. It must never remove or change anything already in DIR: the one file it
writes, a probe, has a name of its own (`.snerd-write-probe.<pid>`), is created exclusively
without following a link (O_EXCL | O_NOFOLLOW: open(2)) and unlinked at once.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from snerd.io.files import PathError, describe_kind

__all__ = ["DataDirectoryError", "prepare_data_directory"]

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: Errors of a write probe that do not stop a start: the daemon survives a full disk.
_SURVIVABLE = (errno.ENOSPC, errno.EDQUOT)


class DataDirectoryError(PathError):
    """The data directory cannot be used (bad input from whoever started snerd, never a bug).
    `errno` is the system's error, `filename` the path concerned; `str()` is the sentence."""


def _not_a_directory(path: Path) -> str | None:
    """What `path` is when it exists and is not a directory (None otherwise)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISDIR(mode) else describe_kind(mode)


def _who() -> str:
    return f"uid {os.geteuid()}" if hasattr(os, "geteuid") else "this user"


def _cannot_create(directory: Path, exc: OSError) -> DataDirectoryError:
    where = str(directory)
    if exc.errno == errno.ENOTDIR:
        for parent in directory.parents:
            kind = _not_a_directory(parent)
            if kind is not None:
                return DataDirectoryError(
                    errno.ENOTDIR,
                    f"cannot create data directory {where}: {parent} is {kind}, not a directory",
                    where,
                )
    if exc.errno == errno.EROFS:
        why = "the filesystem there is read-only"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        why = f"permission denied ({_who()} may not create it in {directory.parent})"
    else:
        why = exc.strerror or str(exc)
    return DataDirectoryError(
        exc.errno or errno.EIO, f"cannot create data directory {where}: {why}", where
    )


def _probe_write(directory: Path) -> None:
    """Create and remove a file in `directory`; a DataDirectoryError when that is refused."""
    probe = directory / f".snerd-write-probe.{os.getpid()}"
    where = str(directory)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
    except FileExistsError:
        return  # a probe of an earlier process with our pid: creating an entry worked once
    except OSError as exc:
        if exc.errno in _SURVIVABLE:
            return
        if exc.errno == errno.EROFS:
            why = "is on a read-only filesystem; remount it read-write or choose another directory"
        elif exc.errno in (errno.EACCES, errno.EPERM):
            why = (
                f"is not writable by {_who()} (permission denied); give this user write access "
                "or choose another directory"
            )
        else:
            why = f"cannot hold a new file: {exc.strerror or exc}"
        raise DataDirectoryError(
            exc.errno or errno.EIO, f"data directory {where} {why}", where
        ) from None
    os.close(fd)
    try:
        os.unlink(probe)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DataDirectoryError(
            exc.errno or errno.EIO,
            f"data directory {where}: cannot remove a file just made in it: {exc.strerror or exc}",
            where,
        ) from None


def prepare_data_directory(directory: Path) -> None:
    """Make `directory` (and missing parents) and prove a file can be created in it.

    Raises:
        DataDirectoryError: it is not a directory, cannot be made, or is not writable.
    """
    where = str(directory)
    kind = _not_a_directory(directory)
    if kind is not None:
        raise DataDirectoryError(
            errno.ENOTDIR, f"data directory {where} is {kind}, not a directory", where
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        # A dangling symlink, or made meanwhile as something else.
        kind = _not_a_directory(directory) or "a symlink to nothing"
        raise DataDirectoryError(
            errno.EEXIST, f"data directory {where} is {kind}, not a directory", where
        ) from None
    except OSError as exc:
        raise _cannot_create(directory, exc) from None
    _probe_write(directory)
