"""The faults of one world: when each kind strikes, and what it does.

A fault kind is on in a run when its rate is (`Settings.draw` turns whole kinds off in some
runs: swarm testing). Each kind is a Poisson process of its own: `arm` schedules the first
episode of every kind that is on, and each episode schedules the next. An episode strikes one
process, drawn from all of them (down ones too: a crash of a process that is down is a no-op),
and `_FAULTS` maps each kind's name to the one method that carries it out. No fault strikes in
the liveness phase.

The kinds: a crash (`World.down`, which restarts the process later), a pause (SIGSTOP for a
while: `World.pause`), a wall-clock step, a shard lock lost behind its holder's back (silently,
or so that its next touch fails), a membership outage (the process cannot reach
membership.json for a while) and a full disk (every append fails with ENOSPC for a while).
Besides those, `stop_between` pauses a process between deciding an append and making it
(BUGGIFY-style), and `downtime` draws how long a process stays down.

All draws come from the world's fault generator, in the order the run makes them. Faults act on
processes and the filesystem only through the world and `sim.fs`; they never touch a node.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from sim.process import FAULT, Proc
from sim.settings import SECOND, WALL_ORIGIN, exp, uniform
from snerd.core import effects as fx

if TYPE_CHECKING:
    from sim.world import World

__all__ = ["Faults"]

_APPEND = fx.Append
_APPEND_INBOX = fx.AppendInbox


class Faults:
    """The fault schedule of one world."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.s = world.s
        self.rng = rng
        #: The largest wall-clock error any host had: a claim written by a host whose clock
        #: ran that far ahead looks live that much longer to the wall-clock half of the lapse
        #: rule, which delays takeovers (liveness, not safety).
        self.max_wall_error = world.s.offset_max_us

    def arm(self) -> None:
        """Schedule the first episode of each fault kind that is on."""
        s, world, rng = self.s, self.world, self.rng
        for name, rate in (
            ("crash", s.crash_rate),
            ("pause", s.pause_rate),
            ("step", s.step_rate),
            ("lock", s.lock_loss_rate),
            ("disk_full", s.enospc_rate),
            ("outage", s.outage_rate),
        ):
            if rate:
                world.at(exp(rng, rate), FAULT, name)

    def fire(self, name: str) -> None:
        """An episode of fault kind `name` is due: it strikes a process drawn now."""
        world = self.world
        if world.liveness:
            return
        procs = world.procs
        proc = procs[int(self.rng.random() * len(procs))]
        _FAULTS[name](self, proc)

    def stop_between(self, proc: Proc, effects: list[fx.Effect]) -> None:
        """Now and then, a SIGSTOP between deciding an append and making it (BUGGIFY-style):
        the effects run when the process resumes, maybe after its lease ran out. Called for
        every batch of effects in the safety phase of a run with pauses."""
        if self.rng.random() < 0.002 and any(
            type(e) is _APPEND or type(e) is _APPEND_INBOX for e in effects
        ):
            self.world.pause(proc, uniform(self.rng, 1_000, self.s.pause_max_us))

    def downtime(self) -> int:
        """How long a process that went down stays down before it restarts."""
        return uniform(self.rng, SECOND, 5 * SECOND)

    # ------------------------------------------------------------------ the kinds

    def _crash(self, proc: Proc) -> None:
        world = self.world
        world.down(proc, crashed=True)
        world.at(world.t + exp(self.rng, self.s.crash_rate), FAULT, "crash")

    def _pause(self, proc: Proc) -> None:
        world = self.world
        world.pause(proc, uniform(self.rng, 1_000, self.s.pause_max_us))
        world.at(world.t + exp(self.rng, self.s.pause_rate), FAULT, "pause")

    def _step(self, proc: Proc) -> None:
        s, world, rng = self.s, self.world, self.rng
        t = world.t
        delta = uniform(rng, -s.step_max_us, s.step_max_us)
        proc.clock.step(t, delta)
        self.max_wall_error = max(self.max_wall_error, abs(proc.clock.offset_at(t) - WALL_ORIGIN))
        world.counters["clock_steps"] += 1
        world.record({"kind": "clock_step", "node": proc.name, "us": delta})
        world.at(t + exp(rng, s.step_rate), FAULT, "step")

    def _lock(self, proc: Proc) -> None:
        s, world, rng = self.s, self.world, self.rng
        fs = world.fs
        held = [sh for sh in range(s.shards) if proc.pid in fs.holders(sh)]
        if held:
            shard = held[int(rng.random() * len(held))]
            silent = rng.random() < s.lock_loss_silent_prob
            if fs.lose_lock(proc.pid, shard, silent=silent):
                world.counters["locks_lost"] += 1
                world.record(
                    {
                        "kind": "fault",
                        "what": "lock_lost",
                        "node": proc.name,
                        "shard": shard,
                        "silent": silent,
                    }
                )
        world.at(world.t + exp(rng, s.lock_loss_rate), FAULT, "lock")

    def _outage(self, proc: Proc) -> None:
        s, world, rng = self.s, self.world, self.rng
        t = world.t
        proc.unreachable_until = t + uniform(rng, 100_000, s.outage_max_us)
        world.record(
            {
                "kind": "fault",
                "what": "membership_outage",
                "node": proc.name,
                "us": proc.unreachable_until - t,
            }
        )
        world.at(t + exp(rng, s.outage_rate), FAULT, "outage")

    def _disk_full(self, proc: Proc) -> None:
        world = self.world
        world.fs.disk_full = True
        world.counters["disk_full"] += 1
        world.record({"kind": "fault", "what": "disk_full"})
        world.at(world.t + uniform(self.rng, 100_000, 3 * SECOND), FAULT, "disk_ok")

    def _disk_ok(self, proc: Proc) -> None:
        world = self.world
        world.fs.disk_full = False
        world.at(world.t + exp(self.rng, self.s.enospc_rate), FAULT, "disk_full")


#: Every fault kind by name (the payload of a `FAULT` event), and what it does.
_FAULTS: dict[str, Callable[[Faults, Proc], None]] = {
    "crash": Faults._crash,
    "pause": Faults._pause,
    "step": Faults._step,
    "lock": Faults._lock,
    "outage": Faults._outage,
    "disk_full": Faults._disk_full,
    "disk_ok": Faults._disk_ok,
}
