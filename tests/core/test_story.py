"""`snerd.core.story`: a task's steps in order, stale records marked, and its details.

Records are built as the daemon writes them (a based record is a whole task record) and handed
over as a reader finds them (`Found`); `pick_story` is checked on encoded lines.
"""

from __future__ import annotations

from typing import Any

import orjson

from snerd.core.records import encode_record
from snerd.core.story import DETAIL_KEYS, LOG, STATES, STEP_KINDS, Found, details, pick_story, story
from snerd.core.timefmt import format_rfc3339

SECOND = 1_000_000
T0 = 1_800_000_000 * SECOND
NOW = T0 + 3600 * SECOND


def ts(s: int) -> str:
    return format_rfc3339(T0 + s * SECOND)


def task(task_id: str = "a", epoch: int = 1, node: str = "n1", **extra: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 2,
        "retryAfterHours": 0.0,
        "retryAfterTime": ts(0),
        "taskData": "{}",
        "taskType": "email",
        "executeAt": ts(0),
        "snerdNode": node,
        "snerdEpoch": epoch,
    }
    f.update(extra)
    return f


def dispatch(
    attempt: int, at: int, epoch: int = 1, node: str = "n1", task_id: str = "a"
) -> dict[str, Any]:
    return {
        "snerdKind": "dispatch", "task": task_id, "attempt": attempt, "at": ts(at),
        "snerdNode": node, "snerdEpoch": epoch,
    }


def claim(epoch: int, node: str, at: int) -> dict[str, Any]:
    return {"snerdKind": "claim", "epoch": epoch, "node": node, "at": ts(at)}


def log(*records: dict[str, Any], shard: int = 0) -> list[Found]:
    return [Found(shard, LOG, i * 100, r) for i, r in enumerate(records)]


def kinds(found: list[Found]) -> list[str]:
    return [s.kind for s in story(found)]


def test_two_attempts_then_completion_with_result() -> None:
    found = log(
        task(),
        dispatch(1, 10),
        task(retryCount=1, retryAfterTime=ts(70), LastErrorObj="boom"),
        dispatch(2, 71),
        task(retryCount=1, deletedAt=ts(72), snerdOutcome="completed", snerdResult={"sent": 3}),
    )
    steps = story(found)
    assert [s.kind for s in steps] == [
        "enqueued", "dispatched", "retry_scheduled", "dispatched", "completed"
    ]
    assert steps[1].attempt == 1 and steps[1].node == "n1" and steps[1].epoch == 1
    assert steps[2].error == "boom" and steps[2].due == ts(70) and steps[2].attempt == 1
    d = details("a", found, NOW)
    assert set(d) == set(DETAIL_KEYS)
    assert d["found"] is True
    assert d["state"] == "succeeded" and d["outcome"] == "completed"
    assert d["attempts"] == 2 and d["runs"] == 2
    assert d["result"] == {"sent": 3} and d["has_result"] is True
    assert d["enqueued_at"] == ts(0) and d["started_at"] == ts(71) and d["finished_at"] == ts(72)
    assert d["task_type"] == "email" and d["shard"] == 0 and d["max_retries"] == 2
    orjson.dumps(d)  # JSON-serialisable, as `get` sends it


def test_takeover_reruns_an_attempt_and_the_fenced_record_is_marked() -> None:
    found = log(
        claim(1, "n1", 0),
        task(),
        dispatch(1, 10, epoch=1, node="n1"),
        claim(2, "n2", 20),
        dispatch(1, 30, epoch=2, node="n2"),
        # n1 had not seen it lost the shard: its completion is fenced
        task(deletedAt=ts(31), snerdOutcome="completed", epoch=1, node="n1"),
        task(deletedAt=ts(40), snerdOutcome="completed", epoch=2, node="n2"),
    )
    steps = story(found)
    assert [s.kind for s in steps] == [
        "enqueued", "dispatched", "claimed", "dispatched", "completed", "completed"
    ]
    assert steps[2].node == "n2" and steps[2].epoch == 2
    assert "runs twice" in steps[3].note  # the same attempt started again, on n2
    assert steps[4].stale is not None and "epoch 1" in steps[4].stale
    assert all(s.stale is None for i, s in enumerate(steps) if i != 4)
    d = details("a", found, NOW)
    assert d["attempts"] == 1 and d["runs"] == 2 and d["stale_records"] == 1
    assert d["finished_at"] == ts(40)


