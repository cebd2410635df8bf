"""Shared test helpers: tools that may be absent, a small filesystem to fill up, and a GlusterFS
volume mounted twice."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

from tests.support import daemon as _daemons
from tests.support import glusterfs as _gluster

# Hypothesis profiles. The fuzz tests (tests/fuzz/test_fuzz_*.py) take their example counts from
# the profile: "ci" (the default, a few hundred inputs per test, part of `make test`) or
# "fuzz" (`make fuzz`: SNERD_FUZZ_EXAMPLES inputs per test, default 20,000). A failing input is
# printed by hypothesis with the `@reproduce_failure` line that replays it.
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile(
    "fuzz",
    deadline=None,
    max_examples=int(os.environ.get("SNERD_FUZZ_EXAMPLES", "20000")),
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("SNERD_HYPOTHESIS_PROFILE", "ci"))


def missing_tool(reason: str) -> NoReturn:
    """Skip for a missing tool or privilege; under SNERD_REQUIRE_ALL=1 (CI) that is a failure."""
    if os.environ.get("SNERD_REQUIRE_ALL") == "1":
        pytest.fail(f"SNERD_REQUIRE_ALL=1 but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    """Mount a tmpfs of `size` at `where` (root only) so a test can fill it up."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        missing_tool(f"cannot mount a tmpfs for a disk-full test: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem holding `directory`; returns the filler file (delete it to free)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


@pytest.fixture(autouse=True)
def kill_leftover_daemons() -> Iterator[None]:
    """A test that fails half-way must not leave a daemon behind (it would spin on a vanished
    directory for the rest of the run)."""
    yield
    while _daemons.STARTED:
        pid = _daemons.STARTED.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # gone already (and reaped): nothing happens


@pytest.fixture(scope="session")
def gluster_volume() -> Iterator[_gluster.GlusterVolume | str]:
    """The GlusterFS volume of GLUSTER_MOUNT_A/B, or one brought up for this session (root with
    GlusterFS installed; taken down again at the end), or why there is none."""
    volume, why = _gluster.find_volume()
    try:
        yield volume if volume is not None else why
    finally:
        if volume is not None and volume.started_here:
            _gluster.take_down()


@pytest.fixture
def gluster_netns_volume() -> Iterator[_gluster.GlusterVolume]:
    """The network-namespace GlusterFS setup (`SNERD_GLUSTER_NETNS=1 tests/support/glusterfs/up.sh`:
    a glusterd and volume of its own, mount A's client behind a veth link that can be cut),
    brought up for one test and taken down after it, namespaces included; the default volume
    is left alone. Skipped, or failed under SNERD_REQUIRE_ALL=1, where it cannot be made."""
    volume, why = _gluster.find_netns_volume()
    if volume is None:
        if os.geteuid() == 0:  # up.sh may have stopped half-way: undo what it made
            _gluster.take_down(netns=True)
        missing_tool(f"no GlusterFS client in a network namespace: {why}")
    try:
        yield volume
    finally:
        _gluster.take_down(netns=True)


@pytest.fixture
def gluster_dirs(
    gluster_volume: _gluster.GlusterVolume | str, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, Path]]:
    """A fresh directory on the GlusterFS volume: (its path through mount A, the same directory
    through mount B). Skipped, or failed under SNERD_REQUIRE_ALL=1, without a volume."""
    if isinstance(gluster_volume, str):
        missing_tool(f"no GlusterFS volume: {gluster_volume}")
    with _gluster.fresh_directory(gluster_volume, request.node.name) as dirs:
        yield dirs
