"""The simulated shell's bookkeeping, driven step by step: what the history says is in a log
must be what the log's readers parse there, or the checkers judge a run nobody saw. And the
simulator drives a node through its public API only (what else it reads is in `sim.node_view`)."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import sim
from sim.clock import NodeClock
from sim.settings import SECOND, WALL_ORIGIN, Settings
from sim.world import World
from snerd.core import effects as fx
from snerd.core.records import encode_record, scan


class _Draws:
    """A crash's random draws, fixed: every file tears, near the end of its last append."""

    def random(self) -> float:
        return 0.99


def _world() -> World:
    world = World(Settings.draw(0, nodes=1, shards=1, torn_prob=1.0))
    world.clocks.append(NodeClock(t=0, offset_us=WALL_ORIGIN, drift_ppm=0, mono_origin=SECOND))
    world._start(0, 0)
    return world


def _append(world: World, token: int, *records: dict[str, Any]) -> None:
    """Hand an append of `records` to shard 0's log to the process's writer, which writes it
    at once and leaves it pending (its fsync never returns before the crash)."""
    effect = fx.Append(token=token, shard=0, records=tuple(fx.NewRecord(fields=r) for r in records))
    lines = [encode_record(r) for r in records]
    world.shell.issue_append(
        world.procs[0], effect, list(records), lines, world.t + SECOND, world.t
    )


def test_a_tombstone_torn_after_a_lost_append_is_in_the_history_as_readers_salvage_it() -> None:
    # Seed 100652: two appends in flight when the process died; the first (dispatch records)
    # was lost, a hole of zeros, and the second tore inside its second record. Its first, a
    # task's tombstone, is glued to the zeros: a reader reports the line corrupt and salvages
    # the whole task record at its end (`snerd.core.records.scan`), so the task is done for
    # every later owner. The history called it lost, and the checker a lost task.
    world = _world()
    task = "t266"
    done = {
        "taskType": "t",
        "deletedAt": "2027-01-01T00:00:00.000000Z",
        "snerdOutcome": "completed",
    }
    tombstone = {"taskId": task, **done}
    _append(world, 1, {"snerdKind": "dispatch", "task": "t222", "attempt": 1})
    _append(world, 2, tombstone, {"taskId": "t208", **done})
    world.rng_crash = _Draws()  # type: ignore[assignment]
    world.down(world.procs[0], crashed=True)

    read = scan(world.fs.read_log(0)).records
    assert [r.fields for r in read] == [tombstone]  # salvaged from the corrupt line
    recorded = [e["fields"] for e in world.history if e["kind"] == "record"]
    assert recorded == [tombstone]


def test_a_dispatch_torn_after_a_lost_append_is_not_in_the_history() -> None:
    # The same tear with a record readers do not salvage (not a task record): it is part of
    # the corrupt line, read by nobody, and the history must not list it.
    world = _world()
    _append(world, 1, {"snerdKind": "dispatch", "task": "t222", "attempt": 1})
    _append(
        world,
        2,
        {"snerdKind": "dispatch", "task": "t266", "attempt": 1},
        {"taskId": "t208", "taskType": "t", "snerdOutcome": "completed"},
    )
    world.rng_crash = _Draws()  # type: ignore[assignment]
    world.down(world.procs[0], crashed=True)

    assert scan(world.fs.read_log(0)).records == []
    assert [e for e in world.history if e["kind"] == "record"] == []


#: `Node`'s public API: what the simulator may call or read on a node outside `sim.node_view`.
_NODE_API = {
    "handle",
    "handle_burst",
    "on_commit",
    "wake_in",
    "owned_shards",
    "waiting_types",
    "invariants",
}


def _node_reads(path: pathlib.Path) -> set[str]:
    """The attributes read on a `node` or a `….node` in the module at `path`."""
    reads = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "node") or (
            isinstance(owner, ast.Attribute) and owner.attr == "node"
        ):
            reads.add(node.attr)
    return reads


def test_the_simulator_reads_a_node_only_through_its_api_or_node_view() -> None:
    modules = sorted(pathlib.Path(sim.__file__).parent.glob("*.py"))
    assert len(modules) > 5
    beyond = {
        path.name: sorted(_node_reads(path) - _NODE_API)
        for path in modules
        if path.name != "node_view.py"
    }
    assert {name: reads for name, reads in beyond.items() if reads} == {}
    # The check can fail: node_view itself reads past the API.
    assert _node_reads(pathlib.Path(sim.__file__).parent / "node_view.py") - _NODE_API


def test_a_node_whose_invariants_break_fails_the_run(monkeypatch: Any) -> None:
    # The world checks `Node.invariants()` every `INVARIANTS_EVERY` events it hands the nodes;
    # a broken one is a world violation, naming the node and what broke, and fails the seed.
    from snerd.core.node import Node

    assert sim.world.run(Settings.draw(3)).ok

    def broken(self: Node) -> None:
        raise AssertionError("task t1 is READY but in no ready queue")

    monkeypatch.setattr(Node, "invariants", broken)
    outcome = sim.world.run(Settings.draw(3))
    assert not outcome.ok
    assert outcome.world_violations
    assert (
        "node invariant broken: task t1 is READY but in no ready queue"
        in (outcome.world_violations[0])
    )
    assert len(outcome.world_violations) <= 10


def _scanned(world: World, effect: fx.ScanQueue) -> Any:
    """The `QueueScanned` the shell answers `effect` with (queued for the process)."""
    world.shell.carry_out(world.procs[0], [effect])
    entry = max(world.queue, key=lambda e: e[1])
    return entry[-1]


def test_the_queue_scan_reads_pending_lines_from_the_known_offset_and_a_replaced_log_anew() -> None:
    world = _world()
    parent = {"taskId": "p1", "taskType": "t"}
    other = {"taskId": "x9", "taskType": "t"}
    _append(world, 1, other, parent)  # pending: readers see it
    size = world.fs.log_size(0)
    world.fs.append("writer#1", 0, b'{"taskId":"p1","tor', enospc=False, short=0)  # no newline
    ids = frozenset({"p1"})
    first = _scanned(world, fx.ScanQueue(shards=1, known={}, ids=ids, max_bytes=1 << 20))
    [chunk] = first.chunks
    assert (chunk.start, chunk.end) == (0, size)  # up to the last complete line
    assert [r.fields["taskId"] for r in chunk.records] == ["p1"]  # `pick` kept only p1
    [(shard, segment, identity, seen)] = first.files
    assert (shard, segment, seen) == (0, "", 0)  # read to its end: only a torn tail left
    # From the known offset, with the identity unchanged: nothing new is complete.
    known = {(0, ""): (identity, size)}
    again = _scanned(world, fx.ScanQueue(shards=1, known=known, ids=ids, max_bytes=1 << 20))
    assert again.chunks == ()
    # A compaction renames a new log into place: another identity, read from its start, and
    # at least one line even when it is longer than `max_bytes`.
    assert world.fs.replace_log("other#1", 0, encode_record(parent)) is None
    fresh = _scanned(world, fx.ScanQueue(shards=1, known=known, ids=ids, max_bytes=3))
    [chunk] = fresh.chunks
    assert fresh.files[0][2] != identity
    assert chunk.start == 0 and chunk.end == len(encode_record(parent))
    assert [r.fields["taskId"] for r in chunk.records] == ["p1"]
