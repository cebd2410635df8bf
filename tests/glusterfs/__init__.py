"""A real GlusterFS volume mounted twice on this host, for tests: two FUSE mounts of one volume
stand in for two hosts (each mount is its own gluster client, so flock, rename and appends go
through the bricks as they would between hosts).

The mounts come from GLUSTER_MOUNT_A / GLUSTER_MOUNT_B (`.ci/run` sets them from
`tests/glusterfs/up.sh`). When they are unset and this process is root with GlusterFS
installed, the `gluster_volume` fixture (tests/conftest.py) runs up.sh itself and down.sh at
the end of the session, so a developer's `make test` covers GlusterFS too; SNERD_GLUSTER_AUTO=0
turns that off.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
UP = HERE / "up.sh"
DOWN = HERE / "down.sh"

#: What up.sh may take from nothing (glusterd, volume, two mounts: ~3 s here).
UP_TIMEOUT_S = 180
DOWN_TIMEOUT_S = 180
#: Where up.sh mounts by default (it reports them; these are only used to tell whether a
#: volume is up already without having been exported).
DEFAULT_A = Path("/mnt/snerd-test-a")
DEFAULT_B = Path("/mnt/snerd-test-b")


@dataclass(frozen=True, slots=True)
class GlusterVolume:
    """Two mount points of one GlusterFS volume."""

    a: Path
    b: Path
    #: Whether this session brought it up (and so takes it down).
    started_here: bool = False


def gluster_source(mount_point: Path) -> str | None:
    """The source (`host:/volume`) of the GlusterFS FUSE mount at exactly `mount_point`, or
    None when nothing of that type is mounted there (read from /proc/self/mounts)."""
    target = os.path.realpath(mount_point)
    found = None
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                where = fields[1].replace("\\040", " ")
                if where == target:
                    found = fields[0] if fields[2] == "fuse.glusterfs" else None
    except OSError:
        return None
    return found


def check_pair(a: Path, b: Path) -> str | None:
    """Why `a` and `b` are not two live mounts of one GlusterFS volume, or None when they are."""
    sources = []
    for name, mp in (("GLUSTER_MOUNT_A", a), ("GLUSTER_MOUNT_B", b)):
        source = gluster_source(mp)
        if source is None:
            return f"{name}={mp} is not a GlusterFS (fuse.glusterfs) mount"
        sources.append(source)
    if os.path.realpath(a) == os.path.realpath(b):
        return f"GLUSTER_MOUNT_A and GLUSTER_MOUNT_B are the same mount point {a}"
    if sources[0] != sources[1]:
        return f"{a} mounts {sources[0]} but {b} mounts {sources[1]}: not one volume"
    for mp in (a, b):
        try:
            os.stat(mp)
        except OSError as exc:  # ENOTCONN: its client is gone
            return f"the GlusterFS mount {mp} does not answer: {exc}"
    return None


def _parse_assignments(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(GLUSTER_[A-Z_]+)=(.*)$", text, flags=re.M))


def bring_up() -> tuple[GlusterVolume | None, str]:
    """Run up.sh when it can work here (root, GlusterFS installed): the volume, or why not."""
    if os.environ.get("SNERD_GLUSTER_AUTO") == "0":
        return None, "GLUSTER_MOUNT_A/GLUSTER_MOUNT_B are unset (and SNERD_GLUSTER_AUTO=0)"
    if os.geteuid() != 0:
        return None, (
            "GLUSTER_MOUNT_A/GLUSTER_MOUNT_B are unset, and bringing a volume up "
            "(tests/glusterfs/up.sh) needs root"
        )
    missing = [t for t in ("glusterd", "gluster", "glusterfs") if shutil.which(t) is None]
    if missing:
        return None, (
            f"GLUSTER_MOUNT_A/GLUSTER_MOUNT_B are unset and GlusterFS is not installed "
            f"({', '.join(missing)} missing; apt-get install --no-install-recommends "
            f"glusterfs-server glusterfs-client)"
        )
    if check_pair(DEFAULT_A, DEFAULT_B) is None:  # up already, just not exported
        return GlusterVolume(DEFAULT_A, DEFAULT_B), ""
    try:
        proc = subprocess.run(
            ["bash", str(UP)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"tests/glusterfs/up.sh did not finish within {UP_TIMEOUT_S} s"
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        return None, f"tests/glusterfs/up.sh failed (exit {proc.returncode}): {tail}"
    env = _parse_assignments(proc.stdout)
    try:
        volume = GlusterVolume(
            Path(env["GLUSTER_MOUNT_A"]), Path(env["GLUSTER_MOUNT_B"]), started_here=True
        )
    except KeyError:
        return None, f"tests/glusterfs/up.sh printed no mount points: {proc.stdout!r}"
    return volume, ""


def take_down() -> None:
    """down.sh --purge: what bring_up started (its test directories go with the volume)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ["bash", str(DOWN), "--purge"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=DOWN_TIMEOUT_S,
            check=False,
        )


def find_volume() -> tuple[GlusterVolume | None, str]:
    """The volume the environment names, or one brought up here, or why there is none."""
    a, b = os.environ.get("GLUSTER_MOUNT_A"), os.environ.get("GLUSTER_MOUNT_B")
    if a and b:
        why = check_pair(Path(a), Path(b))
        return (None, why) if why else (GlusterVolume(Path(a), Path(b)), "")
    if a or b:
        return None, "only one of GLUSTER_MOUNT_A and GLUSTER_MOUNT_B is set"
    return bring_up()


_counter = itertools.count()


@contextlib.contextmanager
def fresh_directory(volume: GlusterVolume, name: str) -> Iterator[tuple[Path, Path]]:
    """A new, empty directory on the volume: its path through mount A and through mount B.
    Removed afterwards (through A)."""
    leaf = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:60]
    rel = f"snerd-tests/{os.getpid()}-{next(_counter)}-{leaf}"
    in_a, in_b = volume.a / rel, volume.b / rel
    if in_a.exists():
        shutil.rmtree(in_a)
    in_a.mkdir(parents=True)
    deadline = time.monotonic() + 10
    while not in_b.is_dir():  # with the strict cache profile it is there at once
        if time.monotonic() > deadline:
            raise AssertionError(f"{in_a} made through mount A is not seen as {in_b}")
        time.sleep(0.05)
    try:
        yield in_a, in_b
    finally:
        shutil.rmtree(in_a, ignore_errors=True)
