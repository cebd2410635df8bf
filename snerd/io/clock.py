"""The daemon's two clock readings, `snerd.core.events.Now(wall, mono)`, and the clock-file hook.

Owns every clock reading the trio shell hands the core: the wall clock (shifted by the test
offsets, SNERD_TEST_CLOCK_OFFSET and SNERD_TEST_CLOCK_FILE) and the monotonic clock, which is
trio's own inside a trio run, so the runtime's timer and the node's deadlines use one clock and
`trio.testing.MockClock` drives both in tests. `DrivenClock` reads the wall clock from trio's
clock too, for `snerd.testing`: a test that moves a `MockClock` moves the node's wall clock with
it (delays, backoff, cron, schedules and rate windows are wall-clock deadlines).

It must never: shift the monotonic clock, or read a clock anywhere but here for the node (the
core takes time only as `Now`).
"""

from __future__ import annotations

import os
import time

import trio

from snerd.core import events as ev
from snerd.core.slots import slot_constructor

__all__ = ["Clock", "DrivenClock"]

#: `ev.Now(wall, mono)` without the frozen dataclass's `__init__` (the core's generated
#: constructor: about half the cost of the class call, and the identical object).
_new_now = slot_constructor(ev.Now, "wall", "mono")
_trio_time = trio.current_time


def _mono_us() -> int:
    """The monotonic clock in µs: trio's inside a trio run, else `time.monotonic`."""
    try:
        return round(_trio_time() * 1_000_000)
    except RuntimeError:
        return time.monotonic_ns() // 1000


class Clock:
    """Reads the node's two clocks. `offset_s` shifts the wall clock (a test hook for clock
    skew, SNERD_TEST_CLOCK_OFFSET); the monotonic clock is never shifted.

    The monotonic reading is trio's clock (`trio.current_time()`) inside a trio run, the one
    the runtime's timer sleeps on, so a test's `trio.testing.MockClock` drives both; outside a
    run (a tool, a test without trio) it is `time.monotonic`. The two have different origins:
    read one `Clock` either inside one run or outside any, not both (the runtime makes its own
    inside its run).

    A second test hook, SNERD_TEST_CLOCK_FILE (or `file`), names a file holding a number of
    seconds that is added to the wall clock as well, and may change while the daemon runs (a
    clock step, for chaos tests). The file is looked at (stat) at most every `FILE_POLL_US` of
    the monotonic clock and read again only when its mtime or size changed; a missing or empty
    file reads as 0. Each new value is reported on stderr, so a test can tell it was taken."""

    #: How often the clock file is looked at, at most (µs of the monotonic clock).
    FILE_POLL_US = 100_000

    def __init__(self, offset_s: float = 0.0, file: str | None = None) -> None:
        self.offset_us = int(offset_s * 1_000_000)
        if file is None:
            file = os.environ.get("SNERD_TEST_CLOCK_FILE", "").strip() or None
        self.file = file
        #: The file's offset (µs) as last read, when and what (mtime_ns, size) was read.
        self.file_offset_us = 0
        self._file_checked_mono = -self.FILE_POLL_US
        self._file_seen: tuple[int, int] | None = None
        if file is not None:
            self._poll_file(_mono_us())

    def now(self) -> ev.Now:
        # Read once per burst of events: built without the frozen dataclass's `__init__`
        # (`_new_now`). `_mono_us` inlined: this is on the path of every burst.
        try:
            mono = round(_trio_time() * 1_000_000)
        except RuntimeError:  # outside a trio run
            mono = time.monotonic_ns() // 1000
        if self.file is not None and mono - self._file_checked_mono >= self.FILE_POLL_US:
            self._poll_file(mono)
        return _new_now(time.time_ns() // 1000 + self.offset_us + self.file_offset_us, mono)

    def _poll_file(self, mono: int) -> None:
        assert self.file is not None
        self._file_checked_mono = mono
        try:
            st = os.stat(self.file)
        except OSError:
            seen: tuple[int, int] | None = None
        else:
            seen = (st.st_mtime_ns, st.st_size)
        if seen == self._file_seen:
            return
        self._file_seen = seen
        text = ""
        if seen is not None:
            try:
                with open(self.file, encoding="utf-8", errors="replace") as f:
                    text = f.read(256).strip()
            except OSError:
                text = ""
        try:
            value = float(text) if text else 0.0
        except ValueError:
            value = float("nan")
        if not (abs(value) < 1e9):  # not a number (or absurd): keep the offset we have
            self._say(
                f"[Snerd] WARNING: test clock: {self.file} holds {text[:40]!r}, not a number "
                "of seconds; the wall clock offset stays as it was\n"
            )
            return
        offset_us = int(value * 1_000_000)
        if offset_us != self.file_offset_us:
            self.file_offset_us = offset_us
            self._say(
                f"[Snerd] test clock: the wall clock is now offset by {value:+.6f} s "
                f"(SNERD_TEST_CLOCK_FILE={self.file})\n"
            )

    @staticmethod
    def _say(text: str) -> None:
        # Straight to fd 2 (stderr), unbuffered: one write, whatever else prints.
        try:
            os.write(2, text.encode("utf-8", "replace"))
        except OSError:
            return


class DrivenClock(Clock):
    """Both readings from trio's clock: the monotonic one as `Clock` reads it, and the wall
    clock as `start_wall_us` plus the trio time elapsed since its first reading. Under a
    `trio.testing.MockClock` nothing moves until the test moves it (`MockClock.jump`), and then
    both move together, as they would on a host whose time passed: `snerd.testing` runs an
    engine on it, so that hours of delays and backoff pass in no real time.

    Its origin is its first reading, inside the trio run whose clock it follows. The test
    hooks of `Clock` (the offset, the clock file) do not apply: the test moves this clock.
    """

    def __init__(self, start_wall_us: int) -> None:
        # (Not `Clock.__init__`: it would read SNERD_TEST_CLOCK_FILE, which this clock ignores.)
        self.offset_us = 0
        self.file = None
        self.file_offset_us = 0
        self._origin_mono: int | None = None
        self._start_wall = start_wall_us

    def now(self) -> ev.Now:
        mono = round(_trio_time() * 1_000_000)
        return _new_now(self._wall(mono), mono)

    def wall_us(self) -> int:
        """The wall clock the node reads now (µs since the epoch; call inside the run)."""
        return self._wall(round(_trio_time() * 1_000_000))

    def _wall(self, mono: int) -> int:
        if self._origin_mono is None:
            self._origin_mono = mono
        return self._start_wall + mono - self._origin_mono
