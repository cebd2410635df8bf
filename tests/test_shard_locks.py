"""`ShardLocks`: the renewal write through a lock fd and an Unlock that comes meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

import portalocker
import pytest

from snerd.io.membership import ShardLocks


def fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_an_unlock_during_a_renewal_write_releases_at_once_and_closes_after_it(
    tmp_path: Path,
) -> None:
    locks = ShardLocks(tmp_path)
    assert locks.try_lock(3, "me")
    fd = locks.begin_touch(3)
    assert fd is not None
    locks.unlock(3)  # the Unlock arrives while the write is out
    assert fd_open(fd)  # not closed under the writer: its number cannot be reused yet
    other = ShardLocks(tmp_path)
    assert other.try_lock(3, "next")  # ...but the lock is free already
    locks.touch_reserved(fd, "me")
    locks.end_touch(3)
    assert not fd_open(fd)
    other.unlock(3)


def test_touch_of_a_shard_not_locked_is_nothing_and_a_renewal_writes_the_owner(
    tmp_path: Path,
) -> None:
    locks = ShardLocks(tmp_path)
    locks.touch(5, "me")  # not locked: no error, no file
    assert not locks.path(5).exists()
    assert locks.try_lock(5, "me")
    assert locks.begin_touch(6) is None
    fd = locks.begin_touch(5)
    assert fd is not None
    locks.touch_reserved(fd, "me-again")
    locks.end_touch(5)
    assert fd_open(fd)  # still held
    assert locks.path(5).read_text().split("\n")[1] == "me-again"
    with open(locks.path(5), "rb+") as f, pytest.raises(portalocker.exceptions.LockException):
        portalocker.lock(f, portalocker.LOCK_EX | portalocker.LOCK_NB)
    locks.unlock_all()
    assert not fd_open(fd)


def test_unlocking_a_lock_whose_descriptor_already_failed_does_not_raise(tmp_path: Path) -> None:
    """After a network filesystem drops a lock, its fd fails (EBADFD, ENOTCONN) and so do
    unlock and close: stepping down must still release it quietly (a daemon on a GlusterFS
    mount cut off past ping-timeout crashed here). A descriptor closed behind the lock table's
    back fails the same way (EBADF)."""
    locks = ShardLocks(tmp_path)
    assert locks.try_lock(0, "me")
    os.close(locks.fds[0])
    locks.unlock(0)  # no exception
    assert 0 not in locks.fds
    other = ShardLocks(tmp_path)
    assert other.try_lock(0, "other")
    other.unlock_all()
