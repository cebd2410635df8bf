"""What filesystem a data directory lives on, and whether flock there proves liveness.

On a local filesystem a flock is released by the kernel the moment its holder dies, so a daemon
that can take `shard-N/.lock` knows the previous owner's process is gone (DESIGN §4.8). On a
network filesystem a lock can outlive a partitioned holder or be lost by a live one, so there
only the lease decides. Mount types are read from /proc/self/mountinfo (proc(5)).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCAL_FILESYSTEMS", "filesystem_type", "lock_proves_liveness"]

#: Filesystems on which the kernel that runs every daemon also holds every lock.
LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs",
     "jfs", "reiserfs", "bcachefs"}
)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape")


def filesystem_type(path: Path) -> str:
    """The type of the filesystem `path` is on (`ext4`, `fuse.glusterfs`, `nfs4`, ...), or
    `unknown` when /proc is not there."""
    target = os.path.realpath(path)
    best, best_type = "", "unknown"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return best_type
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount_point = _unescape(fields[4])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, right.split()[0]
    return best_type


def lock_proves_liveness(path: Path) -> bool:
    """True when holding a flock on `path`'s filesystem proves the last holder is gone."""
    return filesystem_type(path) in LOCAL_FILESYSTEMS
