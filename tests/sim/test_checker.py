"""`sim.check`: a corpus of small histories, each check shown passing and failing.

A checker that cannot fail proves nothing: every invariant has at least one planted bad history
here that it must reject, next to a near-miss it must accept. Histories are written with `H`, a
tiny builder that advances true time by 1 ms per entry unless told otherwise.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import check as checker
from sim.check import (
    ACK_NOT_DURABLE,
    ATTEMPTS_EXCEEDED,
    BELIEF_OVERLAP,
    CHILD_NOT_FAILED,
    CHILD_NOT_RUN,
    CHILD_RAN_EARLY,
    CHILD_RAN_ON_PENDING,
    DOUBLE_OWNERSHIP,
    DUPLICATE_PENDING,
    FALSE_DUPLICATE,
    INVENTED_TASK,
    LOST_TASK,
    PRIORITY_INVERSION,
    RATE_EXCEEDED,
    STALE_OWNER_ACTED,
    TICK_FIRED_TWICE,
    UNTOLD_DUPLICATE,
    WRONG_RESULT,
    HistoryError,
    LivenessWatch,
    check,
    check_at_least_once,
    check_attempts,
    check_belief,
    check_dedupe,
    check_dedupe_honesty,
    check_dependencies,
    check_fenced_acts,
    check_ownership,
    check_priority,
    check_rate_windows,
    check_results,
    check_schedule_runs,
    unfinished,
)

MS = 1_000
SECOND = 1_000_000


class H:
    """A history builder: each method appends one entry (or a few) and returns self."""

    def __init__(
        self, *, fence: bool = True, assumptions_hold: bool = True, slack_us: int = 0
    ) -> None:
        self.t = 0
        self.entries: list[dict[str, Any]] = [
            {
                "t": 0,
                "kind": "params",
                "ttl_us": 30 * SECOND,
                "margin_us": 5 * SECOND,
                "fence": fence,
                "assumptions_hold": assumptions_hold,
                "window_slack_us": slack_us,
            }
        ]

    def at(self, t: int) -> H:
        """The next entry is at true time `t`."""
        self.t = t - MS
        return self

    def add(self, kind: str, **fields: Any) -> H:
        self.t += MS
        self.entries.append({"t": self.t, "kind": kind, **fields})
        return self

    def copy(self) -> H:
        other = H()
        other.entries, other.t = list(self.entries), self.t
        return other

    # -- client side

    def invoke(self, task: str, node: str = "n1", **attrs: Any) -> H:
        full = {
            "type": "email",
            "max_retries": 2,
            "urgency": 0,
            "group": None,
            "max_per_minute": None,
            "fingerprint": None,
            "delay_us": 0,
            "parents": [],
        }
        full.update(attrs)
        return self.add("enqueue", phase="invoke", task=task, node=node, attrs=full)

    def ok(self, task: str, node: str = "n1", shard: int = 0, **extra: Any) -> H:
        return self.add("enqueue", phase="ok", task=task, node=node, shard=shard, **extra)

    # -- log records

    def rec(
        self, fields: dict[str, Any], shard: int = 0, node: str = "n1", issued_ago: int = MS // 2
    ) -> H:
        epoch = fields.get("snerdEpoch")
        return self.add(
            "record",
            shard=shard,
            node=node,
            epoch=epoch,
            fields=fields,
            t_issue=self.t + MS - issued_ago,
        )

    def claim(self, epoch: int, node: str = "n1", shard: int = 0) -> H:
        return self.rec(
            {
                "snerdKind": "claim",
                "epoch": epoch,
                "node": node,
                "snerdNode": node,
                "snerdEpoch": epoch,
            },
            shard,
            node,
        )

    def enq_rec(
        self, task: str, epoch: int = 1, node: str = "n1", shard: int = 0, **extra: Any
    ) -> H:
        return self.rec(
            {
                "taskId": task,
                "retryCount": 0,
                "taskType": "email",
                "snerdNode": node,
                "snerdEpoch": epoch,
                **extra,
            },
            shard,
            node,
        )

    def dispatch(
        self,
        task: str,
        attempt: int = 1,
        epoch: int = 1,
        node: str = "n1",
        shard: int = 0,
        issued_ago: int = MS // 2,
    ) -> H:
        return self.rec(
            {
                "snerdKind": "dispatch",
                "task": task,
                "attempt": attempt,
                "snerdNode": node,
                "snerdEpoch": epoch,
            },
            shard,
            node,
            issued_ago,
        )

    def retry_rec(
        self, task: str, attempt: int, epoch: int = 1, node: str = "n1", shard: int = 0
    ) -> H:
        return self.rec(
            {
                "taskId": task,
                "retryCount": attempt,
                "taskType": "email",
                "snerdNode": node,
                "snerdEpoch": epoch,
            },
            shard,
            node,
        )

    def tomb(
        self,
        task: str,
        epoch: int = 1,
        node: str = "n1",
        shard: int = 0,
        outcome: str = "completed",
    ) -> H:
        return self.rec(
            {
                "taskId": task,
                "retryCount": 0,
                "taskType": "email",
                "deletedAt": "2024-01-01T00:00:00Z",
                "snerdOutcome": outcome,
                "snerdNode": node,
                "snerdEpoch": epoch,
            },
            shard,
            node,
        )

    # -- node side

    def execute(
        self, task: str, attempt: int = 1, node: str = "n1", shard: int = 0, epoch: int = 1
    ) -> H:
        return self.add("execute", task=task, attempt=attempt, node=node, shard=shard, epoch=epoch)

    def done(self, task: str, attempt: int = 1, node: str = "n1", ok: bool = True) -> H:
        return self.add("handler_done", task=task, attempt=attempt, node=node, ok=ok)

    def belief(self, on: bool, node: str = "n1", shard: int = 0) -> H:
        return self.add("belief", node=node, shard=shard, on=on)

    # -- whole lives

    def inbox_rec(self, task: str, node: str = "n2", shard: int = 0, **extra: Any) -> H:
        """A task record durable in `node`'s inbox file of `shard`."""
        fields = {"taskId": task, "taskType": "email", "snerdNode": node, **extra}
        return self.add(
            "inbox_record", shard=shard, node=node, fields=fields, offset=0, t_issue=self.t
        )

    def via_inbox(self, task: str, node: str = "n2", shard: int = 0, **attrs: Any) -> H:
        """Invoke on `node`, which does not own `shard`: durable in its inbox, then ok."""
        return self.invoke(task, node, **attrs).inbox_rec(task, node, shard).ok(task, node, shard)

    def ingest(self, task: str, epoch: int = 1, node: str = "n1", shard: int = 0) -> H:
        """The owner copies an inbox task into its log (with the inbox record after it)."""
        self.enq_rec(task, epoch, node, shard, snerdVia="n2")
        fields = {"snerdKind": "inbox", "node": "n2", "offset": 1, "snerdEpoch": epoch}
        return self.rec({**fields, "snerdNode": node}, shard, node)

    def start(self, node: str = "n1", epoch: int = 1, shard: int = 0) -> H:
        return self.claim(epoch, node, shard).belief(True, node, shard)

    def acked(self, task: str, node: str = "n1", epoch: int = 1, shard: int = 0, **attrs: Any) -> H:
        """Invoke, durable enqueue record, ok."""
        return (
            self.invoke(task, node, **attrs).enq_rec(task, epoch, node, shard).ok(task, node, shard)
        )

    def run(
        self,
        task: str,
        attempt: int = 1,
        node: str = "n1",
        epoch: int = 1,
        shard: int = 0,
        finish: bool = True,
        issued_ago: int = MS // 2,
    ) -> H:
        """Dispatch record, execute, handler done, tombstone."""
        self.dispatch(task, attempt, epoch, node, shard, issued_ago)
        self.execute(task, attempt, node, shard, epoch)
        self.done(task, attempt, node)
        return self.tomb(task, epoch, node, shard) if finish else self

    def life(self, task: str, **kw: Any) -> H:
        return self.acked(task, **kw).run(task)

    def end(self) -> H:
        return self.add("end")

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.entries


