"""The daemon's clock (`snerd.io.clock.Clock`): the monotonic reading is trio's clock inside a
run, and SNERD_TEST_CLOCK_FILE, a runtime-adjustable wall-clock offset for chaos tests (the
clock nemesis of jepsen-lite). Real files; virtual time (`trio.testing.MockClock`), so nothing
sleeps in real time."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from snerd.io.clock import Clock

S = 1_000_000
#: The clock file's poll interval, in seconds of trio's clock.
POLL_S = Clock.FILE_POLL_US / S


def _offset(clock: Clock) -> int:
    """The wall clock's lead over the host's, in µs (rounded to 10 ms)."""
    now = clock.now()
    return round((now.wall - time.time_ns() // 1000) / 10_000) * 10_000


def _bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    # Make sure the mtime changes even on a filesystem with a coarse clock.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_the_monotonic_reading_is_trio_s_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    real_start = time.perf_counter()
    before = clock.now().mono
    assert before == round(trio.current_time() * S)
    await trio.sleep(450)
    assert clock.now().mono - before == 450 * S
    autojump_clock.jump(3.5)
    assert clock.now().mono - before == 453_500_000
    # Virtual time: the 450 s took (almost) no real time.
    assert time.perf_counter() - real_start < 5


def test_outside_a_trio_run_the_monotonic_reading_is_time_monotonic() -> None:
    assert abs(Clock().now().mono - time.monotonic_ns() // 1000) < S


async def test_the_file_offset_is_added_and_followed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    f = tmp_path / "clock"
    f.write_text("12.5\n")
    clock = Clock(file=str(f))
    assert _offset(clock) == 12_500_000
    assert "offset by +12.500000 s" in capfd.readouterr().err
    _bump(f, "-7")
    await trio.sleep(POLL_S)
    assert _offset(clock) == -7 * S
    assert "offset by -7.000000 s" in capfd.readouterr().err
    # The monotonic clock is never shifted.
    assert clock.now().mono == round(trio.current_time() * S)


async def test_the_file_is_looked_at_at_most_every_poll_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    f = tmp_path / "clock"
    f.write_text("1")
    clock = Clock(file=str(f))  # looked at now
    _bump(f, "3")
    await trio.sleep(POLL_S / 2)
    clock.now()
    # Within the poll interval of the last look, the old offset still holds.
    assert clock.file_offset_us == S
    await trio.sleep(POLL_S)
    clock.now()
    assert clock.file_offset_us == 3 * S


async def test_missing_empty_and_garbage(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], autojump_clock: trio.testing.MockClock
) -> None:
    f = tmp_path / "clock"
    clock = Clock(file=str(f))  # missing: 0
    assert clock.file_offset_us == 0
    _bump(f, "4")
    await trio.sleep(POLL_S)
    clock.now()
    assert clock.file_offset_us == 4 * S
    _bump(f, "soon")
    await trio.sleep(POLL_S)
    clock.now()
    assert clock.file_offset_us == 4 * S  # not a number: kept
    assert "not a number" in capfd.readouterr().err
    f.unlink()
    await trio.sleep(POLL_S)
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
