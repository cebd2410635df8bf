"""The second process of the startup lock probe (docs/deployment.md, "The lock probe").

The daemon holds an exclusive flock on `DIR/.lockprobe` and runs this file as a script in a
fresh interpreter (`python -I -S lockprobe.py PATH`), which tries the same lock without
blocking. On a filesystem where flock excludes, the try fails with EWOULDBLOCK. If it
succeeds, flock is a no-op there and shard locks would exclude nothing.

Owns: one open, one non-blocking flock, one close. Must never import anything outside the
standard library (it runs with `-S`, without site-packages, to start in ~20 ms) and must never
unlink the probe file (lock files are permanent: gluster/glusterfs#3153).
"""

from __future__ import annotations

import fcntl
import os
import sys

__all__ = ["ACQUIRED", "BLOCKED", "FAILED", "try_lock"]

#: Exit codes of the script. Not 1 or 2: Python itself uses those for a crash or a usage error.
BLOCKED = 0
ACQUIRED = 10
FAILED = 11


def try_lock(path: str) -> int:
    """Try `flock(LOCK_EX | LOCK_NB)` on `path` from this process: BLOCKED when another open
    file description holds it, ACQUIRED when this process got it (released again at once),
    FAILED (with the reason on stderr) when the open or the flock failed otherwise."""
    try:
        # O_RDWR: over NFS an exclusive flock needs a writable fd (flock(2), "NFS details").
        # O_NOFOLLOW: the daemon opened the file without following a link (snerd.io.files);
        # so does this process (this script imports nothing outside the standard library).
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        print(f"cannot open {path}: {exc}", file=sys.stderr)
        return FAILED
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # EWOULDBLOCK / EAGAIN: the daemon's lock excluded us
            return BLOCKED
        except OSError as exc:
            print(f"flock on {path}: {exc}", file=sys.stderr)
            return FAILED
        fcntl.flock(fd, fcntl.LOCK_UN)
        return ACQUIRED
    finally:
        os.close(fd)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: lockprobe.py PATH", file=sys.stderr)
        sys.exit(FAILED)
    sys.exit(try_lock(sys.argv[1]))
