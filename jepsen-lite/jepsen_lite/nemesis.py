"""Low-level fault tools, each able to tell whether it took effect: process state, the clock
file, filling and freeing a filesystem, small tmpfs and loop-device (ext4) mounts, lock-file
replacement, signals turned into a clean exit, and for GlusterFS a client's network link (a
partition), the volume's lock options, and the brick's POSIX locks on a file (clear-locks, with
a probe of the lock from another mount).

The faults themselves, what counts as proof that each took, and their names, are
`jepsen_lite.faults`'s; nothing here lists them."""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "FILLABLE_FS",
    "GONE",
    "GlusterControl",
    "LoopFs",
    "Machine",
    "Probe",
    "Signals",
    "brick_log",
    "clear_posix_locks",
    "exit_on_signals",
    "fill_filesystem",
    "free_bytes",
    "gluster",
    "loop_tools_missing",
    "mount_loop",
    "mount_tmpfs",
    "mounted_fstype",
    "probe_lock",
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

#: The filesystems `disk-full` can fill: ones the run made for itself, small.
FILLABLE_FS = ("tmpfs", "loop")


def _state_of(stat: str) -> str:
    """The state letter of a `/proc/<pid>/stat` line (after the command name's `)`)."""
    return stat.rpartition(")")[2].split()[0]


def process_state(pid: int) -> str | None:
    """The state letter of `pid` in /proc (`R`, `S`, `T` stopped, `Z` zombie...), or None when
    there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return _state_of(text)


def _poll_state(
    read: Callable[[], str | None], done: Callable[[str | None], bool], timeout: float, step: float
) -> str | None:
    """Read a state until `done` says so or `timeout` s passed; the state seen last."""
    end = time.monotonic() + timeout
    state = read()
    while not done(state) and time.monotonic() < end:
        time.sleep(step)
        state = read()
    return state


def wait_state(pid: int, states: str, timeout: float) -> str | None:
    """Poll until `pid` is in one of `states` (letters); the state seen last."""
    return _poll_state(
        lambda: process_state(pid), lambda s: s is None or s in states, timeout, 0.01
    )


#: The states of a process that is gone (a zombie has exited; nobody reaped it yet).
GONE = (None, "Z", "X")


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until `pid` is gone or a zombie; whether it is."""
    return _poll_state(lambda: process_state(pid), lambda s: s in GONE, timeout, 0.02) in GONE


