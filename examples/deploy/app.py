"""A minimal worker for the deployment examples (docs/deployment.md).

The application spawns its own `snerdmq` daemon through the SDK: every replica of this program
is one daemon on the shared queue directory QUEUE_DIR. It runs `resize` tasks, enqueues
EXAMPLE_ENQUEUE of them at start (0: none), and on SIGTERM or SIGINT leaves the `async with`
block, which drains the daemon: no new work, running handlers get up to SNERD_DRAIN_TIMEOUT
seconds, then the daemon hands its shards to the other replicas and exits. Every SNERD_*
variable in the environment reaches the daemon unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any

import anyio

from snerd import SnerdQueue

QUEUE_DIR = os.environ.get("QUEUE_DIR", "/data/queue")
ENQUEUE = int(os.environ.get("EXAMPLE_ENQUEUE", "0"))
WORK_SECONDS = float(os.environ.get("EXAMPLE_WORK_SECONDS", "0.5"))
ME = os.environ.get("HOSTNAME") or socket.gethostname()


def say(text: str) -> None:
    print(f"[{ME}] {text}", file=sys.stderr, flush=True)


async def main() -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with SnerdQueue(storage_path=QUEUE_DIR) as queue:

            @queue.handler("resize")
            async def resize(data: dict[str, Any]) -> None:
                # At-least-once: after a crash or a takeover this may run again for the same
                # task, so it must be idempotent (here: writing the same output again is fine).
                await anyio.sleep(WORK_SECONDS)
                say(f"resized {data['image']}")

            for i in range(ENQUEUE):
                done = await queue.enqueue(None, "resize", {"image": f"{ME}-{i}.png"})
                say(f"enqueued {done.task_id} into {done.shard}")

            async for signum in signals:
                say(f"{signal.Signals(signum).name}: draining")
                break
        # Leaving the block waited for the daemon's drain and exit (SIGKILL after
        # SNERD_DRAIN_TIMEOUT + 5 s if it hangs).
        say(f"daemon exited with code {queue.exit_code}")


if __name__ == "__main__":
    anyio.run(main)