def kinds(violations: list[checker.Violation]) -> list[str]:
    return [v.kind for v in violations]


# ---------------------------------------------------------------------------- whole runs


def test_a_clean_run_passes_with_metrics() -> None:
    h = H().start().life("t-1").life("t-2").acked("t-3").run("t-3", finish=False)
    h.retry_rec("t-3", 1).run("t-3", attempt=2).end()
    report = check(h.history)
    assert report.ok, report.describe()
    m = report.metrics
    assert (m.acked, m.finished, m.executions, m.re_executions, m.max_attempts) == (3, 3, 4, 0, 2)
    assert m.belief_overlap_us == 0 and m.fenced_records == 0
    assert report.describe().startswith("OK: 0 violation(s)")


def test_report_lists_every_check_s_violations_in_history_order() -> None:
    h = H().start().acked("t-1").execute("t-9").end()
    report = check(h.history)
    assert not report.ok
    assert kinds(list(report.violations)) == [LOST_TASK, INVENTED_TASK, STALE_OWNER_ACTED]
    assert [v.index for v in report.violations] == sorted(v.index for v in report.violations)
    assert "FAILED: 3 violation(s)" in report.describe()


def test_malformed_histories_are_the_recorder_s_fault() -> None:
    with pytest.raises(HistoryError, match="params"):
        check([{"t": 0, "kind": "end"}])
    h = H().start()
    h.entries.append({"t": 1, "kind": "end"})
    with pytest.raises(HistoryError, match="back in time"):
        check(h.history)
    with pytest.raises(HistoryError, match="without an invoke"):
        check(H().ok("t-1").history)
    with pytest.raises(HistoryError, match="'attempt'"):
        check(H().add("execute", task="t-1", node="n1", shard=0, epoch=1).history)
    with pytest.raises(HistoryError, match="no fingerprint"):
        check(H().invoke("t-1").ok("t-1", deduplicated=True).history)


def test_checker_stays_pure() -> None:
    """It must run on a jepsen-lite history too: no shell, no clocks, no randomness (in any
    module of the package)."""
    sources = sorted(pathlib.Path(checker.__file__).parent.glob("*.py"))
    assert len(sources) > 1
    imported: set[str] = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    simulator = {"sim.world", "sim.fs", "sim.shell", "sim.faults", "sim.workload", "sim.clock"}
    forbidden = {"os", "time", "random", "trio"} | simulator | {"sim.process", "sim.settings"}
    assert not imported & forbidden
    assert not any(m.startswith("snerd.io") for m in imported)


# ---------------------------------------------------------------------------- 1. at-least-once


def test_lost_acked_task_is_reported_and_unfinished() -> None:
    h = H().start().life("t-1").acked("t-17").end()
    v = check_at_least_once(h.history)
    assert kinds(v) == [LOST_TASK]
    assert "task t-17 acked by n1 at t=" in v[0].message
    assert "never completed or dead-lettered" in v[0].message
    assert unfinished(h.history) == ["t-17"]


def test_liveness_watch_follows_a_growing_history() -> None:
    h = H().start().acked("t-1").acked("t-2")
    watch = LivenessWatch()
    assert watch.unfinished(h.history) == ["t-1", "t-2"]
    h.run("t-2")
    assert watch.unfinished(h.history) == ["t-1"]
    h.run("t-1")
    assert watch.unfinished(h.history) == [] == unfinished(h.history)
    with pytest.raises(HistoryError, match="never shrinks"):
        watch.unfinished(h.history[:3])


def test_liveness_watch_sees_an_open_ack_covered_by_its_fingerprint_or_its_inbox_twin() -> None:
    # It re-judges only the open acks whose task or fingerprint changed: a duplicate's ack is
    # closed by its original finishing, an undecided inbox ack by its twin.
    h = H().start().acked("t-1", fingerprint="f1")
    h.invoke("t-2", fingerprint="f1").ok("t-2", deduplicated=True)
    h.acked("t-3", fingerprint="f3")
    h.invoke("t-4", "n2", fingerprint="f3").inbox_rec("t-4").ok("t-4", "n2", undecided=True)
    h.acked("t-5")
    watch = LivenessWatch()
    assert watch.unfinished(h.history) == ["t-1", "t-2", "t-3", "t-4", "t-5"]
    h.run("t-1")
    assert watch.unfinished(h.history) == ["t-3", "t-4", "t-5"] == unfinished(h.history)
    h.run("t-3")
    assert watch.unfinished(h.history) == ["t-5"] == unfinished(h.history)
    assert watch.unfinished(h.history) == ["t-5"]  # nothing new: the same answer
    h.run("t-5")
    assert watch.unfinished(h.history) == [] == unfinished(h.history)