def test_a_stale_dispatch_counts_as_a_run_not_an_attempt() -> None:
    found = log(
        claim(2, "n2", 0),
        task(epoch=2, node="n2"),
        dispatch(1, 10, epoch=1, node="n1"),
        dispatch(1, 11, epoch=2, node="n2"),
    )
    steps = story(found)
    assert steps[1].stale is not None and "fenced" in steps[1].note
    d = details("a", found, NOW)
    assert d["state"] == "running" and d["attempts"] == 1 and d["runs"] == 2


def test_claims_outside_the_tasks_span_are_left_out() -> None:
    found = log(claim(1, "n1", 0), task(), dispatch(1, 1), claim(2, "n2", 5))
    assert kinds(found) == ["enqueued", "dispatched"]


def test_dead_letter_then_replay_starts_a_new_life() -> None:
    dead = task(retryCount=3, deletedAt=ts(50), snerdOutcome="dead_letter", LastErrorObj="no")
    found = log(
        task(),
        dispatch(1, 1),
        dead,
        task(retryAfterTime=ts(60), executeAt=ts(60), snerdReplayedAt=ts(60)),
    )
    steps = story(found)
    assert [s.kind for s in steps] == ["enqueued", "dispatched", "dead_lettered", "replayed"]
    assert steps[2].error == "no" and steps[2].attempt == 3
    assert steps[3].at == ts(60)
    d = details("a", found, NOW)
    assert d["state"] == "queued" and d["attempts"] == 0 and d["runs"] == 0
    assert d["enqueued_at"] == ts(60) and d["outcome"] is None


def test_dead_letter_details() -> None:
    dead = task(retryCount=3, deletedAt=ts(50), snerdOutcome="dead_letter", LastErrorObj="no")
    d = details("a", log(task(), dispatch(1, 1), dead), NOW)
    assert d["state"] == "dead_letter" and d["outcome"] == "dead_letter"
    assert d["last_error"] == "no" and d["attempts"] == 3 and d["result"] is None


def test_cancelled() -> None:
    found = log(task(), task(deletedAt=ts(5), snerdOutcome="cancelled"))
    assert kinds(found) == ["enqueued", "cancelled"]
    d = details("a", found, NOW)
    assert d["state"] == "cancelled" and d["outcome"] == "cancelled" and d["has_result"] is False


def test_a_purged_dead_letter_says_purged_and_a_later_enqueue_under_its_id_lives() -> None:
    dead = task(deletedAt=ts(5), snerdOutcome="dead_letter", LastErrorObj="no")
    purge = {"snerdKind": "purge", "tasks": ["x", "a"], "at": ts(9), "snerdEpoch": 1}
    found = log(task(), dead, purge)
    assert kinds(found) == ["enqueued", "dead_lettered", "purged"]
    d = details("a", found, NOW)
    assert (d["found"], d["state"], d["shard"]) == (True, "purged", 0)
    assert details("a", log(task(), dead, purge, task()), NOW)["state"] == "queued"
    # A purge record of other ids is not part of the story; a succeeded task is not purged.
    other = {"snerdKind": "purge", "tasks": ["x"], "at": ts(9)}
    assert kinds(log(task(), dead, other)) == ["enqueued", "dead_lettered"]
    done = task(deletedAt=ts(5), snerdOutcome="completed")
    assert details("a", log(task(), done, purge), NOW)["state"] == "succeeded"


def test_live_states() -> None:
    assert details("a", log(task(executeAt=ts(7200))), NOW)["state"] == "delayed"
    assert details("a", log(task()), NOW)["state"] == "queued"
    assert details("a", log(task(triggerAfterIds=["p"])), NOW)["state"] == "blocked"
    assert details("a", log(task(), dispatch(1, 1)), NOW)["state"] == "running"
    retry = task(retryCount=1, retryAfterTime=ts(7200), LastErrorObj="x")
    d = details("a", log(task(), dispatch(1, 1), retry), NOW)
    assert d["state"] == "retrying" and d["last_error"] == "x" and d["attempts"] == 1


