"""What filesystem a data directory lives on, whether snerd may run there, and whether flock
there proves liveness.

Owns the startup self-check (docs/deployment.md, "Filesystems" and
"The lock probe"): the mount type and options from /proc/self/mountinfo (proc(5)), a verdict on them, and a
two-process lock probe. The verdict is a pure function of the mount's type, options and FUSE
subtype (`judge_filesystem`), so every case is tested without mounts; the rest only reads
files and runs the probe process. It must never unlink a lock file, and never print: the
daemon's shell decides what to say.

On a local filesystem a flock is released by the kernel the moment its holder dies, so a daemon
that can take `shard-N/.lock` knows the previous owner's process is gone (docs/architecture.md, "Single-host takeover (proven dead)"). On a
network filesystem a lock can outlive a partitioned holder or be lost by a live one, so there
only the lease decides.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from snerd.config import MOUNTINFO
from snerd.io import lockprobe
from snerd.io.files import open_file

__all__ = [
    "LOCAL_FILESYSTEMS",
    "LOCK_PROBE",
    "MOUNTINFO",
    "FilesystemRefused",
    "LockProbe",
    "Mount",
    "ProbeOutcome",
    "Verdict",
    "check_data_directory",
    "filesystem_type",
    "find_mount",
    "judge_filesystem",
    "judge_lock_probe",
    "lock_proves_liveness",
    "other_process_tries_lock",
    "probe_lock_exclusion",
]

#: Filesystems on which the kernel that runs every daemon also holds every lock.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs",
     "jfs", "reiserfs", "bcachefs"}
)

#: The probe's lock file in the data directory; permanent, like every snerd lock file.
LOCK_PROBE = ".lockprobe"

#: How long the probe process may take before the probe counts as failed. A `hard` NFS mount
#: whose server is gone makes syscalls hang rather than fail (nfs(5)).
_PROBE_TIMEOUT_S = 10.0

_SMB = frozenset({"cifs", "smb3", "smbfs"})
#: FUSE subtypes of remote object stores and sftp: their flock only excludes processes on this
#: host (the kernel handles it locally when the FUSE server does not, fuse(4)), and rename is
#: a copy-then-delete or not atomic across hosts. `blobfuse` and `blobfuse2` match by prefix.
_FUSE_OBJECT_STORES = frozenset({"s3fs", "gcsfuse", "goofys", "rclone", "sshfs", "mountpoint-s3"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Mount:
    """One line of /proc/self/mountinfo: the mount that holds a path."""

    #: Where it is mounted (`/`, `/mnt/queue`).
    mount_point: str
    #: The type as the kernel names it: `ext4`, `nfs4`, `fuse.glusterfs`.
    fs_type: str
    #: The mount source: a device, `server:/export`, `host:/volume`.
    source: str
    #: Per-mount options, then the superblock options (`vers=4.2`, `local_lock=none`, `flock`).
    options: tuple[str, ...]
    #: For a FUSE mount, what serves it (`glusterfs`, `s3fs`), when the table says; else None.
    fuse_subtype: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Whether snerd may run on a filesystem."""

    #: `ok`: run quietly; `warn`: run and say `reason`; `refuse`: exit 2 unless forced.
    kind: Literal["ok", "warn", "refuse"]
    #: For people: what is wrong and what to do.
    reason: str = ""


_OK = Verdict(kind="ok")