def test_dead_letter_counts_as_finished() -> None:
    h = H(fence=True).start().acked("t-1", max_retries=0).run("t-1", finish=False)
    h.tomb("t-1", outcome="dead_letter").add("dead_letter", task="t-1", node="n1").end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert report.metrics.dead_letters == 1 and unfinished(h.history) == []


def test_a_fenced_tombstone_does_not_finish_a_task() -> None:
    def run(fence: bool) -> list[dict[str, Any]]:
        h = H(fence=fence).start().acked("t-1").dispatch("t-1").execute("t-1")
        h.claim(2, "n2").tomb("t-1", epoch=1)  # the stale owner's tombstone follows the claim
        return h.end().history

    v = check_at_least_once(run(True))
    assert kinds(v) == [LOST_TASK]
    assert "was fenced: epoch 1 < 2" in v[0].message
    # Without fencing the stale tombstone is part of the state: the task is finished, and the
    # out-of-order transition is what gets reported.
    assert kinds(list(check(run(False)).violations)) == [DOUBLE_OWNERSHIP]


def test_unacked_enqueues_need_not_finish() -> None:
    h = H().start().invoke("t-1").add("enqueue", phase="fail", task="t-1", node="n1")
    h.invoke("t-2").enq_rec("t-2").add("enqueue", phase="info", task="t-2", node="n1")
    assert check(h.end().history).ok


def test_deduplicated_ack_is_covered_by_its_fingerprint_finishing() -> None:
    h = H().start().acked("t-1", fingerprint="f1")
    h.invoke("t-2", fingerprint="f1").ok("t-2", deduplicated=True)
    good = h.copy().run("t-1").end()
    assert check(good.history).ok, check(good.history).describe()
    v = check_at_least_once(h.end().history)
    assert kinds(v) == [LOST_TASK, LOST_TASK]
    assert "duplicate of fingerprint f1" in v[1].message
    assert unfinished(h.history) == ["t-1", "t-2"]


def test_a_reused_id_must_finish_again() -> None:
    h = H().start().life("t-1").acked("t-1").end()
    assert kinds(check_at_least_once(h.history)) == [LOST_TASK]
    h = H().start().life("t-1").life("t-1").end()
    assert check(h.history).ok


def test_invented_tasks_are_reported_once() -> None:
    h = H().start().enq_rec("ghost").dispatch("ghost").execute("ghost").end()
    v = check_at_least_once(h.history)
    assert kinds(v) == [INVENTED_TASK]
    assert "task ghost appears in an accepted task record in shard 0" in v[0].message
    h = H().start().execute("ghost").end()
    assert "an execute on n1" in check_at_least_once(h.history)[0].message


def test_a_fenced_record_of_an_unknown_task_is_not_invented() -> None:
    h = H().start().claim(2, "n2").enq_rec("ghost", epoch=1).end()
    assert check_at_least_once(h.history) == []


# ---------------------------------------------------------------------------- 2. ownership


def test_stale_epoch_record_after_a_claim_is_accepted_without_fencing() -> None:
    def run(fence: bool) -> H:
        h = H(fence=fence).start().acked("t-1")
        h.claim(2, "n2").enq_rec("t-2", epoch=1)  # n1, stale, writes under epoch 1
        return h.end()

    fenced = check(run(True).history)
    assert not any(v.kind == DOUBLE_OWNERSHIP for v in fenced.violations)
    assert fenced.metrics.fenced_records == 1
    v = check_ownership(run(False).history)
    assert kinds(v) == [DOUBLE_OWNERSHIP]
    assert "under epoch 1 was accepted after the claim of epoch 2" in v[0].message
    assert check(run(False).history).metrics.fenced_records == 0


def test_a_stale_claim_is_fenced_or_out_of_order() -> None:
    h = H(fence=True).start().claim(3, "n2").claim(2, "n3").end()
    assert check_ownership(h.history) == []
    h = H(fence=False).start().claim(3, "n2").claim(2, "n3").end()
    assert kinds(check_ownership(h.history)) == [DOUBLE_OWNERSHIP]


def test_two_nodes_claiming_one_epoch() -> None:
    h = H().start().claim(2, "n2").claim(2, "n3").end()
    v = check_ownership(h.history)
    assert kinds(v) == [DOUBLE_OWNERSHIP]
    assert "epoch 2 claimed by n2" in v[0].message and "again by n3" in v[0].message


def test_one_node_rewriting_its_claim_is_no_double_ownership() -> None:
    h = H().start().claim(2, "n2").claim(2, "n2").claim(1, "n2", shard=1).end()
    assert check_ownership(h.history) == []


def test_a_record_under_someone_else_s_epoch() -> None:
    h = H().start().claim(2, "n2").enq_rec("t-1", epoch=2, node="n3")
    h.enq_rec("t-2", epoch=2, node="n3").end()  # reported once per (shard, epoch, node)
    v = check_ownership(h.history)
    assert kinds(v) == [DOUBLE_OWNERSHIP]
    assert "n3 wrote an accepted task record under epoch 2, which n2 claimed" in v[0].message


# ---------------------------------------------------------------------------- 3. fenced acts


def test_execute_based_on_a_fenced_dispatch() -> None:
    h = H().start().acked("t-1").claim(2, "n2").dispatch("t-1", epoch=1).execute("t-1")
    v = check_fenced_acts(h.end().history)
    assert kinds(v) == [STALE_OWNER_ACTED]
    assert "stale owner acted: n1 executed task t-1 attempt 1 under epoch 1" in v[0].message
    assert "fenced by the claim of epoch 2" in v[0].message


def test_execute_needs_a_matching_dispatch_durable_before_it() -> None:
    h = H().start().acked("t-1").execute("t-1").dispatch("t-1").end()
    assert "no dispatch record" in check_fenced_acts(h.history)[0].message
    h = H().start().acked("t-1").dispatch("t-1", attempt=2).execute("t-1", attempt=1).end()
    assert kinds(check_fenced_acts(h.history)) == [STALE_OWNER_ACTED]
    h = H().start().claim(2, "n2").acked("t-1", epoch=2, node="n2")
    h.dispatch("t-1", epoch=2, node="n2").execute("t-1", node="n2", epoch=1).end()
    assert kinds(check_fenced_acts(h.history)) == [STALE_OWNER_ACTED]


def test_a_new_owner_re_running_an_attempt_is_fine() -> None:
    h = H().start().acked("t-1").dispatch("t-1").execute("t-1")
    h.claim(2, "n2").run("t-1", node="n2", epoch=2).end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert report.metrics.re_executions == 1


