"""Shared test helpers: tools that may be absent, and a small filesystem to fill up."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import daemon as _daemons


def missing_tool(reason: str) -> None:
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
