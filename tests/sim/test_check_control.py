"""Invariants 13-15 (`sim.check.control`) on planted histories: each rule fails the history it
was planted for and passes its honest twin."""

from __future__ import annotations

from typing import Any

from sim.check import check
from sim.check.verdict import check_control
from tests.sim.test_checker import H

SECOND = 1_000_000


def command(h: H, action: str, node: str = "n2", **target: Any) -> H:
    return h.add("command", phase="invoke", action=action, node=node, **target)


def answer(h: H, action: str, reply: dict[str, Any], node: str = "n2", **target: Any) -> H:
    return h.add("command", phase="ok", action=action, node=node, reply=reply, **target)


def cancelled(h: H, task: str, done: bool = True, found: str = "queued") -> H:
    reply = {"action": "cancelled", "task_id": task, "found": found, "cancelled": done}
    return answer(h, "cancel", reply, task=task)


def kinds(h: H) -> list[str]:
    return [v.kind for v in check_control(h.history)]


def queued(task: str = "a") -> H:
    h = H().start().acked(task)
    return command(h, "cancel", task=task)


def test_an_acked_cancel_that_ended_the_task_passes() -> None:
    h = cancelled(queued().tomb("a", outcome="cancelled"), "a").end()
    assert kinds(h) == []
    assert check(h.history).ok


def test_a_task_acked_cancelled_then_dispatched_is_caught() -> None:
    h = cancelled(queued().tomb("a", outcome="cancelled"), "a").at(2 * SECOND)
    h.dispatch("a").execute("a").end()
    assert "cancelled_ran" in kinds(h)


def test_an_ack_without_a_cancelled_tombstone_is_caught() -> None:
    h = cancelled(queued(), "a").end()
    assert kinds(h) == ["cancel_not_kept"]
    h = cancelled(queued().tomb("a", outcome="cancelled"), "a").tomb("a").end()
    assert kinds(h) == ["cancel_not_kept"]  # ended again, completed


def test_an_attempt_running_at_the_ack_is_allowed_and_counted() -> None:
    h = H().start().acked("a").dispatch("a").execute("a")
    h = command(h, "cancel", task="a").tomb("a", outcome="cancelled")
    h = cancelled(h, "a", found="running").done("a").end()
    assert kinds(h) == []
    assert check(h.history).metrics.cancels_running == 1


def test_a_retry_sent_after_the_cancel_ends_its_judgement() -> None:
    h = cancelled(queued().tomb("a", outcome="cancelled"), "a")
    h = command(h, "retry", task="a").at(3 * SECOND).dispatch("a").execute("a").end()
    assert "cancelled_ran" not in kinds(h)


def test_unknown_and_not_cancelled_answers_are_not_judged() -> None:
    h = cancelled(queued(), "a", done=False, found="unknown").run("a").end()
    assert kinds(h) == []


def paused(h: H, key: str | None, pending: list[str] | None = None) -> H:
    h = command(h, "pause", type=key)
    reply = {"action": "paused", "task_type": key, "paused": True, "pending": pending or []}
    return answer(h, "pause", reply, type=key)


def test_a_task_of_a_paused_type_dispatched_before_a_resume_is_caught() -> None:
    h = paused(H().start().acked("a"), "email").at(2 * SECOND).run("a").end()
    assert kinds(h) == ["paused_ran"]
    h = paused(H().start().acked("a"), None).at(2 * SECOND).run("a").end()
    assert kinds(h) == ["paused_ran"]  # the whole queue


def test_a_pause_holds_only_until_a_resume_is_sent_and_only_its_type() -> None:
    h = paused(H().start().acked("a"), "email")
    h = command(h, "resume", type="email").run("a").end()
    assert kinds(h) == []
    assert kinds(paused(H().start().acked("a"), "sms").run("a").end()) == []
    assert kinds(paused(H().start().acked("a"), "email", ["shard-1"]).run("a").end()) == []


