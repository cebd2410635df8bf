"""The parent side of the log's sync helper process: start it, hand it files, ask, read answers.

With `GroupCommitLog(sync_helper=True)` (the daemon's way, policy `always`), the trio thread
writes a batch itself and a child process fsyncs it: no thread of the daemon needs the GIL
between a batch's write and its acks. This module owns that child's lifetime and the wire
protocol's parent end (the child is `fsync_child.py`, a script; the protocol is described
there). Which batch waits for which answer is the writer's (`GroupCommitLog._helper_*`).

It must never: write to a log file, or wait for an answer in a way that blocks trio (answers
are read with MSG_DONTWAIT, or after `trio.lowlevel.wait_readable`).
"""

from __future__ import annotations

import contextlib
import enum
import socket
import subprocess
import sys

import trio

from snerd.io.log import fsync_child

__all__ = ["CHILD_PROGRAM", "NO_REPLY", "NoReply", "SyncHelper"]

#: The helper's program, run as a script by path (`fsync_child`).
CHILD_PROGRAM = fsync_child.__file__


class NoReply(enum.Enum):
    """No answer from the helper yet (`SyncHelper.reply_nowait`)."""

    NO_REPLY = "no reply yet"


NO_REPLY = NoReply.NO_REPLY


class SyncHelper:
    """A child process that fsyncs the log's files for the trio thread (`sync_helper`): the
    trio thread writes a batch itself, and no thread of this process needs the GIL between a
    batch's write and its acks. Talks over a Unix socket pair (descriptors passed with
    SCM_RIGHTS, so it fsyncs the very open file the trio thread wrote through)."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self._buf = b""

    @classmethod
    def start(cls) -> SyncHelper:
        parent, child = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", CHILD_PROGRAM, str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                process_group=0,  # out of reach of the terminal's Ctrl-C (`fsync_child`)
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(proc, parent)

    def adopt(self, helper_id: int, fd: int) -> None:
        socket.send_fds(self.sock, [b"F%07d" % helper_id], [fd])

    def forget(self, helper_id: int) -> None:
        self.sock.sendall(b"C%07d" % helper_id)

    def sync(self, helper_ids: list[int]) -> None:
        self.sock.sendall(b"".join(b"S%07d" % i for i in helper_ids) + b"D0000000")

    async def reply(self) -> tuple[int, int] | None:
        """The next answer: None (all synced) or (id of the file that failed, errno)."""
        while True:
            answer = self.reply_nowait()
            if answer is not NO_REPLY:
                return answer
            await trio.lowlevel.wait_readable(self.sock)

    def reply_nowait(self) -> tuple[int, int] | NoReply | None:
        """The next answer if it has come (see `reply`), else `NO_REPLY`. Reads without
        blocking: `GroupCommitLog.poll_helper` may have taken what woke `reply`."""
        while len(self._buf) < 12:
            try:
                chunk = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return NO_REPLY
            if not chunk:
                raise EOFError("the sync helper exited")
            self._buf += chunk
        msg, self._buf = self._buf[:12], self._buf[12:]
        err, helper_id = int(msg[1:5]), int(msg[5:12])
        return None if err == 0 else (helper_id, err)

    def close(self) -> None:
        """(trio thread) The helper exits at the end of its socket; wait for it."""
        if self.sock.fileno() >= 0:
            trio.lowlevel.notify_closing(self.sock)
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