@dataclass(frozen=True, slots=True)
class Machine:
    """Where a node's worker and daemon run, and how the nemesis reaches their processes:
    this host (`launcher` empty: `os.kill`, `/proc`, the clock file written here), or another
    host through a command template (`--remote`, e.g. `ssh -o BatchMode=yes {host}`) that is
    given one more argument, a command line for a POSIX shell on that host (as ssh runs it).
    There a signal is `kill -SIG PID`, a process state a read of `/proc/PID/stat`, a clock
    step a rewrite of the daemon's clock file (`mv` of a temporary file), each bounded in time.
    A state that cannot be read (the launcher failed) is `?`: neither running nor gone."""

    name: str = ""
    launcher: tuple[str, ...] = ()

    @property
    def remote(self) -> bool:
        return bool(self.launcher)

    @property
    def label(self) -> str:
        return self.name or "local"

    def command(self, script: str) -> list[str]:
        """The argv that runs the shell command line `script` on this machine."""
        return [*self.launcher, script] if self.launcher else ["sh", "-c", script]

    def run(self, script: str, timeout: float = 15.0) -> tuple[int, str]:
        """Run `script` there, bounded: (exit status, stdout); -1 when it did not finish."""
        code, out, _err = _bounded(self.command(script), timeout)
        return (-1 if code is None else code), out

    def state(self, pid: int) -> str | None:
        if not self.remote:
            return process_state(pid)
        code, out = self.run(
            f"if [ -r /proc/{pid}/stat ]; then cat /proc/{pid}/stat; else echo GONE; fi"
        )
        out = out.strip()
        if out == "GONE":
            return None
        return _state_of(out) if code == 0 and ")" in out else "?"

    def signal(self, pid: int, sig: signal.Signals) -> bool:
        """Send `sig` to `pid` there; whether it was delivered."""
        if not self.remote:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return False
            return True
        return self.run(f"kill -{sig.name[3:]} {pid}")[0] == 0

    def wait_state(self, pid: int, states: str, timeout: float) -> str | None:
        if not self.remote:
            return wait_state(pid, states, timeout)
        return _poll_state(
            lambda: self.state(pid), lambda s: s is None or s in states, timeout, 0.1
        )

    def wait_gone(self, pid: int, timeout: float) -> bool:
        if not self.remote:
            return wait_gone(pid, timeout)
        return _poll_state(lambda: self.state(pid), lambda s: s in GONE, timeout, 0.1) in GONE

    def kill_if_alive(self, pid: int | None) -> None:
        """SIGCONT (a stopped process would not die yet) and SIGKILL, unless already gone."""
        if pid and self.state(pid) not in GONE:
            self.signal(pid, signal.SIGCONT)
            self.signal(pid, signal.SIGKILL)

    def write_clock(self, path: Path, offset_s: float) -> bool:
        """Set the daemon's SNERD_TEST_CLOCK_FILE at `path` (on this machine) to `offset_s`."""
        if not self.remote:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_clock_file(path, offset_s)
            return True
        q = shlex.quote
        tmp = path.with_suffix(".tmp")
        return (
            self.run(
                f"mkdir -p {q(str(path.parent))} && printf '%s\\n' {offset_s:.6f} > "
                f"{q(str(tmp))} && mv -f {q(str(tmp))} {q(str(path))}"
            )[0]
            == 0
        )

    def remove_tree(self, path: Path) -> None:
        """`rm -rf path` there (the run's clock files of a remote machine)."""
        if self.remote:
            self.run(f"rm -rf {shlex.quote(str(path))}")


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


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer could still write on the filesystem of `directory`
    (statvfs: f_bavail x f_frsize), or None when it cannot be read."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# ---------------------------------------------------------------------------- loop device

#: Tools a loop-mounted ext4 needs (besides root and /dev/loop-control).
LOOP_TOOLS = ("mkfs.ext4", "losetup", "mount", "umount")


