"""Adopting an upstream SnerdMQ v0.2 directory (`DIR/tasks/tasks.log`, `DIR/.lock`).

Upstream v0.3 moves the single log into `shard-0/` on first start; snerd does the same, under
`.membership.lock`, refusing while a legacy daemon still holds `DIR/.lock`. Every step is a
rename within one directory tree, each followed by an fsync of the directories involved, and the
adoption is idempotent: a crash in the middle is finished by the next start. Upstream forgot
`rate_limits.json`; snerd moves it too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import portalocker

from snerd.io.log import fsync_dir
from snerd.io.membership import MEMBERSHIP, _MembershipLock

__all__ = ["LegacyDaemonRunning", "adopt_legacy_layout"]


class LegacyDaemonRunning(RuntimeError):
    """An upstream v0.2 daemon still holds `DIR/.lock`."""


def adopt_legacy_layout(directory: Path) -> str | None:
    """Move `DIR/tasks/*` into `DIR/shard-0/tasks/` when there is no membership.json yet.

    Returns a message for the log when something was adopted, else None.
    Raises LegacyDaemonRunning when the legacy daemon is still running.
    """
    legacy = directory / "tasks" / "tasks.log"
    if (directory / MEMBERSHIP).exists() or not legacy.exists():
        return None
    with _MembershipLock(directory):
        if (directory / MEMBERSHIP).exists() or not legacy.exists():
            return None
        root_lock = directory / ".lock"
        if root_lock.exists():
            fd = os.open(root_lock, os.O_RDWR)
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
        target.mkdir(parents=True, exist_ok=True)
        moved = []
        for name in ("tasks.log", "rate_limits.json"):
            src = directory / "tasks" / name
            if src.exists():
                os.replace(src, target / name)
                moved.append(name)
        fsync_dir(target)
        fsync_dir(directory / "tasks")
        with contextlib.suppress(OSError):  # something else lives there; leave it
            (directory / "tasks").rmdir()
        fsync_dir(directory)
        return (
            f"adopted the upstream single-log layout: moved {', '.join(moved)} "
            f"into {target}"
        )
