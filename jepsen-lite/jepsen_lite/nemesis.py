"""Low-level fault tools, each able to tell whether it took effect: process state, the clock
file, filling and freeing a filesystem, small tmpfs mounts, lock-file replacement."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

__all__ = [
    "NEMESES",
    "fill_filesystem",
    "mount_tmpfs",
    "process_state",
    "replace_lock_file",
    "umount",
    "wait_gone",
    "wait_state",
    "write_clock_file",
]

#: Every nemesis name the command line accepts.
NEMESES = ("kill", "pause", "clock", "disk-full", "lock-fault")


def process_state(pid: int) -> str | None:
    """The state letter of `pid` in /proc (`R`, `S`, `T` stopped, `Z` zombie...), or None when
    there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()[0]


def wait_state(pid: int, states: str, timeout: float) -> str | None:
    """Poll until `pid` is in one of `states` (letters); the state seen last."""
    end = time.monotonic() + timeout
    state = process_state(pid)
    while state is not None and state not in states and time.monotonic() < end:
        time.sleep(0.01)
        state = process_state(pid)
    return state


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until `pid` is gone or a zombie; whether it is."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process_state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.02)
    return process_state(pid) in (None, "Z", "X")


def write_clock_file(path: Path, offset_s: float) -> None:
    """Atomically replace a daemon's SNERD_TEST_CLOCK_FILE with `offset_s` seconds."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{offset_s:.6f}\n")
    os.replace(tmp, path)


def fill_filesystem(directory: Path, limit_bytes: int = 1 << 30) -> tuple[Path, int, bool]:
    """Write a filler file in `directory` until the filesystem refuses (or `limit_bytes`).
    Returns (the filler, bytes written, whether ENOSPC was met). Delete the filler to free."""
    filler = directory / "jepsen-filler"
    written = 0
    enospc = False
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            chunk = b"\0" * size
            while written < limit_bytes:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    enospc = True
                    break
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return filler, written, enospc


def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a tmpfs of `size` at `where` (root only). Raises RuntimeError with the reason."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs at {where}: {proc.stderr.strip()}")


def umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def replace_lock_file(directory: Path, shard: int) -> int | None:
    """The lock fault: unlink `shard-N/.lock` (its holder keeps its flock on the old inode)
    and create a fresh one, so the next locker locks a different inode under the same name.
    Returns the new inode number, or None when there was no lock file."""
    lock = directory / f"shard-{shard}" / ".lock"
    try:
        old = lock.stat().st_ino
        lock.unlink()
    except FileNotFoundError:
        return None
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        new = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    return new if new != old else None