def test_ack_before_the_enqueue_record_is_durable() -> None:
    h = H().start().invoke("t-1").ok("t-1").enq_rec("t-1").run("t-1").end()
    v = check_fenced_acts(h.history)
    assert kinds(v) == [ACK_NOT_DURABLE]
    assert "no enqueue record of it in shard 0 was durable by then" in v[0].message


def test_ack_on_a_fenced_enqueue_record() -> None:
    h = H().start().invoke("t-1").claim(2, "n2").enq_rec("t-1", epoch=1).ok("t-1").end()
    v = check_fenced_acts(h.history)
    assert kinds(v) == [ACK_NOT_DURABLE]
    assert "was fenced (epoch 1 < 2)" in v[0].message


def test_ack_naming_the_wrong_shard() -> None:
    h = H().start().invoke("t-1").enq_rec("t-1").ok("t-1", shard=1).end()
    assert kinds(check_fenced_acts(h.history)) == [ACK_NOT_DURABLE]


# ---------------------------------------------------------------------------- inbox acks


def test_an_ack_via_an_inbox_is_durable_by_its_inbox_record_and_must_still_finish() -> None:
    h = H().start().via_inbox("t-1").ingest("t-1").run("t-1").end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert (report.metrics.acked, report.metrics.inbox_acked, report.metrics.finished) == (1, 1, 1)
    # Durable in the inbox but never ingested (or ingested and lost): a lost task.
    lost = H().start().via_inbox("t-1").end()
    assert check_fenced_acts(lost.history) == []
    assert kinds(check_at_least_once(lost.history)) == [LOST_TASK]
    assert unfinished(lost.history) == ["t-1"]
    stuck = H().start().via_inbox("t-1").ingest("t-1").end()
    assert kinds(check_at_least_once(stuck.history)) == [LOST_TASK]


def test_an_inbox_ack_needs_its_inbox_record_durable_first_in_that_shard_by_that_node() -> None:
    early = H().start().invoke("t-1", "n2").ok("t-1", "n2").inbox_rec("t-1").run("t-1").end()
    assert kinds(check_fenced_acts(early.history)) == [ACK_NOT_DURABLE]
    other_node = H().start().invoke("t-1", "n2").inbox_rec("t-1", node="n3").ok("t-1", "n2")
    assert kinds(check_fenced_acts(other_node.end().history)) == [ACK_NOT_DURABLE]
    other_shard = H().start().invoke("t-1", "n2").inbox_rec("t-1", shard=1).ok("t-1", "n2")
    assert kinds(check_fenced_acts(other_shard.end().history)) == [ACK_NOT_DURABLE]
    before_invoke = H().start().inbox_rec("t-1").invoke("t-1", "n2").ok("t-1", "n2")
    assert kinds(check_fenced_acts(before_invoke.end().history)) == [ACK_NOT_DURABLE]
    assert check(H().start().via_inbox("t-1").ingest("t-1").run("t-1").end().history).ok
    # A recorder may list an inbox record after the ack it preceded at the same instant.
    h = H().start().invoke("t-1", "n2").ok("t-1", "n2")
    h.t -= MS
    h.inbox_rec("t-1").ingest("t-1").run("t-1")
    report = check(h.end().history)
    assert report.ok and report.metrics.inbox_acked == 1, report.describe()


def test_an_undecided_inbox_ack_is_covered_by_its_twin_and_a_decided_one_is_not() -> None:
    # The owner drops an inbox task with auto_dedupe while its twin is pending: an ack sent
    # before it decided (`"deduplicated": null`) promised nothing, and the twin covers it.
    def undecided(h: H, task: str, **attrs: Any) -> H:
        h.invoke(task, "n2", **attrs).inbox_rec(task)
        return h.ok(task, "n2", undecided=True)

    h = undecided(H().start().acked("t-1", fingerprint="f1"), "t-2", fingerprint="f1")
    report = check(h.copy().run("t-1").end().history)
    assert report.ok, report.describe()
    # Not without a fingerprint.
    plain = undecided(H().start().acked("t-1", fingerprint="f1"), "t-2").run("t-1")
    assert kinds(check_at_least_once(plain.end().history)) == [LOST_TASK]
    # A decided plain ack said it was taken in: its twin does not cover it.
    decided = H().start().acked("t-1", fingerprint="f1").via_inbox("t-2", fingerprint="f1")
    assert kinds(check_at_least_once(decided.run("t-1").end().history)) == [LOST_TASK]
    # A task acked through the log itself is not let off by its twin either.
    direct = H().start().acked("t-1", fingerprint="f1").acked("t-2", fingerprint="f1")
    assert kinds(check_at_least_once(direct.run("t-1").end().history)) == [LOST_TASK]


# ---------------------------------------------------------------------------- 10. dedupe honesty


def test_a_plain_ack_of_an_inbox_enqueue_dropped_as_a_duplicate_is_untold() -> None:
    # Upstream's ack at the inbox write: the owner then dropped it against its live twin.
    h = H().start().acked("t-1", fingerprint="f1").via_inbox("t-2", fingerprint="f1")
    h.run("t-1").end()
    v = check_dedupe_honesty(h.history)
    assert kinds(v) == [UNTOLD_DUPLICATE]
    assert "task t-2 (fingerprint f1) acked by n2" in v[0].message
    assert [x.kind for x in check(h.history).violations] == [UNTOLD_DUPLICATE, LOST_TASK]
    # Taken in by the owner, it is a task of its own; undecided, it promised nothing.
    taken = H().start().acked("t-1", fingerprint="f1").via_inbox("t-2", fingerprint="f1")
    taken.ingest("t-2").run("t-1").run("t-2").end()
    assert check(taken.history).ok, check(taken.history).describe()
    h = H().start().acked("t-1", fingerprint="f1").invoke("t-2", "n2", fingerprint="f1")
    h.inbox_rec("t-2").ok("t-2", "n2", undecided=True).run("t-1").end()
    assert check_dedupe_honesty(h.history) == [] and check(h.history).ok


