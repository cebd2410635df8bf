"""Low-level fault tools, each able to tell whether it took effect: process state, the clock
file, filling and freeing a filesystem, small tmpfs mounts, lock-file replacement, and for
GlusterFS a client's network link (a partition) and the volume's lock options."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "GLUSTER_NEMESES",
    "NEMESES",
    "GlusterControl",
    "Probe",
    "brick_log",
    "fill_filesystem",
    "gluster",
    "mount_tmpfs",
    "probe_stat",
    "process_state",
    "replace_lock_file",
    "set_link",
    "umount",
    "volume_option",
    "wait_gone",
    "wait_state",
    "write_clock_file",
]

#: Every nemesis name the command line accepts.
NEMESES = ("kill", "pause", "clock", "disk-full", "lock-fault", "partition", "monkey-unlock")
#: Those that need --fs glusterfs (a volume this run can reconfigure or cut off).
GLUSTER_NEMESES = ("partition", "monkey-unlock")


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


# ---------------------------------------------------------------------------- GlusterFS


@dataclass(frozen=True, slots=True)
class GlusterControl:
    """How to reach the GlusterFS volume of a run: its name and glusterd's CLI socket (for
    `gluster volume set/get`), and, for the partition nemesis, the server-side veth of mount
    A's client (`tests/glusterfs/up.sh` with SNERD_GLUSTER_NETNS=1 prints them) and the command
    that repairs the setup when a mount does not come back (up.sh again: it re-applies links
    and routes and remounts a client that gave up)."""

    volume: str
    mount_a: Path
    sock: str | None = None
    netns_srv: str | None = None
    link_a: str | None = None
    repair: tuple[str, ...] = ()
    repair_env: tuple[tuple[str, str], ...] = ()


def gluster(ctl: GlusterControl, *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run the gluster CLI against the run's glusterd: (exit status, stdout + stderr)."""
    cmd = ["gluster", "--mode=script"]
    if ctl.sock:
        cmd.append(f"--glusterd-sock={ctl.sock}")
        cmd.append(f"--log-file=/var/log/glusterfs/{ctl.volume}-cli.log")
    try:
        proc = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return -1, f"gluster {' '.join(args)}: no answer within {timeout:g} s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def volume_option(ctl: GlusterControl, key: str) -> str | None:
    """The value glusterd holds for a volume option (`volume get`), first word only ("on",
    "10", "off" of "off (DEFAULT)"), or None when it cannot be read."""
    code, out = gluster(ctl, "volume", "get", ctl.volume, key, timeout=30)
    if code != 0:
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == key:
            return fields[1]
    return None


def brick_log(ctl: GlusterControl) -> Path | None:
    """The log file of the volume's (first) brick process: glusterfsd logs to
    /var/log/glusterfs/bricks/<brick path, slashes as dashes>.log."""
    code, out = gluster(ctl, "volume", "info", ctl.volume, timeout=30)
    if code != 0:
        return None
    for line in out.splitlines():
        if line.startswith("Brick1:"):
            path = line.split(":", 2)[-1].strip()
            log = Path("/var/log/glusterfs/bricks") / (path.strip("/").replace("/", "-") + ".log")
            return log if log.exists() else None
    return None


def set_link(ctl: GlusterControl, up: bool) -> tuple[bool, str]:
    """Set the server-side veth of mount A's client down (the partition) or up (the heal)."""
    if not (ctl.netns_srv and ctl.link_a):
        return False, "no network namespace set up for mount A's client"
    cmd = ["ip", "-n", ctl.netns_srv, "link", "set", ctl.link_a, "up" if up else "down"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return False, f"{' '.join(cmd)}: timed out"
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


@dataclass(slots=True)
class Probe:
    """One stat of a path in a child process. A stat blocked on a cut-off FUSE mount cannot be
    killed until the client gives up (network.ping-timeout), so a probe is never killed: it is
    read when it finishes, or reported `blocked` after its limit and reaped later."""

    proc: subprocess.Popen[str]
    started: float

    def result(self, limit: float) -> str:
        """`ok`, an errno name (`ENOTCONN`...), or `blocked` when not done within `limit` s of
        its start."""
        try:
            out, _err = self.proc.communicate(
                timeout=max(0.0, self.started + limit - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            return "blocked"
        return out.strip() or f"exit {self.proc.returncode}"

    def reap(self, limit: float) -> bool:
        """Wait up to `limit` s for the child to end; whether it did."""
        try:
            self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return False
        return True


_STAT = (
    "import errno, os, sys\n"
    "try:\n"
    "    os.stat(sys.argv[1])\n"
    "    print('ok')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode.get(e.errno, str(e.errno)))\n"
)


def probe_stat(path: Path) -> Probe:
    """Start a stat of `path` in a child process (see Probe)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STAT, str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return Probe(proc, time.monotonic())