def test_a_pause_near_an_earlier_resume_is_not_judged() -> None:
    """A resume answered just before the pause was sent may carry a later stamp."""
    h = H().start().acked("a")
    h.add("control", offset_max_us=SECOND, drift_max_ppm=0, steps=False)
    h = command(h, "resume", type="email")
    reply = {"action": "paused", "task_type": "email", "paused": False, "pending": []}
    h = answer(h, "resume", reply, type="email")
    assert kinds(paused(h.copy(), "email").run("a").end()) == []
    far = h.copy().at(10 * SECOND)
    assert kinds(paused(far, "email").run("a").end()) == ["paused_ran"]


def test_a_node_stopped_while_the_pause_was_applied_is_not_judged() -> None:
    h = H().start().acked("a").add("pause", node="n1", us=SECOND)
    h = paused(h, "email").add("resume", node="n1").run("a").end()
    assert kinds(h) == []


def test_a_retried_task_must_run_again() -> None:
    h = H().start().acked("a").run("a")
    h = command(h, "retry", task="a")
    reply = {"action": "retried", "task_id": "a", "found": "dead_letter", "retried": True}
    h = answer(h, "retry", reply, task="a")
    assert kinds(h.copy().end()) == ["retry_not_run"]
    assert kinds(h.copy().run("a").end()) == []
    assert kinds(command(h.copy(), "cancel", task="a").end()) == []


def test_a_retried_child_failed_through_by_its_parents_is_left_to_invariant_9() -> None:
    """A child put back by a retry waits for its parents again, using no attempt; a dead
    parent fails it through at once, and that end is the dependency check's to judge."""

    def retried_child(error: str, *, put_back: bool = True) -> H:
        h = H().start().acked("p").dispatch("p").execute("p").done("p", ok=False)
        h.tomb("p", outcome="dead_letter").acked("c", parents=["p"])
        h.tomb("c", outcome="dead_letter")
        h = command(h, "retry", task="c")
        if put_back:
            h.enq_rec("c", triggerAfterIds=["p"])
        h.tomb("c", outcome="dead_letter")
        h.entries[-1]["fields"] |= {"triggerAfterIds": ["p"], "LastErrorObj": error}
        reply = {"action": "retried", "task_id": "c", "found": "dead_letter", "retried": True}
        return answer(h, "retry", reply, task="c").end()

    assert kinds(retried_child("blocked_by_failed_parent: p")) == []
    assert check(retried_child("blocked_by_failed_parent: p").history).ok
    # Near misses: an end of its own without an attempt, or no record putting it back.
    assert kinds(retried_child("boom")) == ["retry_not_run"]
    assert kinds(retried_child("blocked_by_failed_parent: p", put_back=False)) == [
        "retry_not_run"
    ]


def test_a_dead_letter_a_purge_forgot_is_not_owed_by_a_retry_of_its_type() -> None:
    """A purge answered with the shard pending is applied when an owner takes it in, maybe
    long after; a retry of the type that comes after that finds nothing to put back."""

    def swept(*, purged: bool) -> H:
        h = H().start().acked("a").tomb("a", outcome="dead_letter")
        h.add("dead_letter", task="a", node="n1")  # (its owner told its SDK)
        if purged:
            purge = {"snerdKind": "purge", "tasks": ["a"], "type": "email", "before": None}
            h.rec({**purge, "snerdNode": "n1", "snerdEpoch": 1})
        h = command(h, "retry_type", type="email")
        reply = {"action": "requeued", "task_type": "email", "count": 0, "pending": []}
        return answer(h, "retry_type", reply, type="email").end()

    assert kinds(swept(purged=False)) == ["retry_not_run"]
    assert kinds(swept(purged=True)) == []


def test_a_dead_letter_its_owner_had_not_told_of_is_not_owed_by_a_retry_of_its_type() -> None:
    """A tombstone in the file whose append its owner had not committed (the disk full, an
    fsync failed) is not a dead letter the owner holds: a retry of its type sent then owes
    nothing for it (jepsen-lite's disk-full run)."""

    def swept(*, told: bool) -> H:
        h = H().start().acked("a").tomb("a", outcome="dead_letter")
        if told:
            h.add("dead_letter", task="a", node="n1")
        h = command(h, "retry_type", type="email")
        reply = {"action": "requeued", "task_type": "email", "count": 0, "pending": []}
        return answer(h, "retry_type", reply, type="email").end()

    assert kinds(swept(told=True)) == ["retry_not_run"]
    assert kinds(swept(told=False)) == []