def test_a_deduplicated_ack_has_no_task_of_its_own_and_names_a_twin_with_its_fingerprint() -> None:
    def dup(twin: str | None, *, own: bool = False) -> H:
        h = H().start().acked("t-1", fingerprint="f1").acked("t-3", fingerprint="f3")
        h.invoke("t-2", "n2", fingerprint="f1")
        if own:
            h.enq_rec("t-2")
        extra = {} if twin is None else {"duplicate_of": twin}
        return h.ok("t-2", "n2", deduplicated=True, **extra).run("t-1").run("t-3").end()

    assert check(dup("t-1").history).ok, check(dup("t-1").history).describe()
    assert check(dup(None).history).ok  # an older history: no twin recorded
    for wrong in ("t-3", "t-2", "nobody"):
        v = check_dedupe_honesty(dup(wrong).history)
        assert kinds(v) == [FALSE_DUPLICATE], wrong
        assert f"of {wrong}, which is not another task with that fingerprint" in v[0].message
    v = check_dedupe_honesty(dup("t-1", own=True).history)
    assert kinds(v) == [FALSE_DUPLICATE] and "has a task of its own" in v[0].message


def test_a_plain_ack_without_a_fingerprint_is_not_judged_for_honesty() -> None:
    h = H().start().via_inbox("t-1").end()
    assert check_dedupe_honesty(h.history) == []


# ---------------------------------------------------------------------------- 11. schedule runs

RUN = "s0@2027-01-15T08:00:05.000000Z"


def fire(h: H, run: str = RUN, node: str = "n1", epoch: int = 1, retries: int = 0) -> H:
    """A schedule's fire: its run's enqueue record and the schedule's record, as one append."""
    h.enq_rec(run, epoch, node, snerdSchedule="s0", maxRetries=retries)
    return h.rec({"snerdKind": "schedule", "name": "s0", "snerdEpoch": epoch}, 0, node)


def removal(h: H, node: str = "n1", epoch: int = 1) -> H:
    return h.rec(
        {"snerdKind": "schedule", "name": "s0", "removed": True, "snerdEpoch": epoch}, 0, node
    )


def test_a_schedule_run_has_no_invoke_and_is_neither_invented_nor_owed() -> None:
    h = fire(H().start()).run(RUN).end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert report.metrics.schedule_runs == 1 and report.metrics.acked == 0
    # Unfinished, it is owed to nobody: no client was told of it.
    assert check(fire(H().start()).end().history).ok
    assert unfinished(fire(H().start()).end().history) == []
    # A task record without `snerdSchedule` and no invoke is still invented.
    bare = H().start().enq_rec(RUN).end()
    assert kinds(check_at_least_once(bare.history)) == [INVENTED_TASK]


def test_a_tick_fired_again_after_its_run_finished_or_while_it_is_live() -> None:
    # A new owner (n2) fires the tick again: after its run finished, or while it is live.
    for h in (
        fire(H().start()).run(RUN).claim(2, "n2"),
        fire(H().start()).claim(2, "n2"),
    ):
        fire(h, node="n2", epoch=2).end()
        v = check_schedule_runs(h.history)
        assert kinds(v) == [TICK_FIRED_TWICE], h.history
        assert f"run {RUN} enqueued again by n2" in v[0].message
        assert "its tick fired twice" in v[0].message
    # A removal of the schedule between the two: a schedule declared anew may fire it again.
    h = fire(H().start()).run(RUN)
    removal(h)
    assert check(fire(h).run(RUN).end().history).ok
    # A creation fenced by a newer claim is not part of the state.
    h = fire(H().start()).run(RUN).claim(2, "n2")
    assert check_schedule_runs(fire(h, node="n1", epoch=1).end().history) == []


def test_a_schedule_run_keeps_to_its_budget_and_counts_crash_re_executions() -> None:
    h = fire(H().start(), retries=0).dispatch(RUN).execute(RUN)
    h.add("crash", node="n1").claim(2, "n2").dispatch(RUN, epoch=2, node="n2")
    h.execute(RUN, node="n2", epoch=2).tomb(RUN, epoch=2, node="n2").end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert report.metrics.re_executions == 1
    over = fire(H().start(), retries=0).run(RUN, finish=False).retry_rec(RUN, 1)
    over.run(RUN, attempt=2).end()
    v = check_attempts(over.history)
    assert kinds(v) == [ATTEMPTS_EXCEEDED] and "max_retries=0 allows 1" in v[0].message


# ---------------------------------------------------------------------------- 4. attempts


def test_attempts_over_budget() -> None:
    h = H().start().acked("t-1", max_retries=1).run("t-1", finish=False).retry_rec("t-1", 1)
    h.run("t-1", attempt=2, finish=False).retry_rec("t-1", 2).run("t-1", attempt=3).end()
    v = check_attempts(h.history)
    assert kinds(v) == [ATTEMPTS_EXCEEDED]
    assert "task t-1 ran attempt 3" in v[0].message and "allows 2" in v[0].message
    assert check(h.history).metrics.max_attempts == 3


def test_an_attempt_number_above_the_budget() -> None:
    h = H().start().acked("t-1", max_retries=0).run("t-1", attempt=2).end()
    assert kinds(check_attempts(h.history)) == [ATTEMPTS_EXCEEDED]


def test_crash_re_executions_use_no_attempt() -> None:
    h = H().start().acked("t-1", max_retries=0).dispatch("t-1").execute("t-1")
    h.add("crash", node="n1").add("restart", node="n1").claim(2).belief(True)
    h.run("t-1", epoch=2).end()
    report = check(h.history)
    assert report.ok, report.describe()
    assert (report.metrics.executions, report.metrics.re_executions) == (2, 1)


def test_cron_tasks_are_not_judged_on_attempts() -> None:
    h = H().start().acked("t-1", max_retries=0, cron="* * * * *")
    for _ in range(3):
        h.run("t-1", finish=False)
    assert check_attempts(h.end().history) == []


# ---------------------------------------------------------------------------- 5. rate windows


def grouped(h: H, tasks: list[str], times: list[int], m: int = 2) -> H:
    for task in tasks:
        h.acked(task, group="g", max_per_minute=m)
    for task, t in zip(tasks, times, strict=True):
        h.at(t).run(task)
    return h.end()


def test_rate_window_exceeded() -> None:
    h = grouped(H().start(), ["a", "b", "c"], [1 * SECOND, 2 * SECOND, 50 * SECOND])
    v = check_rate_windows(h.history)
    assert kinds(v) == [RATE_EXCEEDED]
    assert "group g (max_per_minute=2): 3 first executions within 49.000 s" in v[0].message


def test_rate_window_respected() -> None:
    h = grouped(
        H().start(), ["a", "b", "c", "d"], [1 * SECOND, 2 * SECOND, 62 * SECOND, 63 * SECOND]
    )
    assert check_rate_windows(h.history) == []