def test_cron_rearm() -> None:
    found = log(
        task(cronExpression="0 * * * * *"),
        dispatch(1, 1),
        task(cronExpression="0 * * * * *", executeAt=ts(60), retryAfterTime=ts(2)),
    )
    assert kinds(found) == ["enqueued", "dispatched", "cron_rearmed"]


def test_inbox_copy_comes_before_its_log_copy() -> None:
    written = task(node="n2")
    found = [
        Found(0, LOG, 0, claim(1, "n1", 0)),
        Found(0, "n2", 0, written),
        Found(0, LOG, 100, {**written, "snerdNode": "n1", "snerdVia": "n2"}),
        Found(0, LOG, 200, dispatch(1, 3)),
    ]
    steps = story(found)
    assert [s.kind for s in steps] == ["inbox", "taken_in", "dispatched"]
    assert steps[0].source == "n2" and steps[1].source == LOG
    d = details("a", found, NOW)
    assert d["enqueued_at"] == ts(0) and d["waiting_in_inbox"] is False


def test_inbox_copy_not_taken_in_yet() -> None:
    d = details("a", [Found(3, "n2", 0, task(node="n2"))], NOW)
    assert d["found"] and d["state"] == "queued" and d["waiting_in_inbox"] is True
    assert d["shard"] == 3 and d["task_type"] == "email"


def test_inbox_copy_dropped_at_ingest() -> None:
    mark = {
        "snerdKind": "inbox", "node": "n2", "offset": 500, "from": 0,
        "dropped": [{"task": "z", "at": 7, "of": "q"}, {"task": "a", "at": 0, "error": "bad"}],
    }
    found = [Found(0, "n2", 0, task(node="n2")), Found(0, LOG, 100, mark)]
    steps = story(found)
    assert [s.kind for s in steps] == ["inbox", "dropped"]
    assert steps[1].error == "bad"
    d = details("a", found, NOW)
    assert d["state"] == "dropped" and d["last_error"] == "bad"


def test_unknown_id() -> None:
    d = details("nope", [], NOW)
    assert d["found"] is False and d["state"] == "unknown" and set(d) == set(DETAIL_KEYS)
    assert story([]) == []


def test_records_of_other_ids_are_not_its_details() -> None:
    d = details("a", log(task("b")), NOW)
    assert d["found"] is False


def test_pick_story_keeps_the_ids_lines_and_claims() -> None:
    lines = [
        encode_record(claim(1, "n1", 0)),
        encode_record(task("b")),
        encode_record(task("a")),
        b"{not json\n",
        encode_record(dispatch(1, 1, task_id="b")),
        encode_record(dispatch(1, 1)),
        encode_record(task("ab")),
    ]
    data = b"".join(lines) + b'{"taskId":"a"'  # an unfinished last line
    records, consumed = pick_story(data, 1000, "a")
    starts = [1000 + sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    assert [r.offset for r in records] == [starts[0], starts[2], starts[5]]
    assert consumed == sum(len(x) for x in lines)


def test_vocabulary_is_stable() -> None:
    assert "dispatched" in STEP_KINDS and "cancelled" in STATES
    assert DETAIL_KEYS[0] == "task_id"


def test_a_copy_waiting_in_an_inbox_after_the_task_ended_is_said() -> None:
    found = [
        *log(task(), task(deletedAt=ts(5), snerdOutcome="completed")),
        Found(0, "n2", 0, task(node="n2")),
    ]
    assert kinds(found) == ["enqueued", "completed", "inbox"]
    d = details("a", found, NOW)
    assert d["state"] == "succeeded" and d["waiting_in_inbox"] is True
    taken = [*found, Found(0, LOG, 300, {**task(node="n1"), "snerdVia": "n2"})]
    d = details("a", taken, NOW)
    assert d["waiting_in_inbox"] is False and kinds(taken)[-2:] == ["inbox", "taken_in"]
