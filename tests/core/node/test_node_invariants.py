"""`Node.invariants()`: it holds after every call of a varied workload, and each check fails
when the state it guards is broken on purpose (a checker that cannot fail proves nothing).

`tests.support.fakeshell.FakeShell` calls `invariants()` after every `handle`, burst and
commit, so the workload below (and every other FakeShell test) is checked step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from snerd.core import effects as fx
from snerd.core import events as ev
from snerd.core.node import Node, NodeConfig, NodePhase, TaskState
from snerd.core.node.model import InboxSegment, LockProof
from snerd.core.node.outbox import ClaimPart
from snerd.core.ownership import ShardPhase
from snerd.core.timefmt import format_rfc3339
from tests.support.fakeshell import SECOND, FakeShell


def started(config: NodeConfig | None = None) -> FakeShell:
    sh = FakeShell(config or NodeConfig(node_id="n@pid-1-x", max_workers=2))
    sh.start()
    assert sh.node.phase is NodePhase.RUNNING
    return sh


def test_the_invariants_hold_through_a_varied_workload() -> None:
    config = NodeConfig(
        node_id="n@pid-1-x",
        max_workers=2,
        pools={"slow": 1},
        compact_min_bytes=2048,
        history_limit=3,
        compact_dead_ratio=1,
    )
    sh = started(config)
    sh.enqueue("early")  # parked: no handler yet
    sh.register("t")
    for i in range(6):
        sh.enqueue(f"p{i}", urgency_score=i % 3)
    sh.enqueue("later", execute_at=format_rfc3339(sh.wall + 30 * SECOND))
    sh.enqueue("child", trigger_after_ids=["p0"])
    sh.enqueue("dup1", data={"same": 1}, auto_dedupe=True)
    sh.enqueue("dup2", data={"same": 1}, auto_dedupe=True)
    sh.enqueue("g1", rate_limit_group="g", max_per_minute=1)
    sh.enqueue("g2", rate_limit_group="g", max_per_minute=1)
    sh.enqueue("slow1", pool="slow", max_execution_seconds=2)
    sh.enqueue("retried", max_retries=2)
    sh.enqueue("cron", cron="*/5 * * * * *")
    sh.burst([ev.LineReceived(line=b"not json"), ev.LineReceived(line=b"")])
    for _ in range(40):
        for task_id in list(sh.node.book.inflight):
            if sh.node.tasks[task_id].state is TaskState.RUNNING:
                sh.result(task_id, ok=task_id != "retried", error="no")
        sh.advance(1)
    sh.disk_full = True
    sh.enqueue("refused")
    sh.disk_full = False
    sh.hold_appends = True
    sh.enqueue("held")
    sh.node.invariants()
    sh.hold_appends = False
    sh.release_held()
    sh.feed(ev.CompactionRequested(shard=0))
    sh.advance(2)
    sh.feed(ev.DrainRequested(reason="SIGTERM"))
    sh.advance(40)
    assert sh.exit_code == 0
    sh.node.invariants()


def _task_in(node: Node, state: TaskState) -> str:
    return next(t for t, task in node.tasks.items() if task.state is state)


def _loaded() -> FakeShell:
    """A node with a running task, ready ones, a parked one and a waiting one."""
    sh = started(NodeConfig(node_id="n@pid-1-x", max_workers=1))
    sh.register("t")
    for task_id in ("run", "r1", "r2"):
        sh.enqueue(task_id)
    sh.enqueue("nohandler", task_type="other")
    sh.enqueue("later", execute_at=format_rfc3339(sh.wall + 60 * SECOND))
    assert sh.node.tasks["run"].state is TaskState.RUNNING
    sh.node.invariants()
    return sh


def _ghost_in_ready(sh: FakeShell) -> None:
    sh.node.book.ready["default"].push("ghost", 0.0, 999)


def _ready_out_of_queue(sh: FakeShell) -> None:
    sh.node.book.ready["default"].discard(_task_in(sh.node, TaskState.READY))


def _wrong_state_in_queue(sh: FakeShell) -> None:
    sh.node.tasks["later"].state = TaskState.READY


def _in_two_queues(sh: FakeShell) -> None:
    task = sh.node.tasks["nohandler"]
    sh.node.book.parked_by_group.setdefault("g", type(sh.node.book.ready["default"])()).push(
        task.task_id, 0.0, task.seq
    )


def _flight_lost(sh: FakeShell) -> None:
    flight = sh.node.book.inflight.pop("run")
    sh.node.book.pool_busy[flight.pool] -= 1


def _pool_miscounted(sh: FakeShell) -> None:
    sh.node.book.pool_busy["default"] += 1


def _flight_on_a_shard_let_go(sh: FakeShell) -> None:
    sh.node.shards[0].phase = ShardPhase.UNOWNED


def _fingerprint_of_nothing(sh: FakeShell) -> None:
    sh.node.book.fingerprints["abc"] = {"ghost": None}


def _token_never_issued(sh: FakeShell) -> None:
    sh.node.outbox.pending[sh.node.outbox.token + 5] = ClaimPart(0)


def _effect_of_another_token(sh: FakeShell) -> None:
    sh.hold_appends = True
    sh.enqueue("held")
    token, pending = next(iter(sh.node.outbox.pending.items()))
    assert pending.effect is not None
    pending.effect = replace(pending.effect, token=token + 100)


def _effect_left_over(sh: FakeShell) -> None:
    sh.node.outbox.out.append(fx.Log(level="info", message="stray"))


def _backlog_without_compaction(sh: FakeShell) -> None:
    sh.node.shards[0].backlog.append(fx.Append(token=1, shard=0, records=()))


def _active_without_claim(sh: FakeShell) -> None:
    sh.node.shards[0].claim_loc = None


def _probe_doc_without_probe(sh: FakeShell) -> None:
    sh.node.shards[0].probed_doc = {}


def _proof_for_a_held_shard(sh: FakeShell) -> None:
    sh.node.tenure.lock_proofs[0] = LockProof(owner="other@pid-2-y", signature=None)


def _closed_segment_current(sh: FakeShell) -> None:
    segment = InboxSegment(shard=3, name="n@pid-1-x", closed=True)
    sh.node.inbox.current[3] = segment
    sh.node.inbox.segments[(3, segment.name)] = segment


def _inbox_taken_behind_done(sh: FakeShell) -> None:
    sh.node.shards[0].inbox_done["w@pid-9-z"] = 10


def _timer_left_due(sh: FakeShell) -> None:
    sh.node.tenure.renew_at_mono = sh.mono - 1


def _phase_not_a_phase(sh: FakeShell) -> None:
    sh.node.phase = "running"  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("corrupt", "named"),
    [
        (_ghost_in_ready, "ready\\[default\\] holds ghost"),
        (_ready_out_of_queue, "ready task r. is in no queue"),
        (_wrong_state_in_queue, "due holds later, ready"),
        (_in_two_queues, "nohandler is in parked_by_type\\[other\\] and parked_by_group\\[g\\]"),
        (_flight_lost, "run running: flight"),
        (_pool_miscounted, "pool default: 2 busy, 1 flying"),
        (_flight_on_a_shard_let_go, "run is in flight on shard 0"),
        (_fingerprint_of_nothing, "fingerprint abc lists ghost"),
        (_token_never_issued, "was never issued"),
        (_effect_of_another_token, "keeps the effect of"),
        (_effect_left_over, "effects left in the buffer"),
        (_backlog_without_compaction, "backlog, no compaction"),
        (_active_without_claim, "shard 0: no claim"),
        (_probe_doc_without_probe, "shard 0: probe doc"),
        (_proof_for_a_held_shard, "a lock proof for a shard this node acts for"),
        (_closed_segment_current, "still current"),
        (_inbox_taken_behind_done, "inbox taken below what is done"),
        (_timer_left_due, "timer 'renewal' due, not fired"),
        (_phase_not_a_phase, "phase 'running'"),
    ],
)
def test_each_invariant_fails_when_its_state_is_broken(
    corrupt: Callable[[FakeShell], None], named: str
) -> None:
    sh = _loaded()
    corrupt(sh)
    with pytest.raises(AssertionError, match=f"node invariant broken: .*{named}"):
        sh.node.invariants()
