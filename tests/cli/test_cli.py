"""The `snerdmq` operator subcommands (`snerd.cli`) on real directories.

Most tests plant a queue directory record by record (`encode_record`, the daemon's own codec)
and call `snerd.cli.main` in-process, which is fast and exact. Where a daemon matters — a lock
held by a live process, a dead letter made by a real daemon, a restart after `compact` or
`replay`, new shards picked up — a real `snerdmq` process is spawned and spoken to over its
pipes with the wire protocol. A few checks go through the console script end to end.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from snerd.cli import SUBCOMMANDS, main
from snerd.core.records import decode_record, encode_record
from snerd.core.timefmt import format_rfc3339, parse_rfc3339
from snerd.io.membership import ShardLocks

SECOND = 1_000_000
NOW = time.time_ns() // 1000
PAST = format_rfc3339(NOW - 3600 * SECOND)
FUTURE = format_rfc3339(NOW + 3600 * SECOND)
SNERDMQ = Path(sys.executable).parent / "snerdmq"
DAEMON_CMD = [str(SNERDMQ)] if SNERDMQ.exists() else [sys.executable, "-m", "snerd.cli"]

Cli = Callable[..., tuple[int, str, str]]


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run `snerdmq ARGS...` in-process: (exit code, stdout, stderr)."""

    def run(*args: str | Path) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def task(
    task_id: str, task_type: str = "job", epoch: int | None = 1, **extra: Any
) -> dict[str, Any]:
    f: dict[str, Any] = {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 2,
        "retryAfterHours": 0.0,
        "retryAfterTime": PAST,
        "taskData": json.dumps({"id": task_id}),
        "taskType": task_type,
        "executeAt": PAST,
        "snerdNode": "planted",
    }
    f.update(extra)
    if epoch is not None:
        f["snerdEpoch"] = epoch
    return f


def done(task_id: str, task_type: str = "job", **extra: Any) -> dict[str, Any]:
    return task(task_id, task_type, deletedAt=PAST, snerdOutcome="completed", **extra)


def dead(task_id: str, task_type: str = "job", error: str = "boom", **extra: Any) -> dict[str, Any]:
    extra.setdefault("retryCount", 3)
    return task(
        task_id,
        task_type,
        deletedAt=PAST,
        snerdOutcome="dead_letter",
        LastErrorObj=error,
        LastJobError={"error": error, "retry_worthy": False},
        **extra,
    )


def dispatch(task_id: str, attempt: int, epoch: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "snerdKind": "dispatch",
        "task": task_id,
        "attempt": attempt,
        "at": PAST,
        "snerdEpoch": epoch,
        **extra,
    }


def claim(epoch: int) -> dict[str, Any]:
    return {
        "snerdKind": "claim",
        "epoch": epoch,
        "node": f"old@pid-{epoch}",
        "at": PAST,
        "snerdEpoch": epoch,
    }


