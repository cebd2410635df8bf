"""`DrivenClock`: both of the node's readings follow trio's clock, so a `MockClock` jump moves
the wall clock (delays, backoff, cron) and the monotonic one (leases, timeouts) together."""

from __future__ import annotations

import trio
import trio.testing

from snerd.io.clock import DrivenClock

START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


async def test_the_wall_clock_starts_where_told_and_moves_only_with_trio_s(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.jump(5)  # trio's clock need not start at 0: the origin is the first reading
    clock = DrivenClock(START_US)
    first = clock.now()
    assert first.wall == START_US
    await trio.testing.wait_all_tasks_blocked()
    assert clock.now() == first  # nothing moves by itself
    mock_clock.jump(3 * 3600)
    later = clock.now()
    assert later.wall - first.wall == later.mono - first.mono == 3 * 3600 * 1_000_000
    assert clock.wall_us() == later.wall
