"""`snerd.core.health.judge_health`, the judgement behind `snerdmq validate`, on a fixed clock.

Every case is a membership document, the facts the tool would have gathered on disk, and a
`now_us`: no files, no clocks, no daemons. The report's text and JSON (`snerd.cli.validate`)
are checked with it. The gathering is tested in tests/cli/test_validate.py, and the command on
real directories and a real daemon in tests/cli/test_cli.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from snerd.cli.validate import health_json, health_lines
from snerd.core.health import (
    HealthReport,
    HealthSettings,
    LockState,
    QueueFacts,
    ShardFacts,
    judge_health,
)
from snerd.core.timefmt import format_rfc3339

SECOND = 1_000_000
NOW = 1_800_000_000 * SECOND
#: The defaults: lease 30 s, margin 5 s, renewal 10 s, so "overdue" is 45 s.
DEFAULTS = HealthSettings()
HELD = LockState("held", 4242, "a@pid-1-aa")


def at(offset_s: float) -> str:
    return format_rfc3339(NOW + int(offset_s * SECOND))


def doc(
    shards: int,
    claims: dict[int, tuple[str, str, int]] | None = None,
    beats: dict[str, float] | None = None,
) -> dict[str, Any]:
    """membership.json: claims as shard -> (owner, lease_expiry, epoch); heartbeats as node ->
    seconds since `seen`."""
    out: dict[str, Any] = {
        "queue": "snerdmq-daemon",
        "shards": shards,
        "version": 9,
        "claims": {
            f"shard-{s}": {"owner": o, "lease_expiry": e, "epoch": n, "renewals": 0}
            for s, (o, e, n) in (claims or {}).items()
        },
        "epochs": {f"shard-{s}": n for s, (_, _, n) in (claims or {}).items()},
    }
    if beats is not None:
        out["nodes"] = {node: {"beat": 3, "seen": at(-age)} for node, age in beats.items()}
    return out


def facts(
    shards: int,
    *,
    locks: dict[int, LockState] | None = None,
    log_epochs: dict[int, int] | None = None,
    local: bool = True,
) -> QueueFacts:
    return QueueFacts(
        directory="/q",
        shards=[
            ShardFacts(
                shard=s,
                directory_exists=True,
                lock=(locks or {}).get(s, LockState("free")),
                log_exists=True,
                log_epoch=(log_epochs or {}).get(s, 1),
            )
            for s in range(shards)
        ],
        filesystem="ext4" if local else "nfs4",
        lock_proves_liveness=local,
    )


def judge(d: dict[str, Any], f: QueueFacts, now: int = NOW) -> HealthReport:
    return judge_health(d, f, now_us=now, settings=DEFAULTS)


# ------------------------------------------------------------------------------ leases


@pytest.mark.parametrize(
    ("expiry", "state", "text", "exit_code"),
    [
        (at(12), "live", "live (expires in 12 s)", 0),
        (at(0), "live", "live (expires in 0 s)", 0),
        (at(-3), "grace", "expired 3 s ago (within the 5 s skew margin: not lapsed yet)", 0),
        (at(-40), "lapsed", "expired 40 s ago (lapsed: another daemon takes it over)", 0),
        (at(-45), "lapsed", "expired 45 s ago (lapsed: another daemon takes it over)", 0),
        (at(-46), "lapsed", "expired 46 s ago (lapsed: another daemon takes it over)", 1),
        ("tomorrow", "unparseable", "unparseable expiry ('tomorrow')", 1),
    ],
)
def test_each_lease_state_on_a_fixed_clock(
    expiry: str, state: str, text: str, exit_code: int
) -> None:
    # b runs (fresh heartbeat) and holds shard-1; a holds shard-0 with the lease under test.
    d = doc(2, {0: ("a@pid-1-aa", expiry, 1), 1: ("b@pid-2-bb", at(20), 1)}, {"b@pid-2-bb": 1})
    report = judge(d, facts(2, locks={0: HELD, 1: HELD}))
    shard = report.shards[0]
    assert (shard.lease, shard.lease_text) == (state, text)
    assert report.exit_code == exit_code, report.problems
    if exit_code:
        assert report.problems[0].startswith("shard-0: ")
    assert report.shards[1].lease == "live"


def test_an_overdue_lease_says_why_and_how_long() -> None:
    d = doc(1, {0: ("a@pid-1-aa", at(-300), 4)}, {"a@pid-1-aa": 320})
    report = judge(d, facts(1, log_epochs={0: 4}))
    assert report.degraded
    assert report.problems == [
        "shard-0: the lease of a@pid-1-aa expired 5 min ago, longer than 45 s (lease + skew "
        "margin + one renewal); no daemon is running to take it over: start one on DIR",
        "shard-0 is claimed by a@pid-1-aa, whose heartbeat is 5 min old (more than 45 s): that "
        "daemon is gone or hung",
    ]
    assert report.shards[0].lease_text == (
        "expired 5 min ago (lapsed: a daemon started on DIR takes it over)"
    )
    assert report.running == 0 and report.fair_share is None
    assert "Daemons: no daemon running" in health_lines(report)


def test_the_overdue_span_follows_the_settings() -> None:
    settings = HealthSettings(ttl_us=3 * SECOND, skew_margin_us=1 * SECOND)
    assert settings.renew_interval_us == SECOND and settings.overdue_us == 5 * SECOND
    d = doc(1, {0: ("a@pid-1-aa", at(-6), 1)})
    assert judge_health(d, facts(1), now_us=NOW, settings=settings).degraded
    assert not judge_health(d, facts(1), now_us=NOW - 2 * SECOND, settings=settings).degraded


# ------------------------------------------------------------------------------ daemons


def test_a_queue_with_no_daemon_and_nothing_claimed_is_healthy() -> None:
    report = judge(doc(3), facts(3))
    assert report.exit_code == 0 and not report.warnings
    assert report.running == 0 and report.daemons == []
    assert report.unowned == ["shard-0", "shard-1", "shard-2"]
    lines = health_lines(report)
    assert "Daemons: no daemon running" in lines
    assert not any(line.startswith("Shards nobody holds") for line in lines)


def test_a_free_shard_while_a_daemon_runs_is_degraded() -> None:
    d = doc(2, {0: ("a@pid-1-aa", at(25), 1)}, {"a@pid-1-aa": 2})
    report = judge(d, facts(2, locks={0: HELD}))
    assert report.unowned == ["shard-1"]
    assert report.exit_code == 1
    (problem,) = report.problems
    assert problem.startswith("shard-1 is free while 1 daemon(s) run: its enqueues are refused")
    assert "Shards nobody holds: shard-1" in health_lines(report)


def test_heartbeat_ages_live_late_stale_and_fair_shares() -> None:
    d = doc(
        4,
        {
            0: ("a@pid-1-aa", at(25), 1),
            1: ("a@pid-1-aa", at(25), 1),
            2: ("a@pid-1-aa", at(25), 1),
            3: ("c@pid-3-cc", at(25), 1),
        },
        {"a@pid-1-aa": 1, "b@pid-2-bb": 20, "c@pid-3-cc": 60},
    )
    report = judge(d, facts(4, locks={s: HELD for s in range(4)}))
    by_node = {x.node: x for x in report.daemons}
    assert {n: (x.state, x.running) for n, x in by_node.items()} == {
        "a@pid-1-aa": ("live", True),
        "b@pid-2-bb": ("late", True),
        "c@pid-3-cc": ("stale", False),
    }
    # Two running daemons: a fair share of ceil(4 / 2) = 2, and a holds 3.
    assert (report.running, report.fair_share) == (2, 2)
    assert by_node["a@pid-1-aa"].above_share and not by_node["b@pid-2-bb"].above_share
    assert any(
        "a@pid-1-aa holds 3 shard(s), above its fair share of 2" in w for w in report.warnings
    )
    assert any(w.startswith("b@pid-2-bb: its heartbeat is 20 s old") for w in report.warnings)
    # c's lease is live, but its heartbeat stopped a minute ago: degraded, naming the shard.
    assert report.problems == [
        "shard-3 is claimed by c@pid-3-cc, whose heartbeat is 60 s old (more than 45 s): that "
        "daemon is gone or hung; its claim lapses at its lease expiry plus the skew margin"
    ]


def test_a_heartbeat_ahead_of_this_clock_is_live() -> None:
    d = doc(1, {0: ("a@pid-1-aa", at(25), 1)}, {"a@pid-1-aa": -7})
    (daemon,) = judge(d, facts(1, locks={0: HELD})).daemons
    assert daemon.state == "live"
    assert daemon.text.endswith("heartbeat seen 7 s ahead of this clock")


# ------------------------------------------------------------------------------ locks, epochs


def test_a_live_claim_whose_lock_is_free() -> None:
    d = doc(1, {0: ("a@pid-1-aa", at(25), 1)}, {"a@pid-1-aa": 1})
    local = judge(d, facts(1))
    assert local.exit_code == 0
    assert local.warnings == [
        "shard-0: claimed but its lock is free: the owner may be dead (takeover at once on a "
        "local filesystem, after the lease elsewhere)"
    ]
    # On a network filesystem the lock state is advisory, and the report says so.
    (warning,) = judge(d, facts(1, local=False)).warnings
    assert "DIR is on nfs4: a lock held on another host may not show here" in warning
    # Held: nothing to say, on either.
    assert judge(d, facts(1, locks={0: HELD}, local=False)).warnings == []


def test_a_lapsed_claim_whose_lock_is_still_held() -> None:
    d = doc(2, {0: ("a@pid-1-aa", at(-20), 1), 1: ("b@pid-2-bb", at(20), 1)}, {"b@pid-2-bb": 1})
    report = judge(d, facts(2, locks={0: HELD, 1: HELD}))
    assert any(
        w.startswith("shard-0: the lease of a@pid-1-aa lapsed but its lock is still held")
        for w in report.warnings
    )


def test_a_lock_held_by_another_than_the_claimant_is_paused() -> None:
    d = doc(1, {0: ("new@pid-5-ee", at(25), 2)}, {"new@pid-5-ee": 1})
    report = judge(d, facts(1, locks={0: HELD}, log_epochs={0: 1}))
    (shard,) = report.shards
    assert (shard.status, shard.epoch_state) == ("paused", "taking over")
    assert "taking over: new@pid-5-ee has not written its claim record yet" in shard.details
    assert report.warnings[0].startswith("shard-0 is PAUSED: claimed by new@pid-5-ee")
    assert report.exit_code == 0


@pytest.mark.parametrize(
    ("claim_epoch", "log_epoch", "log_exists", "state"),
    [
        (3, 3, True, "in step"),
        (3, 4, True, "log ahead"),
        (4, 3, True, "taking over"),
        (0, 0, False, "never claimed"),
    ],
)
def test_epochs_of_membership_and_log(
    claim_epoch: int, log_epoch: int, log_exists: bool, state: str
) -> None:
    claims = {0: ("a@pid-1-aa", at(25), claim_epoch)} if claim_epoch else None
    f = QueueFacts(
        directory="/q",
        shards=[
            ShardFacts(
                shard=0,
                directory_exists=True,
                lock=HELD,
                log_exists=log_exists,
                log_epoch=log_epoch,
            )
        ],
    )
    report = judge(doc(1, claims, {"a@pid-1-aa": 1} if claims else None), f)
    assert report.shards[0].epoch_state == state
    assert report.exit_code == 0


# ------------------------------------------------------------------------------ the JSON


def test_json_is_the_documented_shape_and_plain_data() -> None:
    d = doc(1, {0: ("a@pid-1-aa", at(12), 2)}, {"a@pid-1-aa": 4})
    out = health_json(judge(d, facts(1, locks={0: HELD}, log_epochs={0: 2})))
    assert out["now"] == at(0)
    assert out["settings"] == {
        "lease_ttl_s": 30.0,
        "skew_margin_s": 5.0,
        "renew_interval_s": 10.0,
        "overdue_after_s": 45.0,
    }
    (shard,) = out["per_shard"]
    assert shard["lease"] == {
        "state": "live",
        "expires_in_s": 12.0,
        "text": "live (expires in 12 s)",
    }
    assert (shard["lock"], shard["lock_holder"]) == ("held", "a@pid-1-aa, pid 4242")
    assert out["daemons"] == [
        {
            "node": "a@pid-1-aa",
            "shards": ["shard-0"],
            "heartbeat": {"beat": 3, "seen": at(-4), "age_s": 4.0},
            "state": "live",
            "running": True,
            "above_share": False,
        }
    ]
    assert (out["daemons_running"], out["fair_share"], out["degraded"]) == (1, 1, False)


def test_the_fair_share_rounds_up() -> None:
    # 3 shards, 2 running daemons: a share of ceil(3 / 2) = 2, so 2 + 1 is even enough.
    d = doc(
        3,
        {0: ("a@pid-1-aa", at(25), 1), 1: ("a@pid-1-aa", at(25), 1), 2: ("b@pid-2-bb", at(25), 1)},
        {"a@pid-1-aa": 1, "b@pid-2-bb": 1},
    )
    b_lock = LockState("held", 4343, "b@pid-2-bb")
    report = judge(d, facts(3, locks={0: HELD, 1: HELD, 2: b_lock}))
    assert report.fair_share == 2
    assert not any(x.above_share for x in report.daemons) and report.warnings == []
    assert report.exit_code == 0


def with_types(d: dict[str, Any], types: dict[str, list[str]]) -> dict[str, Any]:
    for node, listed in types.items():
        d["nodes"][node]["types"] = listed
    return d


def test_a_task_type_no_running_daemon_handles_is_a_problem_and_named_per_shard() -> None:
    d = with_types(
        doc(2, {0: ("a", at(20), 1), 1: ("b", at(20), 1)}, beats={"a": 1, "b": 1}),
        {"a": ["email"], "b": ["resize"]},
    )
    f = facts(2, locks={0: HELD, 1: LockState("held", 4243, "b")})
    f.shards[0] = ShardFacts(
        shard=0,
        directory_exists=True,
        lock=HELD,
        log_exists=True,
        log_epoch=1,
        live_types={"email": 2, "resize": 1, "report": 4},
    )
    report = judge_health(d, f, now_us=NOW, settings=DEFAULTS)
    assert report.problems == [
        "no running daemon has a handler for task type 'report' (4 live task(s)): they wait "
        "until an SDK registers one"
    ]
    shard_warnings = [w for w in report.warnings if w.startswith("shard-0:")]
    assert len(shard_warnings) == 2
    assert "'report'" in shard_warnings[0] and "owner a has no handler" in shard_warnings[0]
    assert "'resize'" in shard_warnings[1]
    # Once some daemon registers it, it is no longer a problem (shard-0's owner still lacks it).
    d["nodes"]["b"]["types"] = ["resize", "report"]
    report = judge_health(d, f, now_us=NOW, settings=DEFAULTS)
    assert report.problems == []
    assert any("'report'" in w for w in report.warnings)


def test_handler_types_unknown_for_a_daemon_judge_nothing() -> None:
    """An upstream daemon (or an older snerd) publishes no types: no verdict on handlers."""
    d = doc(1, {0: ("a", at(20), 1)}, beats={"a": 1})
    f = facts(1, locks={0: HELD})
    f.shards[0] = ShardFacts(
        shard=0,
        directory_exists=True,
        lock=HELD,
        log_exists=True,
        log_epoch=1,
        live_types={"x": 1},
    )
    report = judge_health(d, f, now_us=NOW, settings=DEFAULTS)
    assert report.problems == []
    assert not any("handler" in w for w in report.warnings)
    # The same with the daemon's types published: it is judged.
    d["nodes"]["a"]["types"] = ["y"]
    assert judge_health(d, f, now_us=NOW, settings=DEFAULTS).problems != []


def test_tasks_waiting_in_the_inboxes_of_a_free_shard_are_reported() -> None:
    d = doc(2, {0: ("a", at(20), 1)}, beats={"a": 1})
    f = facts(2, locks={0: HELD})
    f.shards[1] = ShardFacts(
        shard=1,
        directory_exists=True,
        lock=LockState("free"),
        log_exists=True,
        log_epoch=0,
        inbox_waiting_bytes=512,
        inbox_waiting_files=2,
    )
    report = judge_health(d, f, now_us=NOW, settings=DEFAULTS)
    assert any(
        w.startswith("shard-1 is free and 512 byte(s) of enqueued tasks wait")
        for w in report.warnings
    )
    assert "512 byte(s) in 2 inbox file(s) not yet ingested" in report.shards[1].details



# ------------------------------------------------------------------------------ caps


def capped_doc(cap: int | None) -> dict[str, Any]:
    """Four shards, two daemons each holding two; heartbeats carry `cap` (None: no cap)."""
    d = doc(
        4,
        {
            0: ("a@pid-1-aa", at(25), 1),
            1: ("a@pid-1-aa", at(25), 1),
            2: ("b@pid-2-bb", at(25), 1),
        },
        {"a@pid-1-aa": 1, "b@pid-2-bb": 1},
    )
    if cap is not None:
        for beat in d["nodes"].values():
            beat["max_shards"] = cap
    return d


def test_the_cap_remedy_is_named_only_when_every_running_daemon_is_at_its_cap() -> None:
    # b holds 1 of its 2: it claims shard-3 at its next round; the usual text.
    report = judge(capped_doc(2), facts(4, locks={0: HELD, 1: HELD, 2: HELD}))
    (problem,) = report.problems
    assert "SNERD_MAX_SHARDS): raise" not in problem and "within 10 s" in problem
    # Caps of 1 on both, holding 2 and 1: at their caps, and shard-3 stays free.
    d = capped_doc(1)
    report = judge(d, facts(4, locks={0: HELD, 1: HELD, 2: HELD}))
    (problem,) = report.problems
    assert problem.endswith(
        "no running daemon may claim it: every running daemon holds its cap (a@pid-1-aa 2 of "
        "1, b@pid-2-bb 1 of 1, SNERD_MAX_SHARDS): raise SNERD_MAX_SHARDS or start another daemon"
    )
    # No cap known (an upstream daemon, an older snerd): nothing is guessed.
    report = judge(capped_doc(None), facts(4, locks={0: HELD, 1: HELD, 2: HELD}))
    assert "raise SNERD_MAX_SHARDS" not in report.problems[0]


def test_a_lapsed_claim_nobody_may_take_over_for_the_caps_names_the_remedy() -> None:
    d = doc(
        2,
        {0: ("gone@pid-9-zz", at(-300), 1), 1: ("b@pid-2-bb", at(25), 1)},
        {"b@pid-2-bb": 1},
    )
    d["nodes"]["b@pid-2-bb"]["max_shards"] = 1
    report = judge(d, facts(2, locks={1: HELD}))
    assert any(
        p.startswith("shard-0: the lease of gone@pid-9-zz expired 5 min ago")
        and p.endswith(
            "no running daemon may take it over: every running daemon holds its "
            "cap (b@pid-2-bb 1 of 1, SNERD_MAX_SHARDS): raise SNERD_MAX_SHARDS or "
            "start another daemon"
        )
        for p in report.problems
    ), report.problems


# ------------------------------------------------------------------------------ membership.json


def test_an_unusable_membership_file_is_a_problem_saying_what_the_daemons_do() -> None:
    problem = "/q/membership.json is not a usable membership file: 'shards' is -1, not a ..."
    report = judge_health({}, facts(1), now_us=NOW, settings=DEFAULTS, membership_problem=problem)
    assert report.exit_code == 1
    assert report.problems[0].startswith(problem + ": a daemon refuses to start on it (exit 2)")
    assert "fix the file or restore it" in report.problems[0]
    assert "Status: DEGRADED" in health_lines(report)
    assert health_json(report)["problems"][0] == report.problems[0]
