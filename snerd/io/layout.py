"""Adopting an upstream SnerdMQ v0.2 directory (`DIR/tasks/tasks.log`, `DIR/.lock`).

Upstream v0.3 moves the single log into `shard-0/` on first start; snerd does the same, under
`.membership.lock`, refusing while a legacy daemon still holds `DIR/.lock`. Every step is a
rename within one directory tree, each followed by an fsync of the directories involved, and the
adoption is idempotent: a crash in the middle is finished by the next start. Upstream forgot
`rate_limits.json`; snerd moves it too. Nothing is reached through a symbolic link
(`snerd.io.files`): a link where the lock file or a directory belongs refuses the adoption
(`AdoptionRefused`), and a log that is itself a link is moved as the link, which the daemon
then refuses to use.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import portalocker

from snerd.io.files import RefusedFile, fsync_dir, make_dirs, open_dir, open_file
from snerd.io.membership import MEMBERSHIP, MembershipLock

__all__ = ["AdoptionRefused", "LegacyDaemonRunning", "adopt_legacy_layout"]


class LegacyDaemonRunning(RuntimeError):
    """An upstream v0.2 daemon still holds `DIR/.lock`."""


class AdoptionRefused(LegacyDaemonRunning):
    """The upstream layout cannot be adopted as it is on disk: a symbolic link (or an entry of
    the wrong kind) where snerd needs a file or directory. Bad input on disk; a
    `LegacyDaemonRunning`, so that a caller that stops on one stops on this too."""


def adopt_legacy_layout(directory: Path) -> str | None:
    """Move `DIR/tasks/*` into `DIR/shard-0/tasks/` when there is no membership.json yet.

    Returns a message for the log when something was adopted, else None.
    Raises LegacyDaemonRunning when the legacy daemon is still running.
    """
    legacy = directory / "tasks" / "tasks.log"
    if (directory / MEMBERSHIP).exists() or not legacy.exists():
        return None
    try:
        return _adopt(directory, legacy)
    except RefusedFile as exc:
        raise AdoptionRefused(
            f"cannot adopt the upstream single-log layout in {directory}: {exc}"
        ) from None


def _adopt(directory: Path, legacy: Path) -> str | None:
    with MembershipLock(directory):
        if (directory / MEMBERSHIP).exists() or not legacy.exists():
            return None
        root_lock = directory / ".lock"
        if os.path.lexists(root_lock):
            fd = open_file(root_lock, os.O_RDWR, root=directory)
            try:
                try:
                    portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
                except portalocker.exceptions.LockException:
                    raise LegacyDaemonRunning(
                        f"Another daemon is already running on storage '{directory}' "
                        f"(lock file: {root_lock})"
                    ) from None
                portalocker.unlock(fd)
            finally:
                os.close(fd)
        target = directory / "shard-0" / "tasks"
        make_dirs(target, root=directory)
        moved = []
        src_dir = open_dir(directory / "tasks", root=directory)
        dst_dir = open_dir(target, root=directory)
        try:
            for name in ("tasks.log", "rate_limits.json"):
                if os.path.lexists(directory / "tasks" / name):
                    # rename(2) moves the entry itself, never through a link it may be.
                    os.replace(name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
                    moved.append(name)
        finally:
            os.close(src_dir)
            os.close(dst_dir)
        fsync_dir(target)
        fsync_dir(directory / "tasks")
        with contextlib.suppress(OSError):  # something else lives there; leave it
            (directory / "tasks").rmdir()
        fsync_dir(directory)
        return f"adopted the upstream single-log layout: moved {', '.join(moved)} into {target}"
