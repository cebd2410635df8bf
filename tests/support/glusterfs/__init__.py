"""A real GlusterFS volume mounted twice on this host, for tests: two FUSE mounts of one volume
stand in for two hosts (each mount is its own gluster client, so flock, rename and appends go
through the bricks as they would between hosts).

The mounts come from GLUSTER_MOUNT_A / GLUSTER_MOUNT_B (`.ci/run` sets them from
`tests/support/glusterfs/up.sh`). When they are unset and this process is root with GlusterFS
installed, the `gluster_volume` fixture (tests/conftest.py) runs up.sh itself and down.sh at
the end of the session, so a developer's `make test` covers GlusterFS too; SNERD_GLUSTER_AUTO=0
turns that off.

`find_netns_volume` brings up the separate network-namespace setup (`SNERD_GLUSTER_NETNS=1
up.sh`: its own glusterd and volume, mount A's client cut off by a veth link) for the
jepsen-lite partition nemesis; `take_down(netns=True)` removes it with its namespaces.
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
#: The same for SNERD_GLUSTER_NETNS=1.
NETNS_A = Path("/mnt/snerd-test-na")
NETNS_B = Path("/mnt/snerd-test-nb")


@dataclass(frozen=True, slots=True)
class GlusterVolume:
    """Two mount points of one GlusterFS volume."""

    a: Path
    b: Path
    #: Whether this session brought it up (and so takes it down).
    started_here: bool = False
    #: The volume's name.
    name: str = "snerd-test"
    #: The network-namespace setup (SNERD_GLUSTER_NETNS=1): its glusterd's CLI socket, the
    #: server's namespace and the server-side veth of mount A's client.
    netns: bool = False
    sock: str | None = None
    netns_srv: str | None = None
    link_a: str | None = None


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


def _volume_name(mount_point: Path) -> str:
    source = gluster_source(mount_point) or ""
    return source.partition(":/")[2] or "snerd-test"


def _cannot_run_up(what: str) -> str | None:
    """Why up.sh cannot work here (not root, GlusterFS missing), or None."""
    if os.geteuid() != 0:
        return f"{what} (tests/support/glusterfs/up.sh) needs root"
    missing = [t for t in ("glusterd", "gluster", "glusterfs") if shutil.which(t) is None]
    if missing:
        return (
            f"{what} needs GlusterFS ({', '.join(missing)} missing; apt-get install "
            f"--no-install-recommends glusterfs-server glusterfs-client)"
        )
    return None


def _run_up(netns: bool) -> tuple[GlusterVolume | None, str]:
    env = {**os.environ, "SNERD_GLUSTER_NETNS": "1" if netns else "0"}
    for k in ("GLUSTER_MOUNT_A", "GLUSTER_MOUNT_B", "GLUSTER_VOLUME"):
        if netns:  # its own defaults, never the other setup's mounts
            env.pop(k, None)
    name = "tests/support/glusterfs/up.sh"
    if netns:
        name = f"SNERD_GLUSTER_NETNS=1 {name}"
    try:
        proc = subprocess.run(
            ["bash", str(UP)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"{name} did not finish within {UP_TIMEOUT_S} s"
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        return None, f"{name} failed (exit {proc.returncode}): {tail}"
    out = _parse_assignments(proc.stdout)
    try:
        volume = GlusterVolume(
            Path(out["GLUSTER_MOUNT_A"]),
            Path(out["GLUSTER_MOUNT_B"]),
            started_here=True,
            name=out["GLUSTER_VOLUME"],
            netns=netns,
            sock=out.get("GLUSTER_SOCK"),
            netns_srv=out.get("GLUSTER_NETNS_SRV"),
            link_a=out.get("GLUSTER_LINK_A"),
        )
    except KeyError:
        return None, f"{name} printed no mount points: {proc.stdout!r}"
    if netns and not (volume.sock and volume.netns_srv and volume.link_a):
        return None, f"{name} printed no network namespace: {proc.stdout!r}"
    return volume, ""


def bring_up() -> tuple[GlusterVolume | None, str]:
    """Run up.sh when it can work here (root, GlusterFS installed): the volume, or why not."""
    if os.environ.get("SNERD_GLUSTER_AUTO") == "0":
        return None, "GLUSTER_MOUNT_A/GLUSTER_MOUNT_B are unset (and SNERD_GLUSTER_AUTO=0)"
    why = _cannot_run_up("GLUSTER_MOUNT_A/GLUSTER_MOUNT_B are unset, and bringing a volume up")
    if why:
        return None, why
    if check_pair(DEFAULT_A, DEFAULT_B) is None:  # up already, just not exported
        return GlusterVolume(DEFAULT_A, DEFAULT_B, name=_volume_name(DEFAULT_A)), ""
    return _run_up(netns=False)


def find_netns_volume() -> tuple[GlusterVolume | None, str]:
    """The network-namespace setup (SNERD_GLUSTER_NETNS=1 up.sh), brought up here; or why it
    cannot be (not root, GlusterFS, ip or nsenter missing, namespaces refused). It is a volume
    of its own: the default one (GLUSTER_MOUNT_A/B) is left as it is."""
    if os.environ.get("SNERD_GLUSTER_AUTO") == "0":
        return None, "SNERD_GLUSTER_AUTO=0: no network-namespace GlusterFS setup"
    why = _cannot_run_up("a GlusterFS client in a network namespace")
    if why:
        return None, why
    missing = [t for t in ("ip", "nsenter") if shutil.which(t) is None]
    if missing:
        return None, (
            f"a GlusterFS client in a network namespace needs {' and '.join(missing)} "
            "(iproute2, util-linux)"
        )
    return _run_up(netns=True)


def take_down(netns: bool = False) -> None:
    """down.sh --purge: what bring_up (or find_netns_volume, with its namespaces) started;
    its test directories go with the volume."""
    env = {**os.environ, "SNERD_GLUSTER_NETNS": "1" if netns else "0"}
    if netns:
        for k in ("GLUSTER_MOUNT_A", "GLUSTER_MOUNT_B", "GLUSTER_VOLUME"):
            env.pop(k, None)
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            ["bash", str(DOWN), "--purge"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=DOWN_TIMEOUT_S,
            check=False,
            env=env,
        )


def find_volume() -> tuple[GlusterVolume | None, str]:
    """The volume the environment names, or one brought up here, or why there is none."""
    a, b = os.environ.get("GLUSTER_MOUNT_A"), os.environ.get("GLUSTER_MOUNT_B")
    if a and b:
        why = check_pair(Path(a), Path(b))
        if why:
            return None, why
        return GlusterVolume(Path(a), Path(b), name=_volume_name(Path(a))), ""
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