def test_rate_window_within_slack_is_not_a_violation() -> None:
    times = [1 * SECOND, 2 * SECOND, 60 * SECOND + 500 * MS]  # 59.5 s apart
    assert (
        check_rate_windows(grouped(H(slack_us=SECOND).start(), ["a", "b", "c"], times).history)
        == []
    )
    assert kinds(
        check_rate_windows(grouped(H(slack_us=0).start(), ["a", "b", "c"], times).history)
    ) == [RATE_EXCEEDED]


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=40 * SECOND), min_size=1, max_size=8),
    m=st.integers(min_value=1, max_value=3),
    slack=st.integers(min_value=0, max_value=5 * SECOND),
)
def test_rate_window_law(gaps: list[int], m: int, slack: int) -> None:
    """Flagged exactly when some half-open window of 60 s less the slack, starting at a first
    execution, holds more than `m` first executions (brute force)."""
    h = H(slack_us=slack).start()
    tasks = [f"t-{i}" for i in range(len(gaps))]
    for task in tasks:
        h.acked(task, group="g", max_per_minute=m)
    t = SECOND
    for task, gap in zip(tasks, gaps, strict=True):
        t += gap + 10 * MS
        h.at(t).dispatch(task).execute(task)
    times = [e["t"] for e in h.history if e["kind"] == "execute"]
    window = 60 * SECOND - slack
    over = any(sum(1 for u in times if s <= u < s + window) > m for s in times)
    assert bool(check_rate_windows(h.end().history)) == over


def test_rate_window_counts_crash_re_executions_once() -> None:
    h = H().start()
    for task in ["a", "b"]:
        h.acked(task, group="g", max_per_minute=2)
    h.at(SECOND).dispatch("a").execute("a").claim(2, "n2").run("a", node="n2", epoch=2)
    h.at(2 * SECOND).run("b", node="n2", epoch=2)
    report = check(h.end().history)
    assert report.ok, report.describe()


# ---------------------------------------------------------------------------- 6. priority


