"""A node's two clocks as functions of the simulator's true time.

Owns: turning true time `t` (integer microseconds, the world's event-queue time) into what one
host's process reads from `CLOCK_MONOTONIC` and `CLOCK_REALTIME`, and back again for wake-ups.
It never reads a real clock, never draws a random number (the world draws the parameters with
its own seeded `random.Random` and passes them in), and never uses floating point on the time
path: one seed must give the same microsecond on every machine and Python version.

The model (clock_gettime(2)):

- Both clocks tick at one rate, `1 + drift_ppm / 1e6` node microseconds per true microsecond.
  On Linux CLOCK_MONOTONIC "is affected by the incremental adjustments performed by
  adjtime(3) and NTP", so a fast crystal makes both clocks fast; a rate error is the only thing
  that can make a monotonic-clock lease unsafe (reference §3.2, Scheme M: no offset term).
- The wall clock starts `offset_us` away from true time and can be stepped (`step`, as
  `date -s` or clock_settime(2) do: "CLOCK_REALTIME ... is affected by discontinuous jumps in
  the system time"). A step never moves the monotonic clock.
- The monotonic clock has an arbitrary origin ("some unspecified point in the past"), which a
  new process on the same host may see differently: `restart` gives the process a new origin
  and keeps the host's wall clock. CLOCK_MONOTONIC never goes backwards, so `mono(t)` is
  non-decreasing in `t`.

Each clock is kept as an anchor (true time, node reading) plus the rate; a step, a restart or a
rate change re-anchors at the moment it happens, so readings stay integer-exact:
`reading = base + (t - anchor) * (1_000_000 + drift_ppm) // 1_000_000`.
"""

from __future__ import annotations

from snerd.core.events import Now

__all__ = ["PPM", "NodeClock"]

#: Parts per million: the denominator of `drift_ppm`.
PPM = 1_000_000

#: `Now(wall, mono)` built without the frozen dataclass's `__init__` (one per core event):
#: `slot_constructor`'s steps, written out in `NodeClock.now`.
_new_object = object.__new__
_set_wall = vars(Now)["wall"].__set__
_set_mono = vars(Now)["mono"].__set__


def _scaled(elapsed: int, rate: int) -> int:
    """Node microseconds elapsed in `elapsed` true microseconds at `rate` (= PPM + drift_ppm).
    Floor division: a clock reading is an integer that has not yet reached the next tick."""
    return elapsed * rate // PPM


