"""SNERD_TEST_CLOCK_FILE: a runtime-adjustable wall-clock offset for chaos tests (the clock
nemesis of jepsen-lite). Real files, the real clock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from snerd.io.clock import Clock

S = 1_000_000


def _offset(clock: Clock) -> int:
    """The wall clock's lead over the host's, in µs (rounded to 10 ms)."""
    now = clock.now()
    return round((now.wall - time.time_ns() // 1000) / 10_000) * 10_000


def _bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    # Make sure the mtime changes even on a filesystem with a coarse clock.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_the_file_offset_is_added_and_followed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "clock"
    f.write_text("12.5\n")
    clock = Clock(file=str(f))
    assert _offset(clock) == 12_500_000
    assert "offset by +12.500000 s" in capfd.readouterr().err
    _bump(f, "-7")
    time.sleep(Clock.FILE_POLL_US / S + 0.05)
    assert _offset(clock) == -7 * S
    assert "offset by -7.000000 s" in capfd.readouterr().err
    # The monotonic clock is never shifted.
    assert abs(clock.now().mono - time.monotonic_ns() // 1000) < S


def test_the_file_is_looked_at_at_most_every_poll_interval(tmp_path: Path) -> None:
    f = tmp_path / "clock"
    f.write_text("1")
    clock = Clock(file=str(f))
    looked = time.monotonic_ns() // 1000
    _bump(f, "3")
    clock.now()
    if time.monotonic_ns() // 1000 - looked < Clock.FILE_POLL_US:
        # Within the poll interval of the last look, the old offset still holds.
        assert clock.file_offset_us == S
    time.sleep(Clock.FILE_POLL_US / S + 0.05)
    clock.now()
    assert clock.file_offset_us == 3 * S


def test_missing_empty_and_garbage(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "clock"
    clock = Clock(file=str(f))  # missing: 0
    assert clock.file_offset_us == 0
    _bump(f, "4")
    time.sleep(Clock.FILE_POLL_US / S + 0.05)
    clock.now()
    assert clock.file_offset_us == 4 * S
    _bump(f, "soon")
    time.sleep(Clock.FILE_POLL_US / S + 0.05)
    clock.now()
    assert clock.file_offset_us == 4 * S  # not a number: kept
    assert "not a number" in capfd.readouterr().err
    f.unlink()
    time.sleep(Clock.FILE_POLL_US / S + 0.05)
    clock.now()
    assert clock.file_offset_us == 0


def test_the_environment_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "clock"
    f.write_text("2")
    monkeypatch.setenv("SNERD_TEST_CLOCK_FILE", str(f))
    clock = Clock(1.0)  # SNERD_TEST_CLOCK_OFFSET adds to it
    assert _offset(clock) == 3 * S
    monkeypatch.delenv("SNERD_TEST_CLOCK_FILE")
    assert Clock().file is None
