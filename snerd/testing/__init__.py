"""`snerd.testing`: a real snerd queue on a virtual clock, for the unit tests of applications.

A test enqueues tasks, runs what is due (`run_until_idle`), moves time (`advance(hours=3)`),
and looks at what happened (`runs`, `get`, `result`, `dead_letters`): delays, backoff, cron,
named schedules and rate windows pass in microseconds of real time. The queue is the real
engine (`snerd.Engine`, on real files in a temporary directory) whose node reads a clock the
test moves (`snerd.io.clock.DrivenClock` over a `trio.testing.MockClock`), so every decision
is the daemon's own: what passes here passes in production.

- `TestQueue`: blocking calls, for plain `def test_...()` functions (its trio run is in a
  thread of its own). The pytest fixture `snerd_queue` (`snerd.testing.plugin`, registered as
  a pytest plugin by the package) is one of these on `tmp_path`.
- `AsyncTestQueue`: the same calls, awaited, for trio tests on a `MockClock` (pytest-trio's
  `mock_clock` fixture).

docs/testing.md has the guide.
"""

from __future__ import annotations

from snerd.testing.blocking import TestQueue
from snerd.testing.queue import TEST_ENV, AsyncTestQueue, Run, TaskNotFinished

__all__ = ["TEST_ENV", "AsyncTestQueue", "Run", "TaskNotFinished", "TestQueue"]
