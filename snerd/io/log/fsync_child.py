"""The log's sync helper process: fsyncs the descriptors the daemon's log writer hands it.

Run as a script, never imported by the daemon: `python -I fsync_child.py <socket fd>`
(`snerd.io.log.fsync_helper.SyncHelper.start`). It imports only the standard library, so it
starts quickly and does not depend on where snerd is installed or on the daemon's environment
(`-I`: no `PYTHON*` variables, no user site, no current directory on `sys.path`).

Protocol, over the Unix socket it is given: it fsyncs the descriptors handed to it (`F` + id,
with the descriptor passed by SCM_RIGHTS), when asked (`S` + id, then `D`), and answers each `D`
with `R` + errno (0: all synced) + the id of the first file that failed. `C` + id closes one.
Commands are 8 bytes, answers 12. `SNERD_TEST_SYNC_FAIL_AT=n` makes its n-th fsync fail with EIO
(tests).

It lives exactly as long as its parent's end of the socket: it leaves at the end of it, and
quietly when the parent died with its end unread (recv(2) ECONNRESET, send(2) EPIPE after a
kill -9). It runs in a process group of its own, and ignores SIGINT: Ctrl-C in a terminal
signals the whole foreground group, and the daemon, which drains on it, still needs its fsyncs
until it closes the socket (a KeyboardInterrupt would end the helper with a traceback).

It must never: write to a file, or decide anything (it fsyncs what it is told, in order).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping

#: Bytes read per recv, and descriptors taken with them at most.
_RECV_BYTES = 65536
_RECV_FDS = 64


def _fail_at(env: Mapping[str, str]) -> int:
    """The fsync to fail (`SNERD_TEST_SYNC_FAIL_AT`, counted from 1; 0: none)."""
    raw = env.get("SNERD_TEST_SYNC_FAIL_AT", "0")
    return int(raw) if raw.isdigit() else 0


def serve(sock: socket.socket, fail_at: int) -> None:
    """Answer the commands on `sock` until its other end is closed (or gone)."""
    fds: dict[int, int] = {}
    spare: list[int] = []
    buf = b""
    failed: tuple[int, int] | None = None
    count = 0
    try:
        while True:
            data, got, _, _ = socket.recv_fds(sock, _RECV_BYTES, _RECV_FDS)
            if not data:
                break
            buf += data
            spare.extend(got)
            while len(buf) >= 8:
                op, n, buf = buf[:1], int(buf[1:8]), buf[8:]
                if op == b"F":
                    fds[n] = spare.pop(0)
                elif op == b"C":
                    fd = fds.pop(n, None)
                    if fd is not None:
                        os.close(fd)
                elif op == b"S":
                    count += 1
                    try:
                        if count == fail_at:
                            raise OSError(5, "injected")
                        os.fsync(fds[n])
                    except OSError as exc:
                        if failed is None:
                            failed = (exc.errno or 5, n)
                elif op == b"D":
                    sock.sendall(b"R%04d%07d" % failed if failed else b"R00000000000")
                    failed = None
    except ConnectionError:
        pass  # the parent is gone: nobody is left to answer


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(socket.socket(fileno=int(argv[1])), _fail_at(os.environ))


if __name__ == "__main__":
    main(sys.argv)