#: What a lock probe can see; see LockProbe.outcome.
ProbeOutcome = Literal["excluded", "held_elsewhere", "not_excluded", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LockProbe:
    """What the two-process lock probe saw."""

    #: `excluded`: a second process could not take the lock this one held (as it must);
    #: `held_elsewhere`: another process (another daemon's probe) held it already, which is
    #: exclusion too; `not_excluded`: the second process got the lock; `failed`: open, flock
    #: or the probe process failed (`detail` says how).
    outcome: ProbeOutcome
    #: The probe file.
    path: str
    detail: str = ""
    #: Wall time the probe took, in seconds.
    elapsed_s: float = 0.0


class FilesystemRefused(RuntimeError):
    """The data directory is on a filesystem where snerd's locks or renames cannot be trusted
    (and the check was not forced). The message names the filesystem, its mount and why."""


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape")


def _fuse_subtype(fs_type: str, source: str) -> str | None:
    # The kernel shows a FUSE mount with a subtype as `fuse.<subtype>` (or `fuseblk.<subtype>`).
    # Without one it shows plain `fuse`; old mount helpers then put `<subtype>#<what>` in the
    # source (`sshfs#user@host:/dir`).
    base, dot, sub = fs_type.partition(".")
    if base not in ("fuse", "fuseblk"):
        return None
    if dot:
        return sub or None
    prog, hash_, _ = source.partition("#")
    return prog if hash_ and prog else None


def find_mount(path: Path, mountinfo: str = MOUNTINFO) -> Mount | None:
    """The mount that holds `path` (the longest mount point containing it; the last one of
    equal length, which is the one on top), or None when `mountinfo` cannot be read."""
    target = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    best: Mount | None = None
    for line in lines:
        # proc(5): ID PARENT MAJ:MIN ROOT MOUNT_POINT MOUNT_OPTIONS [OPTIONAL...] - TYPE SOURCE
        # SUPER_OPTIONS
        left, _, right = line.partition(" - ")
        fields = left.split()
        tail = right.split()
        if len(fields) < 6 or not tail:
            continue
        mount_point = _unescape(fields[4])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if not inside or (best is not None and len(mount_point) < len(best.mount_point)):
            continue
        fs_type = tail[0]
        source = _unescape(tail[1]) if len(tail) > 1 else ""
        options = tuple(o for o in fields[5].split(",") if o)
        if len(tail) > 2:
            options += tuple(o for o in tail[2].split(",") if o)
        best = Mount(
            mount_point=mount_point,
            fs_type=fs_type,
            source=source,
            options=options,
            fuse_subtype=_fuse_subtype(fs_type, source),
        )
    return best


def filesystem_type(path: Path, mountinfo: str = MOUNTINFO) -> str:
    """The type of the filesystem `path` is on (`ext4`, `fuse.glusterfs`, `nfs4`, ...), or
    `unknown` when /proc is not there."""
    mount = find_mount(path, mountinfo)
    return "unknown" if mount is None else mount.fs_type


def lock_proves_liveness(path: Path, mountinfo: str = MOUNTINFO) -> bool:
    """True when holding a flock on `path`'s filesystem proves the last holder is gone."""
    return filesystem_type(path, mountinfo) in LOCAL_FILESYSTEMS


def _parse_options(options: Iterable[str]) -> dict[str, str]:
    # Later ones win: the superblock options come after the per-mount ones.
    parsed: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        parsed[key.strip()] = value.strip()
    return parsed


def _judge_nfs(fs_type: str, opts: dict[str, str]) -> Verdict:
    vers = opts.get("vers") or opts.get("nfsvers") or ""
    v4 = fs_type == "nfs4" or vers.startswith("4")
    local_lock = opts.get("local_lock", "none")
    fix = "mount with vers=4.1 (or 4.2) and local_lock=none"
    if "nolock" in opts or local_lock in ("flock", "all"):
        why = "nolock" if "nolock" in opts else f"local_lock={local_lock}"
        return Verdict(
            kind="refuse",
            reason=(
                f"{why}: flock only excludes processes on this host (nfs(5)), so daemons on "
                f"two hosts would both own a shard; {fix}"
            ),
        )
    if not v4:
        return Verdict(
            kind="refuse",
            reason=(
                f"NFSv{vers or '2/3'}: its locks depend on the separate NLM/statd services and "
                f"a lock lost in a partition is not reported to its holder, so flock is not "
                f"coherent across hosts; {fix}"
            ),
        )
    if local_lock != "none":
        return Verdict(
            kind="warn",
            reason=(
                f"local_lock={local_lock}: some locks on this mount are local to this host "
                f"(nfs(5)); snerd's flock still goes to the server, but local_lock=none is "
                f"the supported setting"
            ),
        )
    return _OK


def _judge_glusterfs(source: str) -> Verdict:
    volume = source.rpartition(":")[2].strip("/") or "VOL"
    return Verdict(
        kind="warn",
        reason=(
            "GlusterFS: flock is cluster-wide, but a lock lost while this client is cut off is "
            "reported to its holder only with client.strict-locks on (GlusterFS >= 8; off by "
            "default), which cannot be read from the mount. Check with "
            f"`gluster volume get {volume} client.strict-locks` and set it with "
            f"`gluster volume set {volume} client.strict-locks on`; see docs/deployment.md"
        ),
    )


def _judge_lustre(opts: dict[str, str]) -> Verdict:
    for bad in ("noflock", "localflock"):
        if bad in opts:
            what = "flock fails with ENOSYS" if bad == "noflock" else "flock is node-local"
            return Verdict(
                kind="refuse",
                reason=f"Lustre mounted {bad}: {what} (mount.lustre(8)); mount with -o flock",
            )
    if "flock" not in opts:
        return Verdict(
            kind="warn",
            reason=(
                "Lustre without the flock mount option: flock is coherent only among "
                "clients that all mount with flock (the default only since Lustre 2.12.3); "
                "mount every client with -o flock"
            ),
        )
    return _OK


def judge_filesystem(
    fs_type: str, options: Iterable[str], fuse_subtype: str | None = None, *, source: str = ""
) -> Verdict:
    """Whether snerd may run on a filesystem of type `fs_type` mounted with `options`.

    `fs_type` is the kernel's name (`nfs4`, `fuse.glusterfs`, or plain `fuse` with the subtype
    in `fuse_subtype`); `source` only makes messages more precise (the Gluster volume name).
    Refused: NFSv2/v3, NFS with host-local flock (`nolock`, `local_lock=flock|all`), SMB/CIFS,
    FUSE object stores and sftp, Lustre with `noflock`/`localflock`. Warned: GlusterFS, NFSv4
    with another `local_lock`, Lustre without `flock`, GPFS, anything unknown.
    """
    opts = _parse_options(options)
    base, _, suffix = fs_type.partition(".")
    if base in ("fuse", "fuseblk"):
        subtype = fuse_subtype or suffix or None
        if subtype == "glusterfs":
            return _judge_glusterfs(source)
        if subtype is not None and (
            subtype in _FUSE_OBJECT_STORES or subtype.startswith("blobfuse")
        ):
            return Verdict(
                kind="refuse",
                reason=(
                    f"{subtype} is a FUSE mount of a remote store without cross-host locks: "
                    f"flock only excludes processes on this host, and rename and append are "
                    f"not atomic across hosts; use a local filesystem, NFSv4 or GlusterFS"
                ),
            )
        return _unknown(f"{base}.{subtype}" if subtype else base)
    if base in LOCAL_FILESYSTEMS:
        return _OK
    if base in ("nfs", "nfs4"):
        return _judge_nfs(base, opts)
    if base in _SMB:
        return Verdict(
            kind="refuse",
            reason=(
                "SMB/CIFS does not give coherent flock and rename across hosts (locks are "
                "mandatory byte-range locks under the client's oplock/lease caching, and a "
                "lost lock is not reported); use a local filesystem, NFSv4 or GlusterFS"
            ),
        )
    if base == "lustre":
        return _judge_lustre(opts)
    if base == "gpfs":
        return Verdict(
            kind="warn",
            reason=(
                "GPFS / Storage Scale: flock(2) has been reported to be node-local there "
                "while fcntl locks are cluster-wide, and snerd locks with flock; before "
                "running daemons on two nodes, check that a flock taken on one node blocks "
                "the other (see docs/deployment.md)"
            ),
        )
    return _unknown(fs_type)


def _unknown(fs_type: str) -> Verdict:
    what = (
        "the filesystem type is unknown (/proc/self/mountinfo is unreadable)"
        if fs_type == "unknown"
        else f"{fs_type} is not a filesystem snerd knows"
    )
    return Verdict(
        kind="warn",
        reason=(
            f"{what}: snerd cannot tell whether flock and rename are coherent across hosts "
            f"here; fine for daemons on this host only (see docs/deployment.md)"
        ),
    )


def probe_lock_exclusion(directory: Path) -> LockProbe:
    """Hold an exclusive flock on `DIR/.lockprobe` and have a second process try it.

    The second process is a fresh interpreter (`-I -S`: no site-packages, ~20 ms to start)
    running `snerd/io/lockprobe.py`. It must not share our open file description, or it would
    share the lock (flock(2)): Popen closes inherited fds (close_fds) and ours is O_CLOEXEC.
    The lock is released and the file kept (lock files are never unlinked).
    """
    path = str(directory / LOCK_PROBE)
    started = time.perf_counter()

    def result(outcome: ProbeOutcome, detail: str = "") -> LockProbe:
        elapsed = time.perf_counter() - started
        return LockProbe(outcome=outcome, path=path, detail=detail, elapsed_s=elapsed)

    try:
        fd = open_file(path, os.O_RDWR | os.O_CREAT, 0o644)  # never through a link
    except OSError as exc:
        return result("failed", f"cannot open {path}: {exc}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another daemon starting at the same moment holds it: that is exclusion too.
            return result("held_elsewhere")
        except OSError as exc:  # ENOLCK (no lock service), ENOSYS (Lustre noflock), ...
            return result("failed", f"flock on {path}: {exc}")
        outcome, detail = other_process_tries_lock(path)
        return result(outcome, detail)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def other_process_tries_lock(path: str) -> tuple[ProbeOutcome, str]:
    """Run `lockprobe.py` on `path` in a new process: `excluded` when its non-blocking flock
    failed with EWOULDBLOCK, `not_excluded` when it got the lock, else `failed` and why."""
    command = [sys.executable, "-I", "-S", lockprobe.__file__, path]
    try:
        proc = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "failed", f"the probe process did not answer within {_PROBE_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return "failed", f"cannot start the probe process {sys.executable!r}: {exc}"
    if proc.returncode == lockprobe.BLOCKED:
        return "excluded", ""
    if proc.returncode == lockprobe.ACQUIRED:
        return "not_excluded", ""
    why = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
    return "failed", f"the probe process failed: {why[0]}"


def judge_lock_probe(probe: LockProbe) -> Verdict:
    """The verdict on a probe: refused when a second process took the lock we held or when
    flock could not be tried at all."""
    if probe.outcome in ("excluded", "held_elsewhere"):
        return _OK
    if probe.outcome == "not_excluded":
        return Verdict(
            kind="refuse",
            reason=(
                f"lock probe: a second process took the flock on {probe.path} while this one "
                f"held it, so flock does not exclude anything on this mount and two daemons "
                f"would own the same shard"
            ),
        )
    return Verdict(kind="refuse", reason=f"lock probe: {probe.detail}")


def _describe(directory: Path, mount: Mount | None) -> str:
    if mount is None:
        return f"data directory {directory} is on an unknown filesystem"
    source = f" from {mount.source}" if mount.source and mount.source != "none" else ""
    return (
        f"data directory {directory} is on {mount.fs_type} "
        f"(mounted at {mount.mount_point}{source})"
    )


def check_data_directory(
    directory: Path, *, force: bool = False, mountinfo: str = MOUNTINFO
) -> tuple[Mount | None, list[str]]:
    """The startup self-check: judge the mount, then run the lock probe.

    Returns the mount (None when the table is unreadable) and the warnings to log. Raises
    FilesystemRefused when either check refuses, unless `force`, which turns refusals into
    warnings. Nothing is printed, and nothing is written but the probe file.
    """
    mount = find_mount(directory, mountinfo)
    where = _describe(directory, mount)
    if mount is None:
        verdict = _unknown("unknown")
    else:
        verdict = judge_filesystem(
            mount.fs_type, mount.options, mount.fuse_subtype, source=mount.source
        )
    warnings: list[str] = []

    def settle(verdict: Verdict) -> None:
        if verdict.kind == "warn":
            warnings.append(f"{where}: {verdict.reason}")
        elif verdict.kind == "refuse" and force:
            warnings.append(
                f"{where}: {verdict.reason}; starting anyway (--force / SNERD_FORCE_FILESYSTEM)"
            )
        elif verdict.kind == "refuse":
            raise FilesystemRefused(
                f"refusing to start: {where}: {verdict.reason}. "
                f"`snerdmq --force` or SNERD_FORCE_FILESYSTEM=1 starts it anyway"
            )

    settle(verdict)  # before the probe: a refused directory gets no probe file either
    settle(judge_lock_probe(probe_lock_exclusion(directory)))
    return mount, warnings