def loop_tools_missing() -> str | None:
    """Why a small ext4 on a loop device cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "a loop-mounted ext4 needs root"
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [t for t in LOOP_TOOLS if shutil.which(t, path=path) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: e2fsprogs, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop devices not available)"
    return None


def _bounded(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[int | None, str, str]:
    """Run `cmd` (stdin empty), bounded: (exit status, stdout, stderr); the status is None when
    it did not finish within `timeout` s, -1 when it could not be started (stderr says why)."""
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, "", f"{' '.join(cmd)}: no answer within {timeout:g} s"
    except OSError as exc:
        return -1, "", f"{cmd[0]}: {exc}"
    return proc.returncode, proc.stdout, proc.stderr


def _tool(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run a tool (found in /usr/sbin and /sbin too), bounded: (exit status, stdout + stderr);
    -1 when it timed out or could not be started."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]),
    }
    code, out, err = _bounded(cmd, timeout, env)
    return (-1 if code is None else code), (out + err).strip()


def mounted_fstype(where: Path) -> str | None:
    """The filesystem type mounted at `where` (from /proc/self/mounts), or None."""
    target = os.path.realpath(where)
    fstype = None
    with contextlib.suppress(OSError), open("/proc/self/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1].replace("\\040", " ") == target:
                fstype = parts[2]  # the last mount on a point is the one seen
    return fstype


def _loop_devices(image: Path) -> list[str]:
    """The loop devices backed by `image` (`losetup -j`)."""
    code, out = _tool(["losetup", "-j", str(image)], 10)
    if code != 0:
        return []
    return [line.split(":", 1)[0] for line in out.splitlines() if line.startswith("/dev/")]


#: Loop filesystems not yet cleaned up: the atexit hook's last resort.
_LIVE_LOOPS: list[LoopFs] = []


@dataclass(slots=True, eq=False)
class LoopFs:
    """A small ext4 in a file-backed image, loop-mounted at `mountpoint` (see `mount_loop`).
    `cleanup` unmounts it, detaches its loop device and deletes the image; it is idempotent,
    bounded in time, and also run at interpreter exit while the mount is live."""

    image: Path
    mountpoint: Path
    size_mib: int
    device: str | None = None
    #: What each step did, in order (reported by the run).
    steps: list[str] = field(default_factory=list)
    cleaned: bool = False

    def cleanup(self) -> list[str]:
        """Unmount (lazily if still busy after 5 s), detach, delete the image. Returns the
        problems met (empty when everything is gone)."""
        if self.cleaned:
            return []
        problems: list[str] = []
        if mounted_fstype(self.mountpoint) is not None:
            end = time.monotonic() + 5.0
            code, out = _tool(["umount", str(self.mountpoint)], 30)
            while code != 0 and time.monotonic() < end:  # busy: a daemon still exiting
                time.sleep(0.2)
                code, out = _tool(["umount", str(self.mountpoint)], 30)
            if code != 0:
                self.steps.append(f"umount: {out}; lazily then")
                code, out = _tool(["umount", "-l", str(self.mountpoint)], 30)
            if code != 0 or mounted_fstype(self.mountpoint) is not None:
                problems.append(f"cannot unmount {self.mountpoint}: {out}")
            else:
                self.steps.append(f"unmounted {self.mountpoint}")
        for dev in _loop_devices(self.image):
            code, out = _tool(["losetup", "-d", dev], 30)
            if code != 0:
                problems.append(f"cannot detach {dev}: {out}")
            else:
                self.steps.append(f"detached {dev}")
        try:
            self.image.unlink()
            self.steps.append(f"deleted {self.image}")
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"cannot delete {self.image}: {exc}")
        self.cleaned = True
        with contextlib.suppress(ValueError):
            _LIVE_LOOPS.remove(self)
        return problems


def _cleanup_live_loops() -> None:
    for fs in list(_LIVE_LOOPS):
        for problem in fs.cleanup():
            sys.stderr.write(f"jepsen-lite: at exit: {problem}\n")


atexit.register(_cleanup_live_loops)


def mount_loop(image: Path, where: Path, size_mib: int = 64) -> LoopFs:
    """Make a `size_mib` MiB ext4 in the file `image` (space allocated up front, so the image
    cannot itself hit a full disk later), and loop-mount it at `where` (root only). Every step
    is bounded; on any failure what was made is undone and RuntimeError says why. The returned
    LoopFs is cleaned at interpreter exit if the caller does not clean it first."""
    why = loop_tools_missing()
    if why:
        raise RuntimeError(why)
    where.mkdir(parents=True, exist_ok=True)
    fs = LoopFs(image=image, mountpoint=where, size_mib=size_mib)
    _LIVE_LOOPS.append(fs)
    try:
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size_mib << 20)
        finally:
            os.close(fd)
        fs.steps.append(f"image {image} of {size_mib} MiB")
        # -m 0: no blocks reserved for root (the daemons run as root: they would use them);
        # nodiscard: mkfs must not punch holes into the allocated image.
        code, out = _tool(
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", "-L", "jepsen", str(image)], 60
        )
        if code != 0:
            raise RuntimeError(f"mkfs.ext4 {image}: {out}")
        fs.steps.append("mkfs.ext4")
        # -o loop: mount attaches a free loop device (auto-cleared when unmounted).
        code, out = _tool(["mount", "-t", "ext4", "-o", "loop", str(image), str(where)], 30)
        if code != 0:
            raise RuntimeError(f"mount -o loop {image} {where}: {out}")
        devices = _loop_devices(image)
        fs.device = devices[0] if devices else None
        fstype = mounted_fstype(where)
        if fstype != "ext4":
            raise RuntimeError(f"{where}: mounted as {fstype}, not ext4")
        fs.steps.append(f"mounted {fs.device} at {where}")
    except BaseException:
        fs.cleanup()
        raise
    return fs


@dataclass(slots=True)
class Signals:
    """What `exit_on_signals` saw: the signal that came (None so far), and a hook that, while
    set, is called instead of raising (an asyncio run sets it to cancel its main task, so its
    own `finally` blocks run in order: raising inside a running event loop would leave its
    tasks to be torn down blindly)."""

    signum: int | None = None
    on_signal: Callable[[], None] | None = None


@contextlib.contextmanager
def exit_on_signals(
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[Signals]:
    """While inside, SIGTERM and SIGHUP end the run as Ctrl-C does: `Signals.on_signal` is
    called if set, else SystemExit(128 + signal) is raised in the main thread, so the run's
    `finally` blocks (processes killed, mounts undone) and atexit hooks run instead of the
    process just dying. Handlers somebody else installed, and calls from other threads, are
    left alone."""
    import threading

    state = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        state.signum = signum
        if state.on_signal is not None:
            state.on_signal()
            return
        raise SystemExit(128 + signum)

    previous: dict[int, Any] = {}
    for sig in signals:
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def replace_lock_file(directory: Path, shard: int) -> int | None:
    """The lock fault: unlink `shard-N/.lock` (its holder keeps its flock on the old inode)
    and create a fresh one with the same text (holder, claim epoch), so the next locker locks
    a different inode under the same name and reads what the holder wrote: a lock that no
    longer excludes anyone, as on a filesystem whose locks lie. Returns the new inode number,
    or None when there was no lock file."""
    lock = directory / f"shard-{shard}" / ".lock"
    try:
        old = lock.stat().st_ino
        text = lock.read_bytes()
        lock.unlink()
    except FileNotFoundError:
        return None
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, text)
        new = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    return new if new != old else None


# ---------------------------------------------------------------------------- GlusterFS


@dataclass(frozen=True, slots=True)
class GlusterControl:
    """How to reach the GlusterFS volume of a run: its name and glusterd's CLI socket (for
    `gluster volume set/get`), and, for the partition nemesis, the server-side veth of mount
    A's client (`tests/support/glusterfs/up.sh` with SNERD_GLUSTER_NETNS=1 prints them) and
    the command that repairs the setup when a mount does not come back (up.sh again: it
    re-applies links and routes and remounts a client that gave up)."""

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
    return _tool([*cmd, *args], timeout)


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
    code, out = _tool(cmd, 30)
    return code == 0, out


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


def clear_posix_locks(ctl: GlusterControl, path: str) -> tuple[int, str, int | None]:
    """`gluster volume clear-locks VOL PATH kind all posix`: the brick forgets every POSIX lock
    (granted or waiting) on the file at `path` (from the volume's root, starting with `/`).
    A FUSE flock is one of those (the FUSE bridge sends it as a whole-file POSIX lock). Its
    holder is not told: its client still believes it holds the lock. Returns (exit status,
    the CLI's output, the number of granted locks the brick says it cleared or None)."""
    code, out = gluster(ctl, "volume", "clear-locks", ctl.volume, path, "kind", "all", "posix")
    granted = None
    for line in out.splitlines():
        if "posix" in line and "granted locks=" in line:
            with contextlib.suppress(ValueError):
                granted = (granted or 0) + int(line.rsplit("granted locks=", 1)[1].split()[0])
    if code == 0 and granted is None and "No locks cleared" in out:
        granted = 0
    return code, out, granted


def probe_lock(path: Path, timeout: float = 15.0) -> str:
    """Try the shard lock at `path` the way a daemon's startup probe does (snerd's
    `lockprobe.py` in a fresh interpreter: flock LOCK_EX|LOCK_NB, released at once): `BLOCKED`
    (someone holds it), `ACQUIRED` (it was free), `FAILED: why`, or `timeout`."""
    from snerd.io import lockprobe

    code, _out, err = _bounded([sys.executable, "-I", "-S", lockprobe.__file__, str(path)], timeout)
    if code is None:
        return "timeout"
    if code == lockprobe.BLOCKED:
        return "BLOCKED"
    if code == lockprobe.ACQUIRED:
        return "ACQUIRED"
    return f"FAILED: {err.strip() or f'exit {code}'}"
