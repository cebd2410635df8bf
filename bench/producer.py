"""A blocking producer (`snerd.Producer`): an enqueue from code without an event loop.

One daemon owns the queue (it made it, and takes the producer's inbox files in); the
producer enqueues one task at a time from one thread, as a WSGI request handler would, and
each enqueue returns once its record is fsynced in the producer's own inbox file. Its
latency is set against the raw write + fsync per record of `bench.raw` (target: p50 within
3x); the rate with 8 threads shows what a threaded app gets (one fsync per enqueue and shard,
no group commit across threads).
"""

from __future__ import annotations

import os
import threading
import time

from bench.common import Budget, Latency, Measurement, Rate, Scratch
from bench.daemon import Daemon

__all__ = ["producer_enqueue"]

THREADS = 8


def producer_enqueue(scratch: Scratch, count: int, seconds: float) -> list[Measurement]:
    from snerd import Producer

    with scratch.directory("producer") as d, Daemon(d):
        producer = Producer(os.path.join(d, "data"))
        try:
            for i in range(50):  # warm-up: the inbox file made, its first blocks allocated
                producer.enqueue(f"warm{i}", "noop", {"n": i})
            samples: list[float] = []
            budget = Budget(count, seconds)
            perf = time.perf_counter
            n = 0
            while budget.more(n):
                t = perf()
                producer.enqueue(f"p{n}", "noop", {"n": n})
                samples.append(perf() - t)
                n += 1
            done = [0] * THREADS
            stop = perf() + seconds / 2

            def thread(k: int) -> None:
                i = 0
                while perf() < stop:
                    producer.enqueue(f"t{k}-{i}", "noop", {"n": i})
                    i += 1
                done[k] = i

            threads = [threading.Thread(target=thread, args=(k,)) for k in range(THREADS)]
            start = perf()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            elapsed = perf() - start
        finally:
            producer.close()
    return [
        Latency("producer_enqueue", tuple(samples)),
        Rate("producer_threads", sum(done), elapsed, f"{THREADS} threads"),
    ]