def inversion(**tweak: Any) -> H:
    """n1 acks B (urgency 5), then, with nothing else happening, dispatches and runs A
    (urgency 1, acked earlier). `tweak` plants near-misses at the marked points."""
    h = H().start()
    h.acked("A", urgency=1, **tweak.get("a_attrs", {}))
    h.acked(
        "B", urgency=tweak.get("ub", 5), shard=tweak.get("b_shard", 0), **tweak.get("b_attrs", {})
    )
    for step in tweak.get("between", []):
        step(h)
    h.run("A", issued_ago=tweak.get("issued_ago", MS // 2))
    h.run("B")
    return h.end()


def test_planted_priority_inversion_is_caught() -> None:
    v = check_priority(inversion().history)
    assert kinds(v) == [PRIORITY_INVERSION]
    assert "n1 dispatched task A (urgency 1)" in v[0].message
    assert "task B (urgency 5, same type, shard 0)" in v[0].message


def _other_runs(h: H) -> None:
    h.acked("C", urgency=9).run("C")


@pytest.mark.parametrize(
    "tweak",
    [
        pytest.param({"ub": 1}, id="equal-urgency"),
        pytest.param({"b_attrs": {"type": "sms"}}, id="other-type"),
        pytest.param({"b_attrs": {"pool": "slow"}}, id="other-pool"),
        pytest.param({"b_attrs": {"delay_us": SECOND}}, id="b-delayed"),
        pytest.param({"b_attrs": {"parents": ["A"]}}, id="b-has-parents"),
        pytest.param({"b_attrs": {"group": "g"}}, id="b-rate-limited"),
        pytest.param({"a_attrs": {"group": "g"}}, id="a-rate-limited"),
        pytest.param({"b_shard": 1}, id="other-shard"),
        pytest.param({"between": [_other_runs]}, id="another-execute-between"),
        pytest.param(
            {"between": [lambda h: h.belief(False).belief(True)]}, id="belief-change-between"
        ),
        pytest.param(
            {"between": [lambda h: h.add("pause", node="n1").add("resume", node="n1")]},
            id="pause-between",
        ),
        pytest.param({"between": [lambda h: h.add("clock_step")]}, id="world-clock-step"),
        pytest.param(
            {"between": [lambda h: h.dispatch("B", issued_ago=0)]}, id="b-dispatched-first"
        ),
        pytest.param({"issued_ago": 3 * MS}, id="a-issued-before-b-acked"),
        pytest.param({"between": [lambda h: h.rec({"x": 1}, issued_ago=5 * MS)]}, id="writer-busy"),
    ],
)
def test_priority_near_misses_are_not_flagged(tweak: dict[str, Any]) -> None:
    assert check_priority(inversion(**tweak).history) == []


def test_priority_ignores_tasks_acked_via_an_inbox() -> None:
    # B went into n1's own inbox (its shard was still loading there): it is not ready on n1
    # until n1 ingests it, so A running first passes nothing over.
    h = H().start().acked("A", urgency=1).via_inbox("B", node="n1", urgency=5)
    assert check_priority(h.copy().run("A").ingest("B").run("B").end().history) == []
    # An inbox append still in n1's writer (durable after B's ack) may hold A's dispatch up.
    h = H().start().acked("A", urgency=1).acked("B", urgency=5)
    h.add("inbox_record", shard=1, node="n1", fields={"taskId": "C"}, offset=0, t_issue=0)
    h.run("A").run("B").end()
    assert check_priority(h.history) == []
    # The planted inversion itself is still caught.
    assert kinds(check_priority(inversion().history)) == [PRIORITY_INVERSION]


def test_priority_ignores_acks_on_other_nodes_and_retries() -> None:
    h = H().start().start("n2", epoch=1, shard=1).acked("A", urgency=1)
    h.acked("B", node="n2", urgency=5, shard=1, epoch=1).run("A").end()
    assert check_priority(h.history) == []
    h = H().start().acked("A", urgency=1).run("A", finish=False).retry_rec("A", 1)
    h.acked("B", urgency=5).run("A", attempt=2).run("B").end()
    assert check_priority(h.history) == []


# ---------------------------------------------------------------------------- 7. dedupe


def test_dedupe_twins_are_reported() -> None:
    twin: dict[str, Any] = {"autoDedupe": True, "payloadHash": "abc"}
    h = H().start().invoke("t-1").enq_rec("t-1", **twin).invoke("t-2").enq_rec("t-2", **twin)
    v = check_dedupe(h.end().history)
    assert kinds(v) == [DUPLICATE_PENDING]
    assert "task t-2 became pending" in v[0].message and "task t-1" in v[0].message


@pytest.mark.parametrize(
    "case", ["after-tombstone", "no-autodedupe", "other-shard", "fenced", "same-task-retried"]
)
def test_dedupe_near_misses(case: str) -> None:
    twin: dict[str, Any] = {"autoDedupe": True, "payloadHash": "abc"}
    h = H().start().start("n2", shard=1).invoke("t-1").enq_rec("t-1", **twin).invoke("t-2")
    if case == "after-tombstone":
        h.tomb("t-1").enq_rec("t-2", **twin)
    elif case == "no-autodedupe":
        h.enq_rec("t-2", payloadHash="abc")
    elif case == "other-shard":
        h.enq_rec("t-2", node="n2", shard=1, **twin)
    elif case == "fenced":
        h.claim(2, "n2").enq_rec("t-2", epoch=1, **twin)
    else:
        h.rec({"taskId": "t-1", "retryCount": 1, "snerdEpoch": 1, **twin})
    assert check_dedupe(h.end().history) == []


# ---------------------------------------------------------------------------- 8. belief


def overlapping(assumptions_hold: bool) -> H:
    h = H(assumptions_hold=assumptions_hold).at(SECOND).start()
    h.at(5 * SECOND).belief(True, "n2").at(7 * SECOND).belief(False, "n1")
    return h.at(9 * SECOND).end()


def test_belief_overlap_is_a_violation_when_the_assumptions_held() -> None:
    report = check(overlapping(True).history)
    v = [x for x in report.violations if x.kind == BELIEF_OVERLAP]
    assert len(v) == 1
    assert (
        "shard 0: n1 and n2 both believed they owned it from t=5.000000s to t=7.000000s"
        in v[0].message
    )
    assert report.metrics.belief_overlap_us == 2 * SECOND


def test_belief_overlap_is_only_measured_when_they_did_not() -> None:
    report = check(overlapping(False).history)
    assert report.ok
    assert report.metrics.belief_overlap_us == 2 * SECOND
    assert report.metrics.belief_overlap_us_by_shard == {0: 2 * SECOND}


def test_belief_ends_at_a_crash_and_a_hand_over_at_one_instant_is_no_overlap() -> None:
    h = H().at(SECOND).start().at(3 * SECOND).add("crash", node="n1")
    h.t -= MS
    h.belief(True, "n2").at(4 * SECOND).belief(False, "n2")
    h.t -= MS
    h.belief(True, "n3").end()
    assert check_belief(h.history) == []
    assert check(h.history).metrics.belief_overlap_us == 0


def test_a_belief_on_and_off_at_one_instant_is_no_belief() -> None:
    # Simulator seed 119: a node's belief in a shard began and ended at one instant; the
    # sweep took its end before its start and kept it believing to the end of the run.
    h = H().claim(1, "n0")
    h.add("belief", node="n0", shard=0, on=True)
    h.t -= MS  # the "off" at the same instant
    h.add("belief", node="n0", shard=0, on=False)
    h.at(40 * SECOND).claim(2, "n1").belief(True, "n1").end()
    assert check_belief(h.history) == []


def test_belief_left_on_lasts_to_the_end() -> None:
    h = H(assumptions_hold=False).at(SECOND).start().at(2 * SECOND).belief(True, "n2")
    h.belief(True, "n2").at(10 * SECOND).end()  # a repeated "on" changes nothing
    assert check(h.history).metrics.belief_overlap_us == 8 * SECOND


def test_priority_judges_a_dispatch_at_the_time_the_node_queued_it() -> None:
    # A's dispatch record was handed to n1's writer before B was acked, and written after
    # (the writer was busy with appends that left no record, say): n1 decided A's dispatch
    # before B was ready, so nothing was passed over.
    def queued_early(h: H) -> None:
        h.history[-1]["t_queued"] = h.history[-1]["t_issue"] - 3 * MS

    h = H().start().acked("A", urgency=1).acked("B", urgency=5)
    h.dispatch("A")
    queued_early(h)
    h.execute("A").done("A").tomb("A").run("B").end()
    assert check_priority(h.history) == []
    # Queued after B's ack, it is the planted inversion.
    h = H().start().acked("A", urgency=1).acked("B", urgency=5)
    h.dispatch("A")
    h.history[-1]["t_queued"] = h.history[-1]["t_issue"]
    h.execute("A").done("A").tomb("A").run("B").end()
    assert kinds(check_priority(h.history)) == [PRIORITY_INVERSION]


# ---------------------------------------------------------------------------- dependencies


def dead(h: H, task: str, shard: int = 0) -> H:
    """`task`'s tombstone says it was dead-lettered."""
    return h.tomb(task, shard=shard, outcome="dead_letter")


def test_a_child_that_runs_once_its_parent_completed_passes() -> None:
    h = H().start().start(shard=1).acked("c", parents=["p"]).life("p", shard=1)
    h.run("c")
    assert check_dependencies(h.history) == []
    assert check(h.history).ok


def test_a_child_that_runs_before_its_parent_completed_is_caught() -> None:
    h = H().start().start(shard=1).acked("c", parents=["p"]).acked("p", shard=1)
    h.run("c").run("p", shard=1)
    assert kinds(check_dependencies(h.history)) == [CHILD_RAN_EARLY]
    # A parent nobody enqueued never lets a child run either.
    g = H().start().acked("c", parents=["ghost"]).run("c")
    assert CHILD_RAN_EARLY in kinds(check_dependencies(g.history))


def test_a_parent_s_completion_counts_from_when_it_was_durable_not_where_it_is_listed() -> None:
    # Records are listed in file order, which may come after the execute they made possible.
    h = H().start().start(shard=1).acked("p", shard=1).acked("c", parents=["p"])
    h.dispatch("p", shard=1).execute("p", shard=1).done("p")
    durable = h.t + MS
    h.run("c").tomb("p", shard=1)
    # Its handler had returned: the child ran on a completion not durable yet (or lost).
    assert kinds(check_dependencies(h.history)) == [CHILD_RAN_ON_PENDING]
    h.entries[-1]["t_issue"] = durable - MS // 2  # written before the child ran ...
    [pending] = check_dependencies(h.history)
    assert pending.kind == CHILD_RAN_ON_PENDING and "durable only at" in pending.message
    h.entries[-1]["t_durable"] = durable - MS // 4  # ... and durable before it, too
    assert check_dependencies(h.history) == []


def test_children_of_a_dead_or_never_enqueued_parent_end_dead_lettered() -> None:
    h = H().start().acked("p").acked("c1", parents=["p"]).acked("c2", parents=["ghost"])
    h.dispatch("p").execute("p").done("p", ok=False)
    dead(dead(dead(h, "p"), "c1"), "c2")
    assert check_dependencies(h.history) == []
    assert check(h.history).ok
    # A child that completed without running (its tombstone is all the history shows).
    bad = H().start().acked("p").acked("c1", parents=["p"]).acked("c2", parents=["ghost"])
    dead(bad, "p").tomb("c1").tomb("c2")
    assert kinds(check_dependencies(bad.history)) == [CHILD_NOT_FAILED, CHILD_NOT_FAILED]


def test_a_child_of_parents_known_and_completed_must_not_end_unrun() -> None:
    h = H().start().start(shard=1).life("p", shard=1).acked("c", parents=["p"])
    dead(h, "c")
    assert kinds(check_dependencies(h.history)) == [CHILD_NOT_RUN]
    # Near miss: the child was sent before any record of its parent was durable (the node
    # may judge it unknown and dead-letter it after its bounded wait).
    early = H().start().start(shard=1).acked("c", parents=["p"]).life("p", shard=1)
    dead(early, "c")
    assert check_dependencies(early.history) == []
    # And a parent durable in an inbox file before the child was sent is known as well.
    inbox = H().start().start(shard=1).via_inbox("p", shard=1).acked("c", parents=["p"])
    inbox.ingest("p", shard=1).run("p", shard=1)
    dead(inbox, "c")
    assert kinds(check_dependencies(inbox.history)) == [CHILD_NOT_RUN]


def test_a_child_of_a_cancelled_parent_ends_dead_lettered() -> None:
    """A cancelled parent fails its children through, as a dead-lettered one does
    (docs/protocol.md, "Job control")."""
    h = H().start().acked("p").acked("c", parents=["p"]).tomb("p", outcome="cancelled")
    [v] = check_dependencies(h.copy().tomb("c").history)
    assert v.kind == CHILD_NOT_FAILED and "ended cancelled" in v.message
    assert check_dependencies(dead(h, "c").history) == []


def test_a_cancelled_child_is_not_left_waiting() -> None:
    """A child cancelled before its parents let it run ended by the app's word, not theirs."""
    h = H().start().start(shard=1).life("p", shard=1).acked("c", parents=["p"])
    assert check_dependencies(h.copy().tomb("c", outcome="cancelled").history) == []
    assert kinds(check_dependencies(dead(h, "c").history)) == [CHILD_NOT_RUN]


def test_a_child_failed_through_by_a_parent_retried_later_passes() -> None:
    """The parent was dead-lettered while the child waited; a retry put it back and it
    completed: the child had been failed through by the rule, and stays a dead letter."""
    h = H().start().start(shard=1).acked("p", shard=1)
    dead(h, "p", shard=1).acked("c", parents=["p"])
    dead(h, "c").enq_rec("p", shard=1).run("p", shard=1)
    assert check_dependencies(h.history) == []
    # Near miss: the parent was put back before the child was sent, and completed; the
    # child was failed through on a dead letter that was no longer the parent's state.
    early = H().start().start(shard=1).acked("p", shard=1)
    dead(early, "p", shard=1).enq_rec("p", shard=1).acked("c", parents=["p"])
    dead(early, "c").run("p", shard=1)
    assert kinds(check_dependencies(early.history)) == [CHILD_NOT_RUN]


def test_a_child_retried_once_its_parents_completed_must_run() -> None:
    """Each life of a child is judged: one put back by a retry after its parent completed
    must not end unrun again."""
    h = H().start().start(shard=1).acked("p", shard=1)
    dead(h, "p", shard=1).acked("c", parents=["p"])
    dead(h, "c").enq_rec("p", shard=1).run("p", shard=1).enq_rec("c")  # c retried
    [v] = check_dependencies(dead(h.copy(), "c").history)
    assert v.kind == CHILD_NOT_RUN and "by a retry" in v.message
    assert check_dependencies(h.copy().run("c").history) == []


def test_a_history_without_parents_has_no_dependency_to_judge() -> None:
    h = H().start().life("a").acked("b").run("b")
    for entry in h.history:
        entry.get("attrs", {}).pop("parents", None)  # an older recorder's invoke
    assert check_dependencies(h.history) == []


# ---------------------------------------------------------------------------- results


def _returned(h: H, task: str, attempt: int, value: Any) -> H:
    """A successful attempt of `task` that returned `value` (None: nothing)."""
    done: dict[str, Any] = {"task": task, "attempt": attempt, "node": "n1", "ok": True}
    if value is not None:
        done["result"] = value
    return h.add("handler_done", **done)


def _stored(h: H, task: str, value: Any) -> H:
    entry: dict[str, Any] = {"task": task, "shard": 0}
    if value is not None:
        entry["result"] = value
    return h.add("stored_result", **entry)


def test_a_stored_result_is_one_a_successful_attempt_returned() -> None:
    h = _returned(_returned(H().start(), "t-1", 1, {"a": 1}), "t-1", 2, [2])
    for value in ({"a": 1}, [2]):
        report = check(_stored(h.copy(), "t-1", value).end().history)
        assert report.ok, report.describe()
        assert report.metrics.stored_results == 1
    # Nothing returned, nothing stored: equal too.
    assert check_results(_stored(_returned(H().start(), "t-2", 1, None), "t-2", None).history) == []


def test_a_stored_result_nobody_returned_or_one_lost_is_a_wrong_result() -> None:
    h = _returned(H().start(), "t-1", 1, {"a": 1})
    for value in ({"a": 2}, None, {"a": 1.0}, {"wrong": {"a": 1}}):
        v = check_results(_stored(h.copy(), "t-1", value).end().history)
        assert kinds(v) == [WRONG_RESULT], value
        assert "task t-1 (shard 0) stores the result" in v[0].message
    # A result where the attempt returned nothing.
    h = _returned(H().start(), "t-2", 1, None)
    assert kinds(check_results(_stored(h, "t-2", True).history)) == [WRONG_RESULT]


def test_a_stored_result_of_a_task_with_no_success_recorded_is_not_judged() -> None:
    assert check_results(_stored(H().start(), "t-1", 5).end().history) == []
