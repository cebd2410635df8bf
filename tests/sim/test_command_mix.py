"""The app's command mix (`sim.command_mix`), shared by the simulator and jepsen-lite: one seed
gives one sequence of commands, each line is one the daemon's parser takes, and replies are
matched to the oldest outstanding command of their node, action and target."""

from __future__ import annotations

import random

from sim.command_mix import OTHER_TYPE, CommandMix
from snerd.sdk.messages import check_control_message


def _commands(seed: int, n: int = 200) -> list[tuple[str, dict[str, object], dict[str, object]]]:
    mix = CommandMix(random.Random(seed), "t")
    mix.dead_letter("t3")
    out = []
    for i in range(n):
        action, target = mix.choose(last_task=i)
        sent = mix.send(action, target, ["a", "b", "c"], now=10_000_000 + i)
        assert sent is not None
        out.append((sent.entry["node"], sent.message, sent.entry))
    return out


def test_one_seed_one_sequence_and_every_line_parses() -> None:
    first = _commands(5)
    assert first == _commands(5)
    assert first != _commands(6)
    actions = {e["action"] for _n, _m, e in first}
    assert actions == {"cancel", "retry", "retry_type", "purge", "pause", "resume"}
    for _node, message, entry in first:
        check_control_message(dict(message))  # raises if the daemon would refuse it
        if entry["action"] == "retry_type":
            assert message == {"action": "retry", "task_type": OTHER_TYPE}
        if entry["action"] in ("pause", "resume", "purge") and entry["type"] is None:
            assert message["queue"] is True


def test_replies_answer_the_oldest_command_of_their_node_action_and_target() -> None:
    mix = CommandMix(random.Random(1), "t")
    assert mix.send("cancel", "t1", ["a"], now=5) is not None
    assert mix.send("cancel", "t1", ["a"], now=7) is not None
    assert mix.send("pause", None, ["a"], now=8) is not None
    # Another node's reply, or one about another task, answers nothing.
    assert mix.answer("b", {"action": "cancelled", "task_id": "t1"}) is None
    assert mix.answer("a", {"action": "cancelled", "task_id": "t2"}) is None
    got = mix.answer("a", {"action": "cancelled", "task_id": "t1", "cancelled": True})
    assert got is not None
    entry, sent = got
    assert sent == 5 and entry["phase"] == "ok" and entry["task"] == "t1"
    # An error naming the task answers the cancel still outstanding, as a failure.
    failed = mix.answer("a", {"action": "error", "task_id": "t1", "message": "no"})
    assert failed is not None and failed[1] == 7 and failed[0]["phase"] == "fail"
    assert mix.answer("a", {"action": "error", "task_id": "t1"}) is None
    paused = mix.answer("a", {"action": "paused", "task_type": None, "paused": True})
    assert paused is not None and paused[0]["type"] is None and paused[0]["action"] == "pause"


def test_every_key_ever_paused_is_resumed_at_the_end() -> None:
    mix = CommandMix(random.Random(2), "t")
    for key in (None, OTHER_TYPE):
        mix.send("pause", key, ["a"], now=1)
    mix.send("resume", OTHER_TYPE, ["a"], now=2)
    assert mix.paused == {None}
    assert mix.resumes() == [("resume", None), ("resume", OTHER_TYPE)]
    assert mix.send("cancel", "t1", [], now=3) is None  # no live node: nothing sent