def _true_elapsed_to_reach(k: int, rate: int) -> int:
    """Smallest true `e >= 0` with `_scaled(e, rate) >= k`.

    floor(e * rate / PPM) >= k  <=>  e * rate >= k * PPM  <=>  e >= ceil(k * PPM / rate).
    """
    if k <= 0:
        return 0
    return -((-k * PPM) // rate)


class NodeClock:
    """One host's clocks as seen by the process running there.

    Not a frozen record: a clock is stepped, its rate changed and its process restarted as the
    run goes on. Readings are pure functions of `t` between those changes, so a checker may
    read a past `t` as long as it is not before the last change (asserted).
    """

    __slots__ = (
        "_mono_anchor",
        "_mono_base",
        "_rate",
        "_wall_anchor",
        "_wall_base",
        "steps",
    )

    def __init__(self, *, t: int, offset_us: int, drift_ppm: int, mono_origin: int) -> None:
        """Create the clocks at true time `t`: the wall clock then reads `t + offset_us`, the
        monotonic clock `mono_origin`; both run at `1 + drift_ppm / 1e6`."""
        assert -PPM < drift_ppm < PPM, f"drift_ppm {drift_ppm} would stop or reverse the clock"
        self._rate = PPM + drift_ppm
        self._mono_anchor = t
        self._mono_base = mono_origin
        self._wall_anchor = t
        self._wall_base = t + offset_us
        #: Wall-clock steps applied so far (for the run's report).
        self.steps = 0

    def __repr__(self) -> str:
        return (
            f"NodeClock(drift_ppm={self.drift_ppm}, mono=({self._mono_anchor}, "
            f"{self._mono_base}), wall=({self._wall_anchor}, {self._wall_base}))"
        )

    @property
    def drift_ppm(self) -> int:
        """The current rate error in parts per million (positive: the node's clocks run fast)."""
        return self._rate - PPM

    def mono(self, t: int) -> int:
        """CLOCK_MONOTONIC of the current process at true time `t`: non-decreasing in `t`.

        `t` must not precede the last restart or rate change: before a restart the reading
        belonged to another process, and extrapolating backwards over a re-anchoring would
        invent a history the clock never had.
        """
        assert t >= self._mono_anchor, f"mono read at {t}, before its anchor {self._mono_anchor}"
        return self._mono_base + (t - self._mono_anchor) * self._rate // PPM  # _scaled inline

    def wall(self, t: int) -> int:
        """CLOCK_REALTIME (µs since the Unix epoch) at true time `t`, not before the last step
        or rate change (the readings before a step are history, not a function of `t`)."""
        assert t >= self._wall_anchor, f"wall read at {t}, before its anchor {self._wall_anchor}"
        return self._wall_base + (t - self._wall_anchor) * self._rate // PPM  # _scaled inline

    def now(self, t: int) -> Now:
        """Both readings at true time `t`, as the core's `Now` (what `Node.handle` takes).

        `wall(t)` and `mono(t)` written out: this runs for every event a node handles."""
        mono_anchor, wall_anchor, rate = self._mono_anchor, self._wall_anchor, self._rate
        assert t >= mono_anchor, f"mono read at {t}, before its anchor {mono_anchor}"
        assert t >= wall_anchor, f"wall read at {t}, before its anchor {wall_anchor}"
        now: Now = _new_object(Now)
        _set_wall(now, self._wall_base + (t - wall_anchor) * rate // PPM)
        _set_mono(now, self._mono_base + (t - mono_anchor) * rate // PPM)
        return now

    def offset_at(self, t: int) -> int:
        """How far the wall clock is from true time at `t` (for skew reports and checkers)."""
        return self.wall(t) - t

    def true_at_mono(self, m: int) -> int:
        """The smallest true time at which `mono` reads at least `m`.

        The world schedules a wake-up the node asked for in its own time here. Never earlier
        than the current anchor: before it the current process did not exist (a restart) or
        the reading was on another rate (a `set_drift`), so a reading already reached maps to
        the anchor. For `m` above the reading at the anchor, `mono(result) >= m` and
        `mono(result - 1) < m`.
        """
        k = m - self._mono_base
        if k <= 0:
            return self._mono_anchor
        return self._mono_anchor - ((-k * PPM) // self._rate)  # _true_elapsed_to_reach inline

    def true_at_wall(self, w: int) -> int:
        """The smallest true time, not before the last step or rate change, at which `wall`
        reads at least `w`. A later `step` invalidates the answer: the world re-plans wall
        wake-ups when it steps a clock (as a real timer on CLOCK_REALTIME is re-armed; see
        timerfd_create(2), TFD_TIMER_CANCEL_ON_SET)."""
        return self._wall_anchor + _true_elapsed_to_reach(w - self._wall_base, self._rate)

    def step(self, t: int, delta_us: int) -> None:
        """Jump the wall clock by `delta_us` at true time `t` (`date -s`); mono is unaffected."""
        self._wall_base = self.wall(t) + delta_us
        self._wall_anchor = t
        self.steps += 1

    def set_drift(self, t: int, drift_ppm: int) -> None:
        """Change the rate from true time `t` on (an NTP slew, libfaketime's rate); both clocks
        keep their readings at `t`, so mono stays non-decreasing."""
        assert -PPM < drift_ppm < PPM, f"drift_ppm {drift_ppm} would stop or reverse the clock"
        mono, wall = self.mono(t), self.wall(t)
        self._mono_anchor, self._mono_base = t, mono
        self._wall_anchor, self._wall_base = t, wall
        self._rate = PPM + drift_ppm

    def restart(self, t: int, new_origin: int) -> None:
        """A new process on the same host from true time `t`: its monotonic clock reads
        `new_origin` at `t` (a fresh arbitrary origin); the host's wall clock goes on."""
        assert t >= self._mono_anchor, f"restart at {t}, before the last anchor"
        self._mono_anchor = t
        self._mono_base = new_origin
