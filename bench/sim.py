"""The simulator's speed: world events per second on one core, beside a bare event loop.

A world event is one entry popped from the simulator's event queue and carried out: a core event
handed to a real `Node`, a batch of its effects executed by the simulated shell, an I/O
completion, a fault, a producer's enqueue, a handler finishing. The baseline pops and pushes
the same number of entries through the same `heapq` queue doing nothing else: the ceiling of any
Python event loop shaped like this one.
"""

from __future__ import annotations

import heapq
import time

from bench.common import Measurement, Rate, Scratch
from sim.settings import Settings
from sim.world import World

__all__ = ["sim_events"]


def _bare_loop(n: int) -> float:
    queue: list[tuple[int, int, int]] = [(i, i, 0) for i in range(64)]
    heapq.heapify(queue)
    started = time.perf_counter()
    for i in range(n):
        t, seq, _ = heapq.heappop(queue)
        heapq.heappush(queue, (t + 64, seq + 64, i))
    return time.perf_counter() - started


def sim_events(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    """Run seeds 1000, 1001, ... until `seconds` have passed (or `count` events)."""
    del scratch  # the simulator touches no disk
    events = node_events = 0
    simulated_us = 0
    seed = 1000
    started = time.perf_counter()
    while time.perf_counter() - started < seconds and events < count:
        outcome = World(Settings.draw(seed)).run()
        events += outcome.events
        node_events += outcome.node_events
        simulated_us += outcome.true_us
        seed += 1
    elapsed = time.perf_counter() - started
    bare = _bare_loop(events)
    note = f"{seed - 1000} seeds, {simulated_us / 1e6:,.0f} s simulated"
    return [
        Rate("sim_events", events, elapsed, note=note),
        Rate("sim_node_events", node_events, elapsed),
        Rate("sim_bare_loop", events, bare),
    ]