def plant(
    directory: Path,
    logs: dict[int, list[dict[str, Any]]],
    *,
    shards: int | None = None,
    claims: dict[str, Any] | None = None,
    epochs: dict[str, int] | None = None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    doc = {
        "queue": "snerdmq-daemon",
        "shards": shards if shards is not None else max(logs, default=0) + 1,
        "version": 3,
        "claims": claims or {},
        "epochs": epochs if epochs is not None else {f"shard-{s}": 1 for s in logs},
    }
    (directory / "membership.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    for shard, records in logs.items():
        path = log_path(directory, shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(encode_record(r) for r in records))
    return directory


def log_path(directory: Path, shard: int = 0) -> Path:
    return directory / f"shard-{shard}" / "tasks" / "tasks.log"


def records(directory: Path, shard: int = 0) -> list[dict[str, Any]]:
    return [
        decode_record(line)
        for line in log_path(directory, shard).read_bytes().splitlines()
        if line.strip()
    ]


def membership(directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((directory / "membership.json").read_bytes())
    return doc


class Daemon:
    """A real `snerdmq DIR` process, spoken to over its pipes."""

    def __init__(self, directory: Path, log: Path, **env: str) -> None:
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [*DAEMON_CMD, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, "SNERD_DRAIN_TIMEOUT": "3", **env},
        )
        self.buffer = b""
        self.seen: list[dict[str, Any]] = []
        self.wait_for(lambda m: m.get("action") == "membership")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(message) + b"\n")
        self.proc.stdin.flush()

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15.0
    ) -> dict[str, Any]:
        """The first message (already seen or new) for which `predicate` holds."""
        for i, message in enumerate(self.seen):
            if predicate(message):
                return self.seen.pop(i)
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                message = orjson.loads(line)
                if predicate(message):
                    return message  # type: ignore[no-any-return]
                self.seen.append(message)
            left = deadline - time.monotonic()
            assert left > 0, f"no matching message within {timeout} s; saw {self.seen}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"daemon exited ({self.proc.poll()}); saw {self.seen}"
                self.buffer += chunk

    def enqueue(self, task_id: str, task_type: str, data: Any, **extra: Any) -> dict[str, Any]:
        self.send(
            {
                "action": "enqueue",
                "task_id": task_id,
                "task_type": task_type,
                "task_data": json.dumps(data),
                "max_retries": extra.pop("max_retries", 0),
                "retry_after_hours": 0.0,
                **extra,
            }
        )
        return self.wait_for(
            lambda m: m.get("task_id") == task_id and m.get("action") in ("ack", "error")
        )

    def execute(self, timeout: float = 15.0) -> dict[str, Any]:
        return self.wait_for(lambda m: m.get("action") == "execute", timeout)

    def result(self, task_id: str, ok: bool, error: str | None = None) -> None:
        message: dict[str, Any] = {
            "action": "result",
            "task_id": task_id,
            "status": "success" if ok else "error",
        }
        if error is not None:
            message["error_msg"] = error
        self.send(message)

    def stop(self) -> int:
        """stdin EOF: the daemon drains, releases its shards and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=20)
        self.log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(directory: Path, **env: str) -> Daemon:
        d = Daemon(directory, tmp_path / "daemon.log", **env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


# ------------------------------------------------------------------------------ every command


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(cli: Cli, command: str) -> None:
    code, out, _ = cli(command, "--help")
    assert code == 0
    assert f"usage: snerdmq {command}" in out


@pytest.mark.parametrize(
    "command", ["stats", "validate", "dlq", "schedules", "replay", "fsck", "compact"]
)
def test_a_missing_dir_is_a_usage_error_naming_it(cli: Cli, tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope"
    code, out, err = cli(command, missing)
    assert code == 2
    assert f"DIR '{missing}' does not exist" in err
    assert "usage: snerdmq" in err and out == ""


@pytest.mark.parametrize(
    "command", ["stats", "validate", "dlq", "schedules", "replay", "fsck", "compact"]
)
def test_a_dir_that_is_not_a_queue_is_a_usage_error(cli: Cli, tmp_path: Path, command: str) -> None:
    code, _, err = cli(command, tmp_path)
    assert code == 2
    assert "is not a snerd queue directory (no membership.json" in err


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "q", "--bogus"],
        ["validate", "q", "--bogus"],
        ["dlq", "q", "--bogus"],
        ["schedules", "q", "--bogus"],
        ["replay", "--bogus"],
        ["fsck", "q", "--bogus"],
        ["compact", "q", "--bogus"],
        ["add-shards", "--bogus", "1", "q"],
        ["demo", "--bogus"],
    ],
)
def test_a_bad_flag_is_a_usage_error_naming_it(cli: Cli, tmp_path: Path, args: list[str]) -> None:
    code, _, err = cli(*args)
    assert code == 2
    assert "unrecognized arguments: --bogus" in err
    assert not (tmp_path / "q").exists()


def test_a_bad_environment_value_is_a_usage_error_naming_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), task("a")]})
    monkeypatch.setenv("SNERD_CLOCK_SKEW_MARGIN", "soon")
    for command in ("validate", "stats"):
        code, _, err = cli(command, q)
        assert code == 2
        assert "SNERD_CLOCK_SKEW_MARGIN='soon' is not a number of seconds" in err


@pytest.mark.parametrize(
    ("name", "value"),
    [("SNERD_TEST_CLOCK_OFFSET", "1e303"), ("SNERD_CLOCK_SKEW_MARGIN", "1e308")],
)
def test_a_setting_past_its_range_is_a_usage_error_as_in_the_daemon(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    # It overflowed the microsecond count (OverflowError) before.
    q = plant(tmp_path / "q", {0: [claim(1), task("a")]})
    monkeypatch.setenv(name, value)
    for command in ("validate", "stats"):
        code, out, err = cli(command, q)
        assert (code, out) == (2, ""), err
        assert f"{name}={value!r} must be a number of seconds from" in err


@pytest.mark.parametrize("ttl", ["0.1", "soon", "inf"])
def test_validate_refuses_a_bad_lease_ttl(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ttl: str
) -> None:
    q = plant(tmp_path / "q", {0: [claim(1)]})
    monkeypatch.setenv("SNERD_LEASE_TTL", ttl)
    code, out, err = cli("validate", q)
    assert (code, out) == (2, "")
    assert f"SNERD_LEASE_TTL={ttl!r}" in err


@pytest.mark.parametrize("n", ["0", "-2", "two", "1.5"])
def test_add_shards_refuses_a_bad_n(cli: Cli, tmp_path: Path, n: str) -> None:
    code, _, err = cli("add-shards", n, tmp_path)
    assert code == 2
    assert "argument N: N must be" in err
    assert not (tmp_path / "membership.json").exists()


def test_add_shards_needs_both_arguments(cli: Cli) -> None:
    code, _, err = cli("add-shards", "2")
    assert code == 2
    assert "DIR" in err


def test_the_console_script_exit_codes(tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), task("a")]}, shards=2)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*DAEMON_CMD, *args], capture_output=True, text=True, timeout=60)

    (q / "shard-7").mkdir()
    bad = run("validate", str(q))
    assert bad.returncode == 1, bad.stderr
    assert "orphan directory shard-7" in bad.stdout
    usage = run("add-shards", "zero", str(q))
    assert usage.returncode == 2
    assert "N must be a whole number" in usage.stderr


# ------------------------------------------------------------------------------ stats


def planted_mix(directory: Path) -> Path:
    return plant(
        directory,
        {
            0: [
                claim(1),
                task("w1"),
                task("w2", "mail"),
                task("later", executeAt=FUTURE, retryAfterTime=FUTURE),
                task("r1"),
                dispatch("r1", 1),
                task("r1", retryCount=1, LastErrorObj="x", retryAfterTime=FUTURE),
                task("fly"),
                dispatch("fly", 1),
                task("ok1"),
                dispatch("ok1", 1),
                done("ok1"),
                dead("d1"),
            ],
            1: [claim(2), task("w3", "mail", epoch=2), done("ok2", epoch=2)],
        },
        claims={
            "shard-0": {"owner": "h@pid-1-aa", "lease_expiry": FUTURE, "epoch": 1, "renewals": 4}
        },
        epochs={"shard-0": 1, "shard-1": 2},
    )


def test_stats_counts_tasks_by_state(cli: Cli, tmp_path: Path) -> None:
    q = planted_mix(tmp_path / "q")
    code, out, _ = cli("stats", q, "--json")
    assert code == 0
    report = json.loads(out)
    s0, s1 = report["per_shard"]
    assert (s0["live"], s0["waiting"], s0["delayed"], s0["retrying"], s0["in_flight"]) == (
        5,
        2,
        1,
        1,
        1,
    )
    assert (s0["completed"], s0["dead_letters"], s0["owner"], s0["epoch"]) == (
        1,
        1,
        "h@pid-1-aa",
        1,
    )
    assert s0["types"] == {"job": 4, "mail": 1}
    assert s0["log_bytes"] == log_path(q).stat().st_size
    assert (s1["live"], s1["completed"], s1["owner"], s1["epoch"]) == (1, 1, None, 2)
    t = report["totals"]
    assert (t["live"], t["completed"], t["dead_letters"], t["corrupt_lines"]) == (6, 2, 1, 0)
    assert t["types"] == {"job": 4, "mail": 2}

    code, out, _ = cli("stats", q)
    assert code == 0
    assert "shard    owner" in out and "in flight" in out
    assert "h@pid-1-aa (lease" in out
    assert "Live tasks by type: job 4, mail 2" in out
    assert "1 dead letter(s)" in out


def test_stats_and_validate_show_paused_types_and_where(cli: Cli, tmp_path: Path) -> None:
    def pause(task_type: str | None, paused: bool, at: int) -> dict[str, Any]:
        return {"snerdKind": "pause", "type": task_type, "paused": paused, "stamp": [at, "n"],
                "snerdEpoch": 1}

    q = plant(tmp_path / "q", {
        0: [claim(1), pause("mail", True, 1), pause(None, True, 2)],
        1: [claim(1), pause("mail", True, 1), pause("mail", False, 3)],
    })
    code, out, _ = cli("stats", q)
    assert code == 0
    assert "Paused: the whole queue on shard-0 only (1 of 2: a pause or resume is still " \
        "pending on the others)" in out
    assert "Paused: type 'mail' on shard-0 only" in out
    code, out, _ = cli("stats", q, "--json")
    report = json.loads(out)
    assert report["paused"][1] == {"task_type": "mail", "shards": ["shard-0"],
                                   "everywhere": False}
    assert [r["paused_types"] for r in report["per_shard"]] == [["mail", None], []]
    _code, out, _ = cli("validate", q)
    assert "Paused: type 'mail' on shard-0 only" in out


def test_stats_reads_an_upstream_v02_directory(cli: Cli, tmp_path: Path) -> None:
    q = tmp_path / "old"
    (q / "tasks").mkdir(parents=True)
    upstream = {
        "taskId": "u1",
        "retryCount": 0,
        "maxRetries": 3,
        "retryAfterHours": 0.0,
        "retryAfterTime": PAST,
        "taskData": "{}",
        "taskType": "legacy",
        "executeAt": PAST,
    }
    (q / "tasks" / "tasks.log").write_bytes(orjson.dumps(upstream) + b"\n")
    code, out, _ = cli("stats", q)
    assert code == 0
    assert "upstream v0.2 layout" in out
    assert "Live tasks by type: legacy 1" in out
    code, _, err = cli("replay", q)
    assert code == 1
    assert "upstream SnerdMQ v0.2 layout" in err


# ------------------------------------------------------------------------------ validate


def test_validate_a_fresh_queue_with_unclaimed_shards_is_ok(cli: Cli, tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {}, shards=3, epochs={})
    code, out, _ = cli("validate", q)
    assert code == 0, out
    assert "Shards: 3" in out and "Version: 3" in out
    assert out.count("free; epoch 0, not created yet") == 3
    assert "Daemons: no daemon running" in out
    assert "Status: OK" in out


def test_validate_flags_lapsed_missing_orphan_and_corrupt(cli: Cli, tmp_path: Path) -> None:
    # Judged on the clock when validate runs: take the time now, not at import.
    lapsed = format_rfc3339(time.time_ns() // 1000 - 120 * SECOND)
    q = plant(
        tmp_path / "q",
        {0: [claim(1), task("a"), task("b", "mail")]},
        shards=2,
        claims={
            "shard-0": {"owner": "gone@pid-9-aa", "lease_expiry": lapsed, "epoch": 1},
            "shard-1": {"owner": "x@pid-8-bb", "lease_expiry": FUTURE, "epoch": 1},
        },
        epochs={"shard-0": 1, "shard-1": 1},
    )
    (q / "shard-4").mkdir()
    with log_path(q).open("ab") as f:
        f.write(b'{"taskId":"broken",\n')
    code, out, _ = cli("validate", q)
    assert code == 1
    assert "shard-0: owner gone@pid-9-aa, expired 2 min ago (lapsed: " in out
    assert "Problem: shard-0: the lease of gone@pid-9-aa expired 2 min ago" in out
    assert "Problem: shard-1: its directory is missing although" in out
    assert "Problem: orphan directory shard-4" in out
    assert "Problem: shard-0: 1 corrupt line(s)" in out
    assert "Task types with live tasks: job (1), mail (1)" in out
    assert "Status: DEGRADED" in out

    code, out, _ = cli("validate", q, "--json")
    assert code == 1
    report = json.loads(out)
    assert report["degraded"] is True
    assert report["orphans"] == ["shard-4"]
    assert [s["status"] for s in report["per_shard"]] == ["lapsed", "active"]
    assert report["task_types"] == {"job": 1, "mail": 1}


def test_validate_within_the_skew_margin_is_not_lapsed(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expired = format_rfc3339(time.time_ns() // 1000 - 3 * SECOND)
    q = plant(
        tmp_path / "q",
        {0: [claim(1)]},
        claims={"shard-0": {"owner": "slow@pid-1-aa", "lease_expiry": expired, "epoch": 1}},
    )
    code, out, _ = cli("validate", q)
    assert code == 0
    assert "expired 3 s ago (within the 5 s skew margin: not lapsed yet)" in out
    monkeypatch.setenv("SNERD_CLOCK_SKEW_MARGIN", "1")
    code, out, _ = cli("validate", q)
    # Lapsed, but only just: a running daemon has not had its chance to take it over yet.
    assert code == 0, out
    assert "expired 3 s ago (lapsed: a daemon started on DIR takes it over)" in out
    monkeypatch.setenv("SNERD_LEASE_TTL", "0.9")
    code, out, _ = cli("validate", q)
    assert code == 1, out
    assert "Problem: shard-0: the lease of slow@pid-1-aa expired 3 s ago, longer than 2 s" in out


def test_validate_reports_a_paused_shard(cli: Cli, tmp_path: Path) -> None:
    q = plant(
        tmp_path / "q",
        {0: [claim(1), task("a")]},
        claims={"shard-0": {"owner": "new@pid-2-bb", "lease_expiry": FUTURE, "epoch": 2}},
        epochs={"shard-0": 2},
    )
    locks = ShardLocks(q)
    assert locks.try_lock(0, "old@pid-1-aa")
    try:
        code, out, _ = cli("validate", q)
    finally:
        locks.unlock_all()
    assert code == 0
    assert "shard-0 is PAUSED: claimed by new@pid-2-bb, but its lock is held by old@pid-1-aa" in out
    assert "epoch 2" in out


def test_validate_a_queue_with_a_live_daemon(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = tmp_path / "q"
    d = daemons(q)
    code, out, _ = cli("validate", q)
    assert code == 0, out
    assert "shard-0: owner " in out and ", live (expires in " in out
    assert f"pid {d.pid}" in out
    assert "Status: OK" in out
    # stats only reads: the daemon keeps its lock and goes on working.
    assert d.enqueue("t1", "nobody-handles-this", {})["action"] == "ack"
    before = {p: p.stat().st_mtime_ns for p in q.rglob("*") if p.is_file()}
    code, out, _ = cli("stats", q, "--json")
    assert code == 0
    (shard,) = json.loads(out)["per_shard"]
    assert f"@pid-{d.pid}-" in shard["owner"]
    assert (shard["live"], shard["types"]) == (1, {"nobody-handles-this": 1})
    assert {p: p.stat().st_mtime_ns for p in q.rglob("*") if p.is_file()} == before
    assert d.enqueue("t2", "nobody-handles-this", {})["action"] == "ack"
    assert d.stop() == 0
    code, out, _ = cli("validate", q)
    assert code == 0, out
    assert "shard-0: free; epoch 1, lock free, log epoch 1" in out
    assert "Daemons: no daemon running" in out
    assert "Problem" not in out and "Warning" not in out


def test_validate_shows_a_running_daemons_shards_live_and_locked(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    q = tmp_path / "q"
    assert cli("add-shards", "2", q)[0] == 0
    monkeypatch.setenv("SNERD_LEASE_TTL", "3")  # the tool reads the lease as the daemon does
    d = daemons(q, SNERD_LEASE_TTL="3")  # returns once its first shards are active
    claims = membership(q)["claims"]
    node = claims["shard-0"]["owner"]
    assert claims["shard-1"]["owner"] == node
    code, out, _ = cli("validate", q)
    assert code == 0, out
    for shard in ("shard-0", "shard-1"):
        assert f"{shard}: owner {node}, live (expires in " in out
        assert f"lock held by {node}, pid {d.pid}, log epoch 1" in out
    assert "Daemons: 1 running, fair share 2 shard(s) each" in out
    assert f"  {node}: 2 shard(s) (shard-0, shard-1), heartbeat seen " in out
    assert "Status: OK" in out and "Warning" not in out

    code, out, _ = cli("validate", q, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["settings"]["lease_ttl_s"] == 3.0
    assert [(s["lease"]["state"], s["lock"], s["epoch_state"]) for s in report["per_shard"]] == [
        ("live", "held", "in step")
    ] * 2
    (daemon,) = report["daemons"]
    assert (daemon["node"], daemon["shards"], daemon["state"]) == (
        node, ["shard-0", "shard-1"], "live"
    )
    assert 0 <= daemon["heartbeat"]["age_s"] < 3
    assert (report["daemons_running"], report["fair_share"], report["degraded"]) == (1, 2, False)

    # Killed without a drain: its claims stay, its locks go with it.
    d.kill()
    code, out, _ = cli("validate", q)
    assert code == 0, out  # within its lease: not degraded yet
    assert "Warning: shard-0: claimed but its lock is free: the owner may be dead (takeover" in out


def test_validate_names_a_lapsed_claim_and_a_stale_heartbeat(cli: Cli, tmp_path: Path) -> None:
    now = time.time_ns() // 1000
    q = plant(
        tmp_path / "q",
        {0: [claim(3), task("a")], 1: [claim(2)]},
        claims={
            "shard-0": {
                "owner": "gone@pid-9-aa",
                "lease_expiry": format_rfc3339(now - 300 * SECOND),
                "epoch": 3,
                "renewals": 7,
            },
            "shard-1": {
                "owner": "alive@pid-8-bb",
                "lease_expiry": format_rfc3339(now + 20 * SECOND),
                "epoch": 2,
                "renewals": 1,
            },
        },
        epochs={"shard-0": 3, "shard-1": 2},
    )
    doc = membership(q)
    doc["nodes"] = {
        "gone@pid-9-aa": {"beat": 40, "seen": format_rfc3339(now - 330 * SECOND)},
        "alive@pid-8-bb": {"beat": 2, "seen": format_rfc3339(now - 1 * SECOND)},
    }
    (q / "membership.json").write_bytes(orjson.dumps(doc))
    code, out, _ = cli("validate", q)
    assert code == 1, out
    assert "shard-0: owner gone@pid-9-aa, expired 5 min ago (lapsed: another daemon takes" in out
    assert (
        "Problem: shard-0: the lease of gone@pid-9-aa expired 5 min ago, longer than 45 s "
        "(lease + skew margin + one renewal); no running daemon has taken it over"
    ) in out
    assert (
        "Problem: shard-0 is claimed by gone@pid-9-aa, whose heartbeat is 6 min old (more than "
        "45 s): that daemon is gone or hung"
    ) in out
    assert "gone@pid-9-aa: 1 shard(s) (shard-0), heartbeat seen 6 min ago (stale" in out
    assert "Daemons: 1 running, fair share 2 shard(s) each" in out
    assert "shard-1" not in "".join(line for line in out.splitlines() if "Problem" in line)
    assert "Status: DEGRADED" in out


def test_validate_says_a_lock_is_advisory_only_off_a_local_filesystem(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = plant(
        tmp_path / "q",
        {0: [claim(1)]},
        claims={"shard-0": {"owner": "x@pid-1-aa", "lease_expiry": FUTURE, "epoch": 1}},
    )
    (q / "shard-0" / ".lock").write_bytes(b"1\nx@pid-1-aa\n")  # free: nobody holds it
    mounts = tmp_path / "mountinfo"
    mounts.write_text("36 25 0:32 / / rw,relatime - ext4 /dev/sda1 rw\n")
    monkeypatch.setenv("SNERD_TEST_MOUNTINFO", str(mounts))
    code, out, _ = cli("validate", q)
    assert code == 0, out
    assert "Warning: shard-0: claimed but its lock is free: the owner may be dead" in out
    assert "advisory" not in out
    mounts.write_text("36 25 0:32 / / rw,relatime - nfs4 server:/export rw,vers=4.2\n")
    code, out, _ = cli("validate", q)
    assert code == 0, out
    assert (
        "(DIR is on nfs4: a lock held on another host may not show here, so the lock state is "
        "advisory; the lease decides)"
    ) in out
    report = json.loads(cli("validate", q, "--json")[1])
    assert report["filesystem"] == {"type": "nfs4", "lock_proves_liveness": False}


def test_validate_json_has_the_documented_shape(cli: Cli, tmp_path: Path) -> None:
    q = plant(
        tmp_path / "q",
        {0: [claim(1), task("a", "mail")]},
        shards=2,
        claims={"shard-0": {"owner": "x@pid-1-aa", "lease_expiry": FUTURE, "epoch": 2}},
        epochs={"shard-0": 2},
    )
    code, out, _ = cli("validate", q, "--json")
    report = json.loads(out)
    assert set(report) == {
        "directory", "queue", "shards", "version", "legacy_layout", "now", "settings",
        "filesystem", "per_shard", "daemons", "daemons_running", "fair_share", "unowned",
        "orphans", "task_types", "problems", "warnings", "degraded", "paused",
    }
    assert set(report["settings"]) == {
        "lease_ttl_s", "skew_margin_s", "renew_interval_s", "overdue_after_s"
    }
    assert report["settings"]["overdue_after_s"] == 45.0
    assert set(report["filesystem"]) == {"type", "lock_proves_liveness"}
    shard0, shard1 = report["per_shard"]
    assert set(shard0) == {
        "shard", "status", "owner", "lease_expiry", "lease", "epoch", "log_epoch",
        "epoch_state", "lock", "lock_holder", "directory_exists", "corrupt_lines",
        "torn_tail_bytes", "stale_records",
    }
    assert set(shard0["lease"]) == {"state", "expires_in_s", "text"}
    assert (shard0["lease"]["state"], shard0["epoch"], shard0["log_epoch"]) == ("live", 2, 1)
    assert shard0["epoch_state"] == "taking over"
    assert shard1["lease"] == {"state": "free", "expires_in_s": None, "text": "free"}
    (daemon,) = report["daemons"]
    assert set(daemon) == {"node", "shards", "heartbeat", "state", "running", "above_share"}
    assert (daemon["heartbeat"], daemon["state"], daemon["running"]) == (
        None, "no heartbeat", True
    )
    # x runs and shard-1 is free: its enqueues are refused.
    assert report["unowned"] == ["shard-1"]
    assert report["degraded"] is True and code == 1
    assert report["problems"][0].startswith("shard-1 is free while 1 daemon(s) run")
    assert report["task_types"] == {"mail": 1}
    assert report["paused"] == []


# ------------------------------------------------------------------------------ add-shards


def test_add_shards_grows_the_queue(cli: Cli, tmp_path: Path) -> None:
    claims = {"shard-0": {"owner": "h@pid-1-aa", "lease_expiry": FUTURE, "epoch": 1}}
    q = plant(tmp_path / "q", {0: [claim(1), task("a")]}, claims=claims)
    code, out, _ = cli("add-shards", "2", q)
    assert code == 0
    assert "now has 3 shards" in out
    doc = membership(q)
    assert (doc["shards"], doc["version"], doc["claims"]) == (3, 4, claims)
    assert (q / "shard-1" / "tasks").is_dir() and (q / "shard-2" / "tasks").is_dir()
    assert records(q)[1]["taskId"] == "a"
    # h holds shard-0 and runs: until its next round claims them, the new shards' enqueues
    # are refused, which validate reports.
    code, out, _ = cli("validate", q)
    assert code == 1, out
    assert "Problem: shard-1 is free while 1 daemon(s) run: its enqueues are refused" in out
    assert "Shards nobody holds: shard-1, shard-2" in out


def test_add_shards_creates_a_queue_where_there_is_none(cli: Cli, tmp_path: Path) -> None:
    q = tmp_path / "new" / "q"
    code, out, _ = cli("add-shards", "4", q)
    assert code == 0
    assert "Created a new queue with 4 shard(s)" in out
    doc = membership(q)
    assert (doc["queue"], doc["shards"], doc["version"]) == ("snerdmq-daemon", 4, 1)
    assert all((q / f"shard-{k}" / "tasks").is_dir() for k in range(4))
    code, _, _ = cli("validate", q)
    assert code == 0


def test_add_shards_refuses_an_unadopted_upstream_directory(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tasks.log").write_bytes(b"")
    code, _, err = cli("add-shards", "1", tmp_path)
    assert code == 1
    assert "upstream SnerdMQ v0.2 layout" in err
    assert not (tmp_path / "membership.json").exists()


def test_a_running_daemon_claims_shards_added_later(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = tmp_path / "q"
    d = daemons(q, SNERD_LEASE_TTL="0.9")
    code, _, _ = cli("add-shards", "1", q)
    assert code == 0
    m = d.wait_for(
        lambda m: m.get("action") == "membership" and "shard-1" in m["owned"], timeout=10
    )
    assert m["shards"] == 2
    assert d.stop() == 0


# ------------------------------------------------------------------------------ dlq


def planted_dead_letters(directory: Path) -> Path:
    return plant(
        directory,
        {
            0: [
                claim(1),
                dead("d1", "export", "disk full", retryCount=3),
                done("s1", LastErrorObj="stale error kept by upstream"),  # succeeded: never a DLQ
                task(
                    "u1",
                    "legacy",
                    epoch=None,
                    retryCount=2,
                    maxRetries=3,
                    deletedAt=PAST,
                    LastErrorObj="upstream error",
                ),  # upstream-shaped DLQ
                task(
                    "u2",
                    "legacy",
                    epoch=None,
                    retryCount=0,
                    maxRetries=3,
                    deletedAt=PAST,
                    LastErrorObj="failed once, then succeeded",
                ),  # upstream success
                dead("back", "export"),
                task("back", "export"),  # re-enqueued since
            ],
            1: [claim(1), dead("d2", "mail", "smtp said no", retryCount=1)],
        },
    )


def test_dlq_lists_dead_letters(cli: Cli, tmp_path: Path) -> None:
    q = planted_dead_letters(tmp_path / "q")
    code, out, _ = cli("dlq", q)
    assert code == 0
    assert "3 dead letter(s)" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(lines) - {"id"} == {"d1", "u1*", "d2"}
    assert "export" in lines["d1"] and "disk full" in lines["d1"] and " 3 " in lines["d1"]
    assert "written by upstream SnerdMQ" in out

    code, out, _ = cli("dlq", q, "--json", "--type", "mail")
    assert code == 0
    (only,) = json.loads(out)
    assert only == {
        "task_id": "d2",
        "task_type": "mail",
        "shard": "shard-1",
        "attempts": 1,
        "max_retries": 2,
        "error": "smtp said no",
        "dead_lettered_at": PAST,
        "inferred": False,
        "task_data": json.dumps({"id": "d2"}),
    }
    code, out, _ = cli("dlq", q, "--id", "nothing-like-it")
    assert code == 0
    assert "No dead letters" in out


# ------------------------------------------------------------------------------ replay


def test_replay_puts_back_only_real_dead_letters(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_dead_letters(tmp_path / ".snerdata")
    monkeypatch.chdir(tmp_path)  # DIR defaults to .snerdata
    q = tmp_path / ".snerdata"
    before = log_path(q).stat().st_size
    code, out, _ = cli("replay", "--type=export")
    assert code == 0
    assert "replayed d1 (export) into shard-0" in out
    assert out.rstrip().endswith(
        "Replay complete. Recovered 1 failed task(s) into the active queue."
    )
    new = records(q)[-1]
    assert new["taskId"] == "d1" and new["retryCount"] == 0
    assert new["taskData"] == json.dumps({"id": "d1"})
    assert "deletedAt" not in new and "LastErrorObj" not in new and "snerdOutcome" not in new
    assert new["snerdEpoch"] == 1 and new["snerdNode"].startswith("snerdmq-replay@")
    assert abs(parse_rfc3339(new["executeAt"]) - time.time_ns() // 1000) < 60 * SECOND
    assert log_path(q).stat().st_size > before
    # Nothing else moved: successes (upstream bug 6.6.30) and the other types stay.
    code, out, _ = cli("replay", "--type", "export")
    assert "Recovered 0 failed task(s)" in out
    # Upstream-shaped tombstones only when asked.
    code, out, _ = cli("replay", "--type", "legacy")
    assert "Recovered 0 failed task(s)" in out
    assert "1 upstream tombstone(s) look like dead letters" in out
    code, out, _ = cli("replay", "--type", "legacy", "--include-upstream")
    assert "replayed u1 (legacy)" in out and "Recovered 1 failed task(s)" in out
    code, out, _ = cli("replay", "--id", "d2")
    assert "replayed d2 (mail) into shard-1" in out
    assert records(q, 1)[-1]["taskId"] == "d2"
    code, out, _ = cli("dlq", q, "--json")
    assert json.loads(out) == []


def test_replay_skips_a_duplicate_of_a_pending_deduped_task(cli: Cli, tmp_path: Path) -> None:
    q = plant(
        tmp_path / "q",
        {
            0: [
                claim(1),
                dead("d1", autoDedupe=True, payloadHash="abc"),
                task("twin", autoDedupe=True, payloadHash="abc"),
            ]
        },
    )
    code, out, _ = cli("replay", q)
    assert code == 0
    assert "skipped d1: an identical task (twin) is pending (auto_dedupe)" in out
    assert "Recovered 0 failed task(s)" in out


def test_replay_while_a_daemon_holds_the_shard_asks_it_to_retry(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), dead("d1")]})
    d = daemons(q)
    code, out, err = cli("replay", q)
    assert (code, err) == (0, "")
    # One retry of every dead letter of the shard, answered by its daemon.
    assert "retried 1 dead letter(s) in shard-0, by their daemons" in out
    assert "Recovered 1 failed task(s)" in out
    d.send({"action": "register", "task_type": "job"})
    again = d.execute()
    assert (again["task_id"], again["attempt"]) == ("d1", 1)
    # Nothing is left in the inbox: the tool removed its file once answered.
    assert list((q / "shard-0" / "inbox").glob("tool-*")) == []
    d.result("d1", ok=True)
    assert d.stop() == 0


def test_a_live_replay_not_answered_within_its_wait_is_pending_and_applied(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), dead("d1")]})
    d = daemons(q)
    code, out, _ = cli("replay", q, "--id", "d1", "--wait", "0")
    assert code == 4
    # (By id: a retry of that task, not of the shard's dead letters.)
    assert "d1: pending on shard-0 (no answer within the wait)" in out
    assert "Recovered 0 failed task(s) into the active queue; 1 pending." in out
    # The command is durable in the inbox: the daemon puts the task back all the same.
    d.send({"action": "register", "task_type": "job"})
    assert d.execute()["task_id"] == "d1"
    d.result("d1", ok=True)
    assert d.stop() == 0


def test_a_daemons_dead_letter_is_replayed_and_run_again(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    q = tmp_path / "q"
    d = daemons(q)
    d.send({"action": "register", "task_type": "flaky"})
    assert d.enqueue("t1", "flaky", {"n": 1})["action"] == "ack"
    run = d.execute()
    assert (run["task_id"], run["attempt"]) == ("t1", 1)
    d.result("t1", ok=False, error="upstream API 503")
    d.wait_for(lambda m: m.get("action") == "max_retries_reached")
    assert d.stop() == 0

    code, out, _ = cli("dlq", q, "--json")
    (letter,) = json.loads(out)
    assert (letter["task_id"], letter["attempts"], letter["error"]) == ("t1", 1, "upstream API 503")
    code, out, _ = cli("replay", q)
    assert code == 0
    assert "Recovered 1 failed task(s)" in out

    d = daemons(q)
    d.send({"action": "register", "task_type": "flaky"})
    again = d.execute()
    assert (again["task_id"], again["attempt"]) == ("t1", 1)
    assert json.loads(again["task_data"]) == {"n": 1}
    d.result("t1", ok=True)
    stats: dict[str, Any] = {}
    for _ in range(50):
        d.send({"action": "stats"})
        stats = d.wait_for(lambda m: m.get("action") == "stats")
        if stats["queue_depth"] == 0:
            break
        time.sleep(0.05)
    assert stats["queue_depth"] == 0
    assert d.stop() == 0
    code, out, _ = cli("stats", q, "--json")
    totals = json.loads(out)["totals"]
    assert (totals["live"], totals["completed"], totals["dead_letters"]) == (0, 1, 0)


# ------------------------------------------------------------------------------ fsck


def test_fsck_finds_a_corrupt_middle_line_a_torn_tail_and_temp_files(
    cli: Cli, tmp_path: Path
) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), task("a"), task("b"), task("c")]})
    path = log_path(q)
    data = bytearray(path.read_bytes())
    lines = data.split(b"\n")
    second = len(lines[0]) + 1 + len(lines[1]) + 1  # offset of task b's line
    data[second + 12] ^= 0x01  # one flipped bit inside "b"'s record
    torn_at = len(data)
    data += b'{"taskId":"d","retryCo'  # a crash mid-append
    path.write_bytes(bytes(data))
    (path.parent / "tasks.tmp").write_bytes(b"half a compaction")

    code, out, _ = cli("fsck", q)
    assert code == 1
    assert f"corrupt line at byte {second}: checksum mismatch" in out
    assert f"torn tail: 22 byte(s) without a newline at byte {torn_at}" in out
    assert "leftover temp file tasks.tmp" in out
    assert "fsck: 3 problem(s)" in out

    code, out, _ = cli("fsck", q, "--json")
    report = json.loads(out)["shards"][0]
    assert report["corrupt"] == [{"offset": second, "reason": "checksum mismatch"}]
    assert report["torn_tail"] == {"offset": torn_at, "bytes": 22}
    assert report["records"] == 3

    code, out, _ = cli("fsck", q, "--repair")
    assert code == 1  # the corrupt line stays: daemons skip it, compaction drops it
    assert "repaired: removed tasks.tmp" in out
    assert "repaired: cut a torn tail of 22 byte(s)" in out
    assert path.stat().st_size == torn_at
    assert not (path.parent / "tasks.tmp").exists()
    assert "fsck: 1 problem(s)" in out

    code, out, _ = cli("compact", q)
    assert code == 0
    assert "dropped 1 corrupt line(s)" in out
    code, out, _ = cli("fsck", q)
    assert code == 0, out
    assert "fsck: no problems." in out
    assert [r.get("taskId") for r in records(q)] == [None, "a", "c"]


def test_fsck_reports_stale_records_and_ids_live_in_two_shards(cli: Cli, tmp_path: Path) -> None:
    q = plant(
        tmp_path / "q",
        {
            0: [claim(1), task("x"), claim(2), task("late", epoch=1)],
            1: [claim(1), task("x")],
        },
    )
    code, out, _ = cli("fsck", q)
    assert code == 1
    assert "1 stale-epoch record(s) fenced off" in out and "epoch 1 < 2" in out
    assert "task x is live in shard-0, shard-1" in out
    assert "fsck: 1 problem(s)" in out


def test_fsck_repair_leaves_a_shard_held_by_a_daemon_alone(cli: Cli, tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), task("a")]})
    (log_path(q).parent / "tasks.tmp").write_bytes(b"x")
    locks = ShardLocks(q)
    assert locks.try_lock(0, "busy@pid-7-cc")
    try:
        code, out, _ = cli("fsck", q, "--repair")
    finally:
        locks.unlock_all()
    assert code == 1
    assert "not repaired: held by a daemon (busy@pid-7-cc" in out
    assert (log_path(q).parent / "tasks.tmp").exists()


def test_fsck_keeps_a_whole_last_record_that_lost_its_newline(cli: Cli, tmp_path: Path) -> None:
    # `truncate -s -1 tasks.log`: the last record is whole (its checksum holds) and may have
    # been acknowledged. fsck says so, stats and compact count it, --repair writes the newline
    # back; nothing cuts it.
    q = plant(tmp_path / "q", {0: [claim(1), task("a"), task("b")]})
    path = log_path(q)
    whole = path.read_bytes()
    at = whole.rindex(b"\n", 0, len(whole) - 1) + 1
    path.write_bytes(whole[:-1])

    code, out, _ = cli("fsck", q)
    assert code == 1
    assert (
        f"the last record (at byte {at}, {len(whole) - 1 - at} byte(s)) lacks its newline: "
        "it is a whole record, so it is kept" in out
    )
    report = json.loads(cli("fsck", q, "--json")[1])["shards"][0]
    assert report["torn_tail"] is None and report["records"] == 3
    assert report["unterminated_record"] == {"offset": at, "bytes": len(whole) - 1 - at}
    code, out, _ = cli("stats", q, "--json")
    assert json.loads(out)["totals"]["live"] == 2

    code, out, _ = cli("fsck", q, "--repair")
    assert code == 0, out
    assert f"repaired: wrote back the newline of the whole last record at byte {at}" in out
    assert path.read_bytes() == whole

    path.write_bytes(whole[:-2])  # the closing brace lost too: a torn write, cut
    code, out, _ = cli("fsck", q, "--repair")
    assert f"repaired: cut a torn tail of {len(whole) - 2 - at} byte(s) at byte {at}" in out
    assert path.read_bytes() == whole[:at]


def test_compact_keeps_a_whole_last_record_that_lost_its_newline(cli: Cli, tmp_path: Path) -> None:
    q = plant(tmp_path / "q", {0: [claim(1), task("a"), task("a"), task("b")]})
    path = log_path(q)
    path.write_bytes(path.read_bytes()[:-1])
    code, out, _ = cli("compact", q)
    assert code == 0, out
    assert "wrote back the newline of the whole last record" in out
    assert [r.get("taskId") for r in records(q)] == [None, "a", "b"]


# ------------------------------------------------------------------------------ compact


def test_compact_shrinks_the_log_and_a_restarted_daemon_has_every_live_task(
    cli: Cli, tmp_path: Path, daemons: Callable[..., Daemon]
) -> None:
    history: list[dict[str, Any]] = [claim(1)]
    for i in range(300):
        history += [task(f"old-{i}"), dispatch(f"old-{i}", 1), done(f"old-{i}")]
    live = [
        task("keep-1", "keep"),
        task("keep-2", "keep"),
        dispatch("keep-2", 1),
        task("keep-2", "keep", retryCount=1, LastErrorObj="once"),
        task("keep-3", "keep", taskData=json.dumps({"big": "x" * 500})),
        task("keep-4", "keep"),
        dispatch("keep-4", 1),  # in flight when the owner died
    ]
    q = plant(
        tmp_path / "q",
        {
            0: history[:400]
            + live
            + history[400:]
            + [
                task("keep-5", "keep", epoch=0),  # written by a fenced-off owner: not live
            ]
        },
    )
    before = log_path(q).stat().st_size
    code, out, _ = cli("compact", q, "--history", "10")
    assert code == 0, out
    after = log_path(q).stat().st_size
    assert after < before / 10
    assert f"shard-0: {before / 1024:.1f} KiB -> " in out
    assert "4 live, 10 finished kept" in out
    assert not (log_path(q).parent / "tasks.tmp").exists()
    code, out, _ = cli("fsck", q)
    assert code == 0, out

    d = daemons(q)
    d.send({"action": "register", "task_type": "keep"})
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(4):
        run = d.execute()
        seen[run["task_id"]] = run
        d.result(run["task_id"], ok=True)
    assert set(seen) == {"keep-1", "keep-2", "keep-3", "keep-4"}
    assert seen["keep-2"]["attempt"] == 2
    assert seen["keep-4"]["attempt"] == 1  # the crash re-execution keeps its attempt number
    assert json.loads(seen["keep-3"]["task_data"]) == {"big": "x" * 500}
    assert d.stop() == 0


def test_compact_skips_a_shard_a_daemon_holds(cli: Cli, tmp_path: Path) -> None:
    q = plant(
        tmp_path / "q", {0: [claim(1), task("a"), done("a")], 1: [claim(1), task("b"), done("b")]}
    )
    locks = ShardLocks(q)
    assert locks.try_lock(1, "busy@pid-7-cc")
    size1 = log_path(q, 1).stat().st_size
    try:
        code, out, _ = cli("compact", q, "--history", "0")
    finally:
        locks.unlock_all()
    assert code == 1
    assert "shard-1: skipped: shard-1 is held by a running daemon (busy@pid-7-cc" in out
    assert log_path(q, 1).stat().st_size == size1
    assert [r["snerdKind"] for r in records(q, 0)] == ["claim"]
    code, out, _ = cli("compact", q, "--history", "0")
    assert code == 0
    assert "shard-0: " in out and "already compact" in out
