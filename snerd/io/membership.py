"""membership.json and the lock files: the shell's half of ownership.

Owns: reading and conditionally replacing membership.json under `.membership.lock`, and holding
`shard-N/.lock`. It decides nothing: the core says what to write and which locks to take.
Blocking calls here run in worker threads; a thread is never abandoned while it may still take a
lock (trio `to_thread.run_sync` without `abandon_on_cancel`), and locks are taken with
LOCK_NB and polled, never with a blocking flock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
from pathlib import Path
from typing import Any

import orjson
import portalocker

from snerd.core.ownership import LockText, MembershipInvalid, parse_membership, withdrawal
from snerd.io.files import atomic_replace, make_dirs, open_file, read_small

__all__ = [
    "MembershipConflict",
    "MembershipInvalid",
    "MembershipLock",
    "ShardLocks",
    "parse_membership_file",
    "read_membership",
    "update_membership",
    "withdraw_claims",
    "write_membership_locked",
]

MEMBERSHIP = "membership.json"
MEMBERSHIP_LOCK = ".membership.lock"
#: How long a membership read-modify-write waits for `.membership.lock` before giving up.
LOCK_WAIT_S = 10.0
_POLL_S = 0.002
#: Errors on a held lock's fd that mean the lock is gone: EBADFD is what a GlusterFS client
#: with `client.strict-locks on` returns once the server has dropped the lock.
LOST_LOCK_ERRNOS = {
    errno.EIO,
    errno.EBADF,
    errno.ENOLCK,
    getattr(errno, "ENOTCONN", 107),
    getattr(errno, "EBADFD", 77),
}


def _close_quietly(fd: int) -> None:
    """close(2) a descriptor whose file may be gone with its mount (EBADFD, ENOTCONN): the
    descriptor is released whatever close reports, and nothing was left to flush."""
    with contextlib.suppress(OSError):
        os.close(fd)


class MembershipConflict(Exception):
    """membership.json changed since it was read; carries what is there now."""

    def __init__(self, doc: dict[str, Any] | None) -> None:
        super().__init__("membership.json changed since it was read")
        self.doc = doc


class MembershipLock:
    """flock on `.membership.lock`, polled with LOCK_NB (never an abandonable blocking flock)
    for up to `wait_s`: every reader and writer of membership.json holds it, and so does the
    adoption of an upstream layout (`snerd.io.layout`)."""

    def __init__(self, directory: Path, wait_s: float = LOCK_WAIT_S) -> None:
        self.path = directory / MEMBERSHIP_LOCK
        self.fd: int | None = None
        self.wait_s = wait_s

    def __enter__(self) -> MembershipLock:
        fd = open_file(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # never through a link
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
                break
            except portalocker.exceptions.LockException:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise TimeoutError(f"{self.path} stayed locked for {self.wait_s:g} s") from None
                time.sleep(_POLL_S)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.fd is not None
        try:
            portalocker.unlock(self.fd)
        finally:
            os.close(self.fd)
            self.fd = None


def _read(directory: Path) -> dict[str, Any] | None:
    try:
        data = read_small(directory / MEMBERSHIP, None)  # never through a link
    except FileNotFoundError:
        return None
    return parse_membership_file(directory / MEMBERSHIP, data)


def parse_membership_file(path: Path, data: bytes) -> dict[str, Any]:
    """`data`, read from `path`, as a membership document (the core's rule,
    `check_membership`); MembershipInvalid naming the file and what is wrong otherwise."""
    try:
        return parse_membership(data)
    except MembershipInvalid as exc:
        raise MembershipInvalid(f"{path} is not a usable membership file: {exc}") from None


def read_membership(directory: Path) -> dict[str, Any] | None:
    """Read membership.json under its lock (None when absent)."""
    with MembershipLock(directory):
        return _read(directory)


def write_membership_locked(directory: Path, doc: dict[str, Any]) -> None:
    """Replace membership.json atomically (caller holds the lock). Pretty-printed like upstream."""
    atomic_replace(directory / MEMBERSHIP, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def update_membership(
    directory: Path, doc: dict[str, Any], expected_version: int | None
) -> dict[str, Any]:
    """Under the lock: replace membership.json with `doc` if its version is `expected_version`
    (None: only if there is no file). Raises MembershipConflict otherwise."""
    with MembershipLock(directory):
        current = _read(directory)
        version = None if current is None else int(current.get("version", 0))
        if version != expected_version:
            raise MembershipConflict(current)
        write_membership_locked(directory, doc)
        return doc


#: How long `withdraw_claims` waits for `.membership.lock`: it runs while a process ends.
WITHDRAW_WAIT_S = 2.0


def withdraw_claims(directory: Path, node_id: str) -> bool:
    """Remove every claim and the heartbeat of `node_id` from membership.json (the core's
    `withdrawal`), as a drain does, for a process ending without its drain: its successors
    then find its shards free instead of waiting for its leases. One read-modify-write under
    `.membership.lock`, as every writer's is (no version to race); False when the file named
    the node nowhere. Raises OSError (TimeoutError after `WITHDRAW_WAIT_S`) and
    MembershipInvalid: the caller is ending anyway and says what went wrong."""
    with MembershipLock(directory, wait_s=WITHDRAW_WAIT_S):
        current = _read(directory)
        new = None if current is None else withdrawal(current, node_id=node_id)
        if new is None:
            return False
        write_membership_locked(directory, new)
        return True


class ShardLocks:
    """The `shard-N/.lock` files this process holds, one open fd each.

    The lock file is never unlinked (unlinking would let two processes lock two different
    inodes under one name). Each renewal writes and fsyncs through the fd so that a lock lost
    on a network filesystem surfaces as an error (docs/architecture.md,
    "Lock lost").
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fds: dict[int, int] = {}
        #: fds a renewal is writing through in a worker thread right now (`touching`): an
        #: unlock meanwhile keeps the lock and the fd until the write is done (`end_touch`),
        #: so the fd's number is never reused for another file under the writer's feet, and
        #: the lock is never free while the renewal's text, not `released`, is in the file.
        self._touching: dict[int, int] = {}
        #: fds unlocked during a renewal write, to let go after it, with the `released` text
        #: to write then (the renewal's write may have replaced the one written at unlock).
        self._close_later: dict[int, LockText | None] = {}
        #: Per shard, what its lock file said when `try_lock` last took the lock, for the
        #: `LockAcquired` event.
        self.previous: dict[int, LockText] = {}
        #: Per shard held, what this process wrote into its lock file (absent: a probe's
        #: hold, which writes nothing, so the file still names the holder before).
        self.written: dict[int, LockText] = {}

    def path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard}" / ".lock"

    def try_lock(self, shard: int, owner: str, epoch: int = 0, *, probe: bool = False) -> bool:
        """flock(LOCK_EX | LOCK_NB). True when held; False when another process holds it.

        Taken (or already held), the lock file's text goes to `previous`, and the file then
        names this process, `owner` and the claim's `epoch`, unless this is a `probe`: a probe
        only asks whether the claimant still holds the lock and leaves the file as it is."""
        fd = self.fds.get(shard)
        if fd is None:
            path = self.path(shard)
            # Neither `shard-N/` nor the lock file may be a link (`snerd.io.files`).
            make_dirs(path.parent / "tasks", root=self.directory)
            fd = open_file(path, os.O_RDWR | os.O_CREAT, 0o644, root=self.directory)
            try:
                portalocker.lock(fd, portalocker.LOCK_EX | portalocker.LOCK_NB)
            except portalocker.exceptions.LockException:
                os.close(fd)
                return False
            self.fds[shard] = fd
            self.written.pop(shard, None)
        try:
            self.previous[shard] = self.written.get(shard) or LockText.parse(
                os.pread(fd, 4096, 0).decode("utf-8", "replace")
            )
            if not probe:
                self.written[shard] = LockText(pid=os.getpid(), owner=owner, epoch=epoch)
                self.touch(shard, owner)
        except OSError:
            self.unlock(shard)
            raise
        return True

    def touch(self, shard: int, owner: str) -> None:
        """Write the owner and pid through the locked fd and fsync it (nothing when the shard
        is not locked). Raises OSError when the lock may be lost (EIO, EBADF, ENOTCONN,
        ENOLCK)."""
        fd = self.fds.get(shard)
        if fd is None or shard not in self.written:
            return  # not locked, or held by a probe, which writes nothing
        self._write_owner(fd, self._text(shard, owner))

    def _text(self, shard: int, owner: str) -> LockText:
        """The text a renewal of a lock this process wrote writes (and what `unlock` marks
        released after it): the one written on taking the lock, naming `owner`."""
        text = self.written[shard] = dataclasses.replace(self.written[shard], owner=owner)
        return text

    @classmethod
    def _write_owner(cls, fd: int, text: LockText) -> None:
        cls._write_text(fd, text)
        os.fsync(fd)

    @staticmethod
    def _write_text(fd: int, text: LockText) -> None:
        data = text.render().encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    def begin_touch(self, shard: int, owner: str) -> tuple[int, LockText] | None:
        """In the event loop: reserve the fd of `shard` for a `touch_reserved` in a worker
        thread, with the text to write (None when the shard is not locked, or held by a
        probe, which writes nothing)."""
        fd = self.fds.get(shard)
        if fd is None or shard not in self.written:
            return None
        self._touching[shard] = fd
        return fd, self._text(shard, owner)

    def touch_reserved(self, fd: int, text: LockText) -> None:
        """In a worker thread: the renewal write through an fd reserved by `begin_touch`."""
        self._write_owner(fd, text)

    def end_touch(self, shard: int) -> None:
        """In the event loop, after `touch_reserved`: if the shard was unlocked meanwhile,
        mark the file released again (over the renewal's text) and only then let the lock
        go and close the fd."""
        fd = self._touching.pop(shard, None)
        if fd is not None and fd in self._close_later:
            self._let_go(fd, self._close_later.pop(fd))

    def unlock(self, shard: int) -> None:
        """Release a shard lock. A lock already lost (its fd failing with EBADFD or ENOTCONN
        after a network filesystem dropped it) is released all the same: nothing to undo."""
        fd = self.fds.pop(shard, None)
        written = self.written.pop(shard, None)
        if fd is None:
            return
        released = None if written is None else dataclasses.replace(written, released=True)
        if self._touching.get(shard) == fd:
            # A renewal is writing through this fd: its text may land after `released` and
            # replace it. The lock is let go once that write is done (`end_touch`), after
            # `released` is written again: a prober never finds it free under a live text.
            self._close_later[fd] = released
            return
        self._let_go(fd, released)

    @classmethod
    def _let_go(cls, fd: int, released: LockText | None) -> None:
        """Mark the lock file released (None: this process wrote nothing into it, a probe's
        hold), unlock and close. Let go alive, the file says so, and a prober finding the
        lock free does not take this process for dead (`LockText.released`); page cache is
        enough, it outlives this process, and a crash before it leaves the lock held."""
        if released is not None:
            with contextlib.suppress(OSError):
                cls._write_text(fd, released)
        with contextlib.suppress(OSError, portalocker.exceptions.LockException):
            portalocker.unlock(fd)
        _close_quietly(fd)

    def unlock_all(self) -> None:
        for shard in list(self.fds):
            self.unlock(shard)

    def abandon_all(self) -> None:
        """Let every lock go unmarked, as a process that dies does (no `released` line), for
        a process ending without its drain: it acts for nothing any more, so a prober that
        finds a lock free under its claim rightly takes it for gone (`lock_names_claim`)."""
        for shard in list(self.fds):
            self.written.pop(shard, None)  # (what `unlock` would mark released)
            self.unlock(shard)

    def holder(self, shard: int) -> str:
        """What the lock file says about its holder (pid and owner), for error messages."""
        try:
            text = read_small(self.path(shard), 4096, root=self.directory)
            return text.decode("utf-8", "replace").strip().replace("\n", " ")
        except OSError:
            return "unknown"
