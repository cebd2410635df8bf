"""`ShardLocks`: the renewal write through a lock fd and an Unlock that comes meanwhile."""

from __future__ import annotations

import os
from pathlib import Path

import portalocker
import pytest

from snerd.core.ownership import LockText
from snerd.io.membership import ShardLocks


def fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_an_unlock_during_a_renewal_write_lets_go_only_after_it_marked_released(
    tmp_path: Path,
) -> None:
    locks = ShardLocks(tmp_path)
    assert locks.try_lock(3, "me", 4)
    reserved = locks.begin_touch(3, "me")
    assert reserved is not None
    fd, text = reserved
    locks.unlock(3)  # the Unlock arrives while the write is out
    assert fd_open(fd)  # not closed under the writer: its number cannot be reused yet
    other = ShardLocks(tmp_path)
    assert not other.try_lock(3, "next")  # and still held: the write may replace `released`
    locks.touch_reserved(fd, text)  # ...which it does
    assert not LockText.parse(locks.path(3).read_text()).released
    assert not other.try_lock(3, "next", probe=True)  # a prober cannot find it free now
    locks.end_touch(3)
    assert not fd_open(fd)
    assert other.try_lock(3, "next", probe=True)  # free once the file says released again
    assert other.previous[3] == LockText(pid=os.getpid(), owner="me", epoch=4, released=True)
    other.unlock(3)


def test_touch_of_a_shard_not_locked_is_nothing_and_a_renewal_writes_the_owner(
    tmp_path: Path,
) -> None:
    locks = ShardLocks(tmp_path)
    locks.touch(5, "me")  # not locked: no error, no file
    assert not locks.path(5).exists()
    assert locks.try_lock(5, "me", 7)
    assert locks.begin_touch(6, "me") is None
    reserved = locks.begin_touch(5, "me-again")
    assert reserved is not None
    fd, text = reserved
    locks.touch_reserved(fd, text)
    locks.end_touch(5)
    assert fd_open(fd)  # still held
    assert locks_text(locks, 5)[1:3] == ["me-again", "7"]  # the claim's epoch kept
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


def test_taking_a_lock_tells_whom_its_file_named_before(tmp_path: Path) -> None:
    """A prober that gets a lock learns whether the claimant held it under its claim (the
    file names the node that took it last, and that claim's epoch): only then does the free
    lock say that claimant is gone. A probe leaves the file as it was."""
    first = ShardLocks(tmp_path)
    assert first.try_lock(2, "a@pid-1-x", 3)
    assert first.previous[2] == LockText()  # a new lock file names nobody
    assert first.try_lock(2, "a@pid-1-x", 4)  # held already: its holder is this node
    assert first.previous[2] == LockText(pid=os.getpid(), owner="a@pid-1-x", epoch=3)
    assert locks_text(first, 2) == [str(os.getpid()), "a@pid-1-x", "4", ""]
    first.unlock(2)  # let go alive: the file says so
    assert locks_text(first, 2) == [str(os.getpid()), "a@pid-1-x", "4", "released", ""]
    prober = ShardLocks(tmp_path)
    assert prober.try_lock(2, "b@pid-2-y", probe=True)
    assert prober.previous[2] == LockText(
        pid=os.getpid(), owner="a@pid-1-x", epoch=4, released=True
    )
    assert locks_text(prober, 2)[1:4] == ["a@pid-1-x", "4", "released"]  # unchanged by it
    prober.unlock(2)  # a probe's hold writes nothing, on unlock either
    assert locks_text(prober, 2)[1:4] == ["a@pid-1-x", "4", "released"]
    # A holder that dies (its fd closed behind the lock table's back, as the kernel does on
    # exit) leaves the file as it was: not released.
    dying = ShardLocks(tmp_path)
    assert dying.try_lock(2, "d@pid-4-w", 6)
    os.close(dying.fds.pop(2))
    assert prober.try_lock(2, "b@pid-2-y", probe=True)
    assert prober.previous[2] == LockText(pid=os.getpid(), owner="d@pid-4-w", epoch=6)
    assert prober.begin_touch(2, "b@pid-2-y") is None  # nor by a renewal while it holds it
    prober.touch(2, "b@pid-2-y")
    assert locks_text(prober, 2)[1:3] == ["d@pid-4-w", "6"]
    assert prober.try_lock(2, "b@pid-2-y", 5)  # it claims the shard: now the file is its own
    assert prober.previous[2].owner == "d@pid-4-w"
    assert locks_text(prober, 2)[1:3] == ["b@pid-2-y", "5"]
    prober.unlock(2)
    locks = ShardLocks(tmp_path)
    locks.path(2).write_text("4242\n")  # upstream's lock file: a pid only, no node
    assert locks.try_lock(2, "c@pid-3-z")
    assert locks.previous[2] == LockText(pid=4242)
    locks.unlock_all()


def locks_text(locks: ShardLocks, shard: int) -> list[str]:
    return locks.path(shard).read_text().split("\n")
