"""What the simulator reads of a `Node` beyond its public API, one function per question.

The simulated shell and the world drive a node through its public API (`handle`, `on_commit`,
`wake_in`, `owned_shards`). A few things they need to know are not in it: the epoch a history
entry is recorded under, which shard locks a renewal touches, the lease deadline that ends a
belief, which nodes it took for dead, and the locations of its tasks' records (both for the
world's checks). They are read here and nowhere else, each under the name of what the
simulator needs to know, so that the node's internals can move while this module alone follows
them. Reads only: nothing here changes a node.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from snerd.core.effects import Location
from snerd.core.node import Node

__all__ = [
    "claim_epoch",
    "found_dead",
    "holds_shards",
    "lease_deadline",
    "task_locations",
]


def claim_epoch(node: Node, shard: int) -> int:
    """The epoch of the claim under which `node` holds `shard` (-1: it holds none): what an
    `execute` or a record is recorded under."""
    info = node.shards.get(shard)
    return info.epoch if info is not None else -1


def holds_shards(node: Node) -> bool:
    """Whether `node` has any shard in any phase: if not, it believes it owns none (the cheap
    question asked after every event, before `owned_shards`)."""
    return bool(node.shards)


def lease_deadline(node: Node) -> int | None:
    """The monotonic time at which `node`'s lease on its shards runs out (None: no lease): its
    beliefs end there, paused or not."""
    return node.lease_deadline_mono


def found_dead(node: Node) -> Mapping[str, int]:
    """The node ids `node` took for dead (a shard lock free under their claim), each with the
    monotonic time it did."""
    return node.dead_nodes


def task_locations(node: Node, shard: int) -> Iterator[tuple[str, str, Location]]:
    """`(task id, what, location)` for every record location `node` holds for a task of
    `shard`: "record" (its task record, where its payload is read from) and "dispatch record"."""
    for task in node.tasks.values():
        if task.shard != shard:
            continue
        for what, loc in (("record", task.loc), ("dispatch record", task.dispatch_loc)):
            if loc is not None:
                yield task.task_id, what, loc
