"""The dashboard (`snerd.dashboard`): its view of a queue's files beside a live daemon, its API
and WebSocket, its guards (host, token, origin, headers), its command, and the page in a real
headless Chromium."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import trio
from playwright.async_api import Page, async_playwright, expect
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from snerd import Engine, SnerdQueue, yield_progress
from snerd.cli.dashboard import main as dashboard_main
from snerd.core.records import encode_record
from snerd.core.timefmt import format_rfc3339
from snerd.dashboard.app import COOKIE, create_app, host_of
from snerd.dashboard.server import is_loopback
from snerd.dashboard.view import QueueView
from snerd.queuedir import open_queue, rescan_shard
from tests.conftest import missing_tool
from tests.support.daemon import SNERDMQ, Daemon
from tests.support.sdkhelpers import Calls, Runner
from tests.support.sdkhelpers import run as run  # the fixture

SECOND = 1_000_000
#: A task id and an error that would run script if the page ever rendered values as HTML.
XSS_ID = "<img src=x onerror=\"document.title='pwned'\">"
XSS_ERROR = "<script>document.title='pwned'</script> quota exceeded"


def wall_us() -> int:
    return time.time_ns() // 1000


def view_of(q: Path) -> QueueView:
    return QueueView(q, skew_us=5 * SECOND, clock=wall_us)


# ------------------------------------------------------------------------------------------
# A queue written by hand: one shard, a waiting task, a delayed one, a completed one and a
# dead letter
# ------------------------------------------------------------------------------------------


def task(task_id: str, seq: int, **extra: Any) -> dict[str, Any]:
    now = format_rfc3339(wall_us())
    return {
        "taskId": task_id,
        "retryCount": 0,
        "maxRetries": 2,
        "retryAfterHours": 0.0,
        "retryAfterTime": now,
        "taskData": "{}",
        "taskType": "email",
        "executeAt": now,
        "snerdSeq": seq,
        **extra,
    }


def hand_made_queue(root: Path, *, dead_id: str = "dead-1", error: str = "mailbox full") -> Path:
    q = root / "q"
    (q / "shard-0" / "tasks").mkdir(parents=True)
    (q / "membership.json").write_bytes(
        orjson.dumps({"queue": "snerdmq-daemon", "shards": 1, "version": 3, "claims": {}})
    )
    later = format_rfc3339(wall_us() + 3600 * SECOND)
    done = format_rfc3339(wall_us())
    lines = [
        task("wait-1", 1),
        task("later-1", 2, executeAt=later, retryAfterTime=later),
        task("done-1", 3, deletedAt=done, snerdOutcome="completed"),
        task(
            dead_id,
            4,
            taskType="export",
            retryCount=3,
            deletedAt=done,
            snerdOutcome="dead_letter",
            LastErrorObj=error,
        ),
    ]
    log(q).write_bytes(b"".join(encode_record(f) for f in lines))
    return q


def log(q: Path) -> Path:
    return q / "shard-0" / "tasks" / "tasks.log"


def append(q: Path, fields: dict[str, Any]) -> None:
    with log(q).open("ab") as f:
        f.write(encode_record(fields))


# ------------------------------------------------------------------------------------------
# The view beside a real daemon
# ------------------------------------------------------------------------------------------


async def until(view: QueueView, check: Any, what: str, timeout: float = 15.0) -> None:
    """Refresh `view` until `check(view)` holds (the daemon writes some records lazily)."""
    with trio.move_on_after(timeout):
        while True:
            view.refresh()
            if check(view):
                return
            await trio.sleep(0.05)
    raise AssertionError(f"{what}: not seen in {timeout} s; stats {view.stats()['totals']}")


def ids(view: QueueView, status: str) -> set[str]:
    return {t["id"] for t in view.tasks(status)}


async def run_one(d: Daemon, task_id: str, task_type: str, status: str, **extra: Any) -> None:
    await d.enqueue(task_id, task_type, **extra)
    await d.wait_for(lambda m: m.get("action") == "execute" and m.get("task_id") == task_id)
    reply = {"action": "result", "task_id": task_id, "status": status}
    if status != "success":
        reply["error_msg"] = "disk on fire"
    await d.send(reply)


async def test_the_view_follows_a_running_daemon_and_a_compaction(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    q = tmp_path / "q"
    d = await Daemon.start(nursery, q, env={"SNERD_DRAIN_TIMEOUT": "0.2"})
    membership = await d.wait_for(lambda m: m.get("action") == "membership")
    for task_type in ("ok", "bad", "slow"):
        await d.send({"action": "register", "task_type": task_type})
    await run_one(d, "ok-1", "ok", "success")
    await run_one(d, "bad-1", "bad", "error", max_retries=0)
    await d.enqueue("wait-1", "nobody")
    await d.enqueue("later-1", "ok", execute_at=format_rfc3339(wall_us() + 3600 * SECOND))
    await d.enqueue("run-1", "slow")
    await d.wait_for(lambda m: m.get("action") == "execute" and m.get("task_id") == "run-1")

    view = view_of(q)
    await until(
        view,
        lambda v: (
            ids(v, "completed") == {"ok-1"}
            and ids(v, "dead_letter") == {"bad-1"}
            and ids(v, "in_flight") == {"run-1"}
            and ids(v, "waiting") == {"wait-1"}
            and ids(v, "delayed") == {"later-1"}
        ),
        "every task in its state",
    )
    totals = view.stats()["totals"]
    assert (totals["live"], totals["completed"], totals["dead_letters"]) == (3, 1, 1)
    # A delayed task's next run is its execute_at, not its enqueue time.
    (later,) = view.tasks("delayed")
    assert later["next_run"] == later["execute_at"] > later["retry_after"]
    (letter,) = view.dead_letters()
    assert (letter["id"], letter["attempts"], letter["error"]) == ("bad-1", 1, "disk on fire")
    # The daemon's heartbeat and claim, read from membership.json.
    await until(view, lambda v: any(x["types"] for x in v.daemons()), "handler types")
    (daemon,) = view.daemons()
    assert daemon["shards"] == ["shard-0"] == membership["owned"]
    assert {"ok", "bad", "slow"} <= set(daemon["types"])
    assert view.stats()["per_shard"][0]["owner"] == daemon["node"]
    # No payloads, no webhook URLs.
    assert all("taskData" not in t and "task_data" not in t for t in view.tasks())

    # Nothing new: no change, same version; a new enqueue: one change, seen.
    view.refresh()
    version = view.version
    assert view.refresh() is False and view.version == version
    await d.enqueue("wait-2", "nobody")
    await d.wait_for(lambda m: m.get("action") == "ack")
    await until(view, lambda v: "wait-2" in ids(v, "waiting"), "the new enqueue")
    assert view.version > version

    await d.close_stdin()
    assert await d.wait() == 0
    await until(view, lambda v: v.daemons() == [] or v.daemons()[0]["shards"] == [], "the drain")

    # An offline compaction installs a new, shorter file: read again, not appended to.
    inode = os.stat(log(q)).st_ino
    done = subprocess.run(
        [*SNERDMQ, "compact", str(q), "--history", "0"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert os.stat(log(q)).st_ino != inode
    await until(
        view,
        lambda v: (
            v.stats()["totals"]["completed"] == 0 and v.stats()["totals"]["dead_letters"] == 0
        ),
        "the compacted log",
    )
    assert view.stats()["totals"]["live"] == 4
    assert ids(view, "waiting") == {"wait-1", "wait-2"}


def test_a_torn_tail_is_folded_once_it_is_completed(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    queue = open_queue(str(q))
    scan = rescan_shard(queue, 0, None)
    assert len(scan.fold.live) == 2
    line = encode_record(task("torn-1", 5))
    with log(q).open("ab") as f:
        f.write(line[:20])
    scan2 = rescan_shard(queue, 0, scan)
    assert scan2 is scan and scan.torn == 20 and len(scan.fold.live) == 2
    with log(q).open("ab") as f:
        f.write(line[20:])
    scan3 = rescan_shard(queue, 0, scan)
    assert scan3 is scan and scan.torn == 0 and scan.corrupt == []
    assert "torn-1" in scan.fold.live and len(scan.fold.live) == 3
    # Unchanged: the same scan, nothing folded twice.
    records = scan.fold.records
    assert rescan_shard(queue, 0, scan) is scan and scan.fold.records == records
    # Truncated (a log replaced by a shorter one, same inode): read whole again.
    data = log(q).read_bytes()
    with log(q).open("r+b") as f:
        f.truncate(len(data) - len(line))
    scan4 = rescan_shard(queue, 0, scan)
    assert scan4 is not scan and "torn-1" not in scan4.fold.live and len(scan4.fold.live) == 2
    # Replaced by rename (a compaction) with a file at least as long: read whole again, not
    # from the old file's end.
    new = log(q).with_name("tasks.tmp")
    new.write_bytes(b"".join(encode_record(task(f"n-{i}", i)) for i in range(1, 40)))
    assert new.stat().st_size >= scan4.size
    os.replace(new, log(q))
    scan5 = rescan_shard(queue, 0, scan4)
    assert scan5 is not scan4 and set(scan5.fold.live) == {f"n-{i}" for i in range(1, 40)}
    assert scan5.corrupt == []


def test_a_directory_that_is_not_a_queue_is_an_error_in_the_view(tmp_path: Path) -> None:
    view = view_of(tmp_path)
    assert view.refresh() is True
    assert "not a snerd queue directory" in (view.error or "")
    assert view.snapshot()["stats"] == {"error": view.error}
    assert view.refresh() is False
    hand_made_queue(tmp_path)
    view.directory = tmp_path / "q"
    assert view.refresh() is True and view.error is None


# ------------------------------------------------------------------------------------------
# The API and the WebSocket
# ------------------------------------------------------------------------------------------


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    q = hand_made_queue(tmp_path)
    # A monotonic clock that moves a second per look: every read refreshes; no timed push.
    ticks = itertools.count()
    app = create_app(
        view_of(q),
        allowed_hosts=["testserver"],
        refresh_s=0.01,
        push_every_s=math.inf,
        monotonic=lambda: float(next(ticks)),
    )
    with TestClient(app) as c:
        yield c, q


def test_the_api_reports_states_filters_and_dead_letters(client: tuple[TestClient, Path]) -> None:
    c, q = client
    snap = c.get("/api/snapshot").json()
    assert snap["stats"]["totals"]["live"] == 2
    assert {t["id"]: t["status"] for t in snap["tasks"]} == {
        "wait-1": "waiting",
        "later-1": "delayed",
        "done-1": "completed",
        "dead-1": "dead_letter",
    }
    assert [t["id"] for t in c.get("/api/tasks?status=delayed").json()] == ["later-1"]
    # Live tasks in enqueue order (snerdSeq), not file order, then the latest finished.
    append(q, task("upstream-1", 0))
    assert [t["id"] for t in c.get("/api/tasks?limit=3").json()] == [
        "upstream-1",
        "wait-1",
        "later-1",
    ]
    assert [t["id"] for t in c.get("/api/tasks?limit=1&status=waiting").json()] == ["upstream-1"]
    (letter,) = c.get("/api/dead-letters").json()
    assert (letter["id"], letter["attempts"], letter["error"]) == ("dead-1", 3, "mailbox full")
    assert c.get("/api/stats").json()["shards"] == 1
    assert c.get("/api/membership").json()["version"] == 3
    assert c.get("/api/daemons").json() == []


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("/api/tasks?status=running", "status must be one of"),
        ("/api/tasks?limit=0", "limit must be a whole number from 1 to 1000, got '0'"),
        ("/api/tasks?limit=lots", "got 'lots'"),
        ("/api/dead-letters?limit=1001", "got '1001'"),
    ],
)
def test_a_bad_query_is_a_400_naming_it(
    client: tuple[TestClient, Path], query: str, named: str
) -> None:
    response = client[0].get(query)
    assert response.status_code == 400
    assert named in response.json()["error"]


def test_every_response_carries_the_security_headers(client: tuple[TestClient, Path]) -> None:
    c, _ = client
    for path in ("/", "/app.js", "/style.css", "/api/stats"):
        r = c.get(path)
        assert r.status_code == 200
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "access-control-allow-origin" not in r.headers
    assert c.get("/").headers["content-type"].startswith("text/html")
    assert c.get("/app.js").headers["content-type"].startswith("text/javascript")


def test_a_foreign_host_header_is_refused(client: tuple[TestClient, Path]) -> None:
    r = client[0].get("/api/stats", headers={"host": "rebound.example"})
    assert r.status_code == 400
    assert (
        "Host header 'rebound.example' is not a name this dashboard answers to" in r.json()["error"]
    )


def loopback_client(q: Path) -> TestClient:
    """The app as `snerdmq dashboard --host ::1` makes it: it answers to the loopback names."""
    return TestClient(create_app(view_of(q), allowed_hosts=["127.0.0.1", "localhost", "::1"]))


@pytest.mark.parametrize(
    "host", ["[::1]:8642", "[::1]", "[0:0::1]:1", "localhost", "LOCALHOST:8642", "127.0.0.1:80"]
)
def test_a_loopback_host_header_is_served_bracketed_ipv6_too(tmp_path: Path, host: str) -> None:
    with loopback_client(hand_made_queue(tmp_path)) as c:
        r = c.get("/api/stats", headers={"host": host})
        assert r.status_code == 200, r.text
        assert r.json()["shards"] == 1
        assert c.get("/", headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("::1", "is not a host[:port]"),  # a bare IPv6 address is not a Host (RFC 3986)
        ("[::1", "is not a host[:port]"),
        ("[::1]:http", "is not a host[:port]"),
        ("[not-an-address]", "is not a host[:port]"),
        ("localhost:70000", "is not a host[:port]"),
        ("local host", "is not a host[:port]"),
        ("", "is not a host[:port]"),
        ("[::2]:8642", "is not a name this dashboard answers to"),
        ("127.0.0.1.rebound.example", "is not a name this dashboard answers to"),
    ],
)
def test_a_bad_host_header_is_a_400_naming_it(tmp_path: Path, host: str, says: str) -> None:
    with loopback_client(hand_made_queue(tmp_path)) as c:
        r = c.get("/api/stats", headers={"host": host})
        assert r.status_code == 400
        assert f"the Host header {host!r} {says}" in r.json()["error"]
        page = c.get("/", headers={"host": host})
        assert page.status_code == 400 and says in page.text


def test_host_of_spells_each_host_one_way() -> None:
    assert host_of("[::1]:8642") == host_of("[0:0:0::1]") == "::1"
    assert host_of("LocalHost:1") == "localhost"
    assert host_of("127.0.0.1:65535") == "127.0.0.1"
    assert host_of("[fe80::1%eth0]") == "fe80::1%eth0"
    for bad in ("::1", "[::1", "[1.2.3.4]", "a:b:c", "a:", "h:65536", " h", "[]", ":80"):
        assert host_of(bad) is None, bad


def test_a_malformed_origin_refuses_the_websocket(client: tuple[TestClient, Path]) -> None:
    # urlsplit raised ValueError on this one: the handler failed with a traceback in the log.
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client[0].websocket_connect("/ws", headers={"origin": "http://[::1"}) as ws,
    ):
        ws.receive_text()
    assert refused.value.code == 1008


def test_the_websocket_pushes_a_snapshot_then_each_change(client: tuple[TestClient, Path]) -> None:
    c, q = client
    with c.websocket_connect("/ws", headers={"origin": "http://testserver"}) as ws:
        first = orjson.loads(ws.receive_text())
        assert first["stats"]["totals"]["live"] == 2
        append(q, task("new-1", 9))
        second = orjson.loads(ws.receive_text())
        assert second["version"] > first["version"]
        assert "new-1" in {t["id"] for t in second["tasks"]}
        assert second["stats"]["totals"]["live"] == 3


def test_a_cross_origin_websocket_is_refused(client: tuple[TestClient, Path]) -> None:
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        client[0].websocket_connect("/ws", headers={"origin": "http://evil.example"}) as ws,
    ):
        ws.receive_text()
    assert refused.value.code == 1008


def test_with_a_token_every_request_must_carry_it(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    app = create_app(view_of(q), token="s3cret", refresh_s=0.01)
    with TestClient(app, follow_redirects=False) as c:
        assert c.get("/api/stats").status_code == 401
        assert "SNERD_DASHBOARD_TOKEN" in c.get("/api/stats").json()["error"]
        assert c.get("/").status_code == 401
        assert c.get("/api/stats", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/stats", headers={"cookie": '=;;"x; \x7f'}).status_code == 401
        assert c.get("/?token=wrong").status_code == 401
        ok = c.get("/api/stats", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["shards"] == 1
        with pytest.raises(WebSocketDisconnect) as refused, c.websocket_connect("/ws") as ws:
            ws.receive_text()
        assert refused.value.code == 1008
        # The login link sets an HttpOnly, SameSite=Strict cookie and leaves the address bar.
        login = c.get("/?token=s3cret")
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=s3cret") and "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower()
        assert c.get("/").status_code == 200  # the client keeps the cookie
        with c.websocket_connect("/ws") as ws:
            assert orjson.loads(ws.receive_text())["stats"]["shards"] == 1


# ------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--host", "0.0.0.0"], {}, "--host 0.0.0.0 is not a loopback address"),
        (
            ["--host", "0.0.0.0", "--token", " "],
            {},
            "token (--token or SNERD_DASHBOARD_TOKEN) is empty",
        ),
        (["--port", "70000"], {}, "--port must be a whole number from 0 to 65535, got '70000'"),
        (["--port", "http"], {}, "got 'http'"),
        (["--host", "10.1.2.3"], {"SNERD_CLOCK_SKEW_MARGIN": "x"}, "not a loopback"),
        ([], {"SNERD_CLOCK_SKEW_MARGIN": "x"}, "SNERD_CLOCK_SKEW_MARGIN"),
    ],
)
def test_a_bad_argument_is_exit_2_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    env: dict[str, str],
    named: str,
) -> None:
    q = hand_made_queue(tmp_path)
    monkeypatch.delenv("SNERD_DASHBOARD_TOKEN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert dashboard_main([str(q), *argv]) == 2
    assert named in capsys.readouterr().err


def test_a_directory_that_is_not_a_queue_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert dashboard_main([str(tmp_path)]) == 2
    assert "not a snerd queue directory" in capsys.readouterr().err


def test_loopback_names() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1")
    assert is_loopback("[::1]") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert not is_loopback("example.com")


class Server:
    """`snerdmq dashboard` as a real process on a free port."""

    def __init__(self, q: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*SNERDMQ, "dashboard", str(q), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens, or exits
        if "snerd dashboard for" not in line:
            self.proc.kill()
            raise AssertionError(f"no address line: {line!r}; stderr {self.proc.communicate()[1]}")
        self.url = line.split(": ", 1)[1].split()[0]
        host = next((args[i + 1] for i, a in enumerate(args) if a == "--host"), "127.0.0.1")
        shown = f"[{host.strip('[]')}]" if ":" in host else host
        assert self.url.startswith(f"http://{shown}:") and self.url.endswith("/"), self.url

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_the_command_serves_with_its_token_and_stops_on_sigterm(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    with Server(q, env={"SNERD_DASHBOARD_TOKEN": "t0ken"}) as server:
        assert httpx.get(f"{server.url}api/stats").status_code == 401
        r = httpx.get(f"{server.url}api/stats", headers={"authorization": "Bearer t0ken"})
        assert r.status_code == 200 and r.json()["totals"]["dead_letters"] == 1
        assert server.stop() == 0


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_the_command_on_ipv6_loopback_answers_its_own_address(tmp_path: Path) -> None:
    if not ipv6_loopback():
        pytest.skip("no IPv6 loopback here (test_a_loopback_host_header_is_served covers the app)")
    q = hand_made_queue(tmp_path)
    with Server(q, "--host", "::1") as server:
        # httpx sends `Host: [::1]:PORT`, as a browser does.
        r = httpx.get(f"{server.url}api/stats")
        assert r.status_code == 200, r.text
        assert r.json()["totals"]["dead_letters"] == 1
        assert httpx.get(server.url).status_code == 200
        rebound = httpx.get(f"{server.url}api/stats", headers={"host": "rebound.example"})
        assert rebound.status_code == 400
        assert server.stop() == 0


def test_hostile_requests_to_a_real_server_get_4xx_and_no_traceback(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    with Server(q) as server:
        port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
        key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13"
        upgrade = f"Upgrade: websocket\r\nConnection: Upgrade\r\n{key}"
        for request, status in [
            (f"GET /ws HTTP/1.1\r\nHost: localhost\r\n{upgrade}\r\nOrigin: http://[::1\r\n", 403),
            ("GET /api/tasks?limit=%ff HTTP/1.1\r\nHost: localhost\r\n", 400),
            ("GET /api/tasks?status=%00 HTTP/1.1\r\nHost: localhost\r\n", 400),
            ("GET /%ff%00/../x HTTP/1.1\r\nHost: localhost\r\n", 404),
            ("GET /api/stats HTTP/1.1\r\nHost: [::1\r\n", 400),
            ("GET /api/stats HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n", 400),
            ("GET /api/stats HTTP/1.1\r\n", 400),
        ]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                close = "" if "Upgrade" in request else "Connection: close\r\n"
                sock.sendall(f"{request}{close}\r\n".encode())
                head = sock.recv(4096).split(b"\r\n", 1)[0]
            assert head.startswith(f"HTTP/1.1 {status}".encode()), (request, head)
        assert server.stop() == 0
        assert server.proc.stderr is not None
        err = server.proc.stderr.read()
    assert "Traceback" not in err and "Error in ASGI" not in err, err


# ------------------------------------------------------------------------------------------
# The page in a real browser
# ------------------------------------------------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    missing_tool("no chromium on PATH (Debian: apt-get install chromium)")


#: Flags for Chromium here: root (no sandbox), no GPU, and none of its calls home (refused
#: on a closed network).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.asynccontextmanager
async def browser_page() -> AsyncIterator[Page]:
    """A page in a real headless Chromium, driven by Playwright (asyncio)."""
    executable = chromium()
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            await browser.close()


async def _the_page(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path, dead_id=XSS_ID, error=XSS_ERROR)
    with Server(q) as server:
        async with browser_page() as page:
            await page.goto(server.url)
            # Rendered from a snapshot that came over the WebSocket.
            await page.wait_for_selector('body[data-source="ws"]')
            await expect(page.locator("#connection")).to_have_text("live")
            await expect(page.locator("#n-live")).to_have_text("2")
            await expect(page.locator("#n-completed")).to_have_text("1")
            await expect(page.locator("#n-dead_letters")).to_have_text("1")
            await expect(page.locator("#tasks tbody tr")).to_have_count(4)
            # The hostile id and error are text: shown as typed, no element made of them,
            # their script never ran (the title is the page's own).
            dead = page.locator("#dead tbody tr td")
            await expect(dead.nth(0)).to_have_text(XSS_ID)
            await expect(dead.nth(5)).to_have_text(XSS_ERROR)
            assert await page.locator("main img, main script").count() == 0
            assert await page.title() == "snerd dashboard"
            # Live: a task appended to the log appears without a reload.
            append(q, task("new-1", 9))
            await expect(page.locator("#n-live")).to_have_text("3")
            await expect(page.locator("#tasks tbody td", has_text="new-1")).to_have_count(1)
            # The status filter asks the API for that state only.
            await page.select_option("#status-filter", "delayed")
            rows = page.locator("#tasks tbody tr")
            await expect(rows).to_have_count(1)
            await expect(rows.first.locator("td").first).to_have_text("later-1")
        assert server.stop() == 0


def test_the_page_in_chromium_follows_the_queue_live_and_never_renders_html(
    tmp_path: Path,
) -> None:
    anyio.run(_the_page, tmp_path, backend="asyncio")


# ------------------------------------------------------------------------------------------
# Served by the SDK, with the progress its handlers report
# ------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def rendering(tmp_path: Path, progress: Any) -> AsyncIterator[tuple[SnerdQueue, str]]:
    """A SnerdQueue serving its dashboard, with one task, `r-1`, running: it has reported
    `progress` and holds until the block ends. Yields the queue and the dashboard's URL."""
    running = Calls()
    release = anyio.Event()
    async with SnerdQueue(storage_path=tmp_path / "q", drain_timeout=5) as q:

        @q.handler("render")
        async def render(data: Any) -> None:
            yield_progress(progress)
            running.add(data)
            await release.wait()

        url = await q.start_dashboard(port=0)
        await q.enqueue("r-1", "render", {})
        await running.wait(1)
        try:
            yield q, url
        finally:
            release.set()


async def _sdk_dashboard(tmp_path: Path) -> None:
    async with rendering(tmp_path, {"pct": 50, "of": "cover.png"}) as (q, url):
        assert url.startswith("http://127.0.0.1:")
        with pytest.raises(ValueError, match="not a loopback address"):
            await q.start_dashboard(host="0.0.0.0")
        with pytest.raises(RuntimeError, match="already served"):
            await q.start_dashboard(port=0)
        async with httpx.AsyncClient(base_url=url) as client:
            with anyio.fail_after(15):
                while True:
                    lines = (await client.get("/api/progress")).json()
                    snap = (await client.get("/api/snapshot")).json()
                    tasks = {t["id"]: t["status"] for t in snap["tasks"]}
                    if lines and tasks.get("r-1") == "in_flight":
                        break
                    await anyio.sleep(0.05)
            assert [(p["task_id"], p["data"]) for p in lines] == [
                ("r-1", {"pct": 50, "of": "cover.png"})
            ]
            assert snap["progress"] == lines
    # Stopped with the queue.
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{url}api/stats")


def test_the_sdk_serves_the_dashboard_with_its_progress(run: Runner, tmp_path: Path) -> None:
    run(_sdk_dashboard, tmp_path)


def test_a_dashboard_without_an_sdk_has_no_progress(client: tuple[TestClient, Path]) -> None:
    c, _ = client
    assert c.get("/api/progress").status_code == 404
    assert "progress" not in c.get("/api/snapshot").json()


async def _progress_in_chromium(tmp_path: Path) -> None:
    async with (
        rendering(tmp_path, {"pct": 40, "note": XSS_ERROR}) as (_, url),
        browser_page() as page,
    ):
        await page.goto(url)
        lines = page.locator("#progress li")
        await expect(lines).to_have_count(1)
        text = await lines.first.inner_text()
        assert "r-1" in text and '"pct":40' in text and "<script>" in text
        assert await page.locator("#progress-section").is_visible()
        assert await page.locator("main script").count() == 0


def test_the_sdk_dashboard_page_shows_progress_in_chromium(tmp_path: Path) -> None:
    anyio.run(_progress_in_chromium, tmp_path, backend="asyncio")


def test_a_corrupt_file_is_reported_and_the_dashboard_recovers(
    client: tuple[TestClient, Path],
) -> None:
    c, q = client
    good = (q / "membership.json").read_bytes()
    (q / "membership.json").write_bytes(b'{"shards": 1, "claims": ')
    snap = c.get("/api/snapshot").json()
    assert "membership.json is not a usable membership file: not valid JSON" in snap["error"]
    assert snap["tasks"] == [] and snap["stats"] == {"error": snap["error"]}
    (q / "membership.json").write_bytes(good)
    # A corrupt line in the log is counted, and never hides the lines after it.
    with log(q).open("ab") as f:
        f.write(b'{"taskId":"x","snerdCrc":"0000000000000000"}\n')
    append(q, task("after-1", 10))
    snap = c.get("/api/snapshot").json()
    assert snap["error"] is None
    assert snap["stats"]["totals"]["corrupt_lines"] == 1
    assert "after-1" in {t["id"] for t in snap["tasks"]}


def test_the_files_are_read_at_most_once_a_refresh_interval(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    now = [100.0]
    app = create_app(view_of(q), refresh_s=1.0, monotonic=lambda: now[0])
    with TestClient(app) as c:
        assert c.get("/api/stats").json()["totals"]["live"] == 2
        append(q, task("new-1", 9))
        now[0] += 0.9
        assert c.get("/api/stats").json()["totals"]["live"] == 2  # within the interval
        now[0] += 0.1
        assert c.get("/api/stats").json()["totals"]["live"] == 3


async def _engine_dashboard(tmp_path: Path) -> None:
    async with Engine(tmp_path / "q") as engine:
        url = await engine.start_dashboard(port=0)
        await engine.enqueue("e-1", "nobody", {})
        async with httpx.AsyncClient(base_url=url) as client:
            with anyio.fail_after(15):
                while "e-1" not in {t["id"] for t in (await client.get("/api/tasks")).json()}:
                    await anyio.sleep(0.05)
            assert (await client.get("/api/progress")).json() == []
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{url}api/stats")


def test_the_engine_serves_the_dashboard_of_its_directory(tmp_path: Path) -> None:
    anyio.run(_engine_dashboard, tmp_path, backend="trio")


# ------------------------------------------------------------------------------------------
# The dashboard acts: retry, cancel, pause, behind its guards
# ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def live_daemon(q: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon on `q` with no handler registered: nothing runs, every task stays put."""
    proc = subprocess.Popen(
        [*SNERDMQ, str(q)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**os.environ, "SNERD_DRAIN_TIMEOUT": "2"},
    )
    try:
        deadline = time.monotonic() + 15
        while not _claimed(q):
            assert time.monotonic() < deadline, "the daemon never took shard-0"
            time.sleep(0.05)
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        if proc.wait(timeout=15) != 0:
            raise AssertionError("the daemon failed its drain")


def _claimed(q: Path) -> bool:
    doc = orjson.loads((q / "membership.json").read_bytes())
    return bool(doc.get("claims", {}).get("shard-0", {}).get("owner"))


def post(server: Server, action: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}api/act/{action}", content=orjson.dumps(body),
                      headers={"content-type": "application/json", **headers})


async def _actions_in_chromium(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    with live_daemon(q), Server(q) as server:
        async with browser_page() as page:
            await page.goto(server.url)
            await page.wait_for_selector('body[data-source="ws"]')
            result = page.locator("#action-result")
            # Retry the dead letter: its daemon puts it back.
            await page.locator("#dead tbody button[data-action=retry]").click()
            await expect(result).to_have_text("dead-1: retried (found dead_letter)")
            await expect(page.locator("#dead tbody td.empty")).to_have_text("no dead letters")
            # Cancel a waiting task.
            row = page.locator("#tasks tbody tr", has_text="wait-1")
            await row.locator("button[data-action=cancel]").click()
            await expect(result).to_have_text("wait-1: cancelled (found queued)")
            await expect(row.locator("td.status")).to_have_text("cancelled")
            # Pause a type: shown paused, with a resume button.
            types = page.locator("#types tbody tr", has_text="export")
            await types.locator("button[data-action=pause]").click()
            await expect(result).to_have_text("type export paused")
            await expect(types.locator("td.state")).to_have_text("paused")
            await expect(types.locator("button")).to_have_text("resume")

            # A page of another origin (localhost is not 127.0.0.1) posts a form at the
            # dashboard: refused, and nothing changes.
            evil = server.url.replace("127.0.0.1", "localhost") + "evil"
            form = (f'<form method="post" enctype="text/plain" action="{server.url}api/act/'
                    'resume"><input name=\'{"task_type":"export","x":"\' value=\'"}\'></form>'
                    "<script>document.forms[0].submit()</script>")
            await page.route(evil, lambda route: route.fulfill(body=form,
                                                                content_type="text/html"))
            async with page.expect_response(lambda r: "/api/act/" in r.url) as forged:
                await page.goto(evil)
            assert (await forged.value).status == 403
        stats = httpx.get(f"{server.url}api/stats").json()
        assert stats["paused"] == [{"task_type": "export", "shards": ["shard-0"],
                                    "everywhere": True}]
        # The same without a browser: a foreign Origin, or the right one without the token.
        origin = server.url.rstrip("/")
        assert post(server, "resume", {"task_type": "export"},
                    origin="http://evil.example").status_code == 403
        refused = post(server, "resume", {"task_type": "export"}, origin=origin)
        assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["error"]
        # With a session and its token: an id no shard holds is a 404 naming it.
        with httpx.Client(base_url=server.url) as c:
            csrf = c.get("api/session").json()["csrf"]
            r = c.post("api/act/cancel", json={"task_id": "nope"},
                       headers={"origin": origin, "x-csrf-token": csrf})
            assert r.status_code == 404 and r.json()["error"] == "no shard holds task 'nope'"
        assert server.stop() == 0


def test_the_page_in_chromium_retries_cancels_and_pauses_and_refuses_a_forged_post(
    tmp_path: Path,
) -> None:
    anyio.run(_actions_in_chromium, tmp_path, backend="asyncio")


async def _sweeps_in_chromium(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)  # dead-1: an export dead letter, of now
    old = format_rfc3339(wall_us() - 10 * 86_400 * SECOND)
    append(q, task("old-1", 5, taskType="export", retryCount=3, deletedAt=old,
                   snerdOutcome="dead_letter", LastErrorObj="timeout"))
    append(q, task("gone-1", 6, deletedAt=old, snerdOutcome="cancelled"))
    with live_daemon(q), Server(q) as server:
        async with browser_page() as page:
            await page.goto(server.url)
            await page.wait_for_selector('body[data-source="ws"]')
            result = page.locator("#action-result")
            dead = page.locator("#dead tbody tr")
            await expect(dead).to_have_count(2)
            await expect(page.locator("#dead-types tbody tr")).to_have_text(
                ["export2retry all"])
            asked: list[str] = []
            answered = anyio.Event()

            async def dismiss(dialog: Any) -> None:
                asked.append(dialog.message)
                await dialog.dismiss()
                answered.set()

            async def accept(dialog: Any) -> None:
                asked.append(dialog.message)
                await dialog.accept()

            # Not confirmed: nothing is sent.
            page.once("dialog", dismiss)
            await page.locator("#purge-button").click()
            with anyio.fail_after(10):
                await answered.wait()
            assert "of every type older than 7 days" in asked[0]
            assert await result.text_content() == "" and list(q.glob("shard-0/inbox/*")) == []
            # Confirmed, by default older than 7 days: the old dead letter and the old
            # cancelled task go, the recent dead letter stays.
            page.once("dialog", accept)
            await page.locator("#purge-button").click()
            await expect(result).to_have_text("purged 2 task(s)")
            await expect(dead).to_have_count(1)
            await expect(dead.first.locator("td").first).to_have_text("dead-1")
            # "retry all" of the type: its daemon puts the rest back.
            await page.locator("#dead-types button[data-action=retry_dead]").click()
            await expect(result).to_have_text("put back 1 dead letter(s) of type export")
            await expect(page.locator("#dead tbody td.empty")).to_have_text("no dead letters")
        assert len(asked) == 2
        report = httpx.get(f"{server.url}api/task/old-1").json()
        assert report["state"] == "purged"
        assert server.stop() == 0


def test_the_page_in_chromium_purges_with_a_confirm_and_retries_a_type(tmp_path: Path) -> None:
    anyio.run(_sweeps_in_chromium, tmp_path, backend="asyncio")


async def _read_only_in_chromium(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    with Server(q, "--read-only") as server:
        async with browser_page() as page:
            await page.goto(server.url)
            await page.wait_for_selector('body[data-source="ws"]')
            await expect(page.locator("body")).to_have_attribute("data-read-only", "true")
            await expect(page.locator("#dead tbody tr")).to_have_count(1)
            assert await page.locator("button").count() == 0
            # Even the page's own script, with its session's token, is refused.
            status = await page.evaluate("""async () => {
                const s = await (await fetch("/api/session")).json();
                const r = await fetch("/api/act/retry", {method: "POST", body: '{"task_id":"dead-1"}',
                    headers: {"content-type": "application/json", "x-csrf-token": s.csrf}});
                return [r.status, (await r.json()).error];
            }""")
            assert status == [403, "this dashboard is read-only (started with --read-only)"]
            assert await page.locator("#dead-tools").count() == 0
            status = await page.evaluate("""async () => {
                const s = await (await fetch("/api/session")).json();
                const r = await fetch("/api/act/purge", {method: "POST", body: '{"task_type":null}',
                    headers: {"content-type": "application/json", "x-csrf-token": s.csrf}});
                return r.status;
            }""")
            assert status == 403
        assert list(q.glob("shard-*/inbox/*")) == []
        assert server.stop() == 0


def test_a_read_only_dashboard_shows_no_button_and_refuses_every_write(tmp_path: Path) -> None:
    anyio.run(_read_only_in_chromium, tmp_path, backend="asyncio")


def test_a_write_names_what_is_wrong_with_it(client: tuple[TestClient, Path]) -> None:
    c, q = client
    csrf = c.get("/api/session").json()["csrf"]  # (the TestClient keeps the session cookie)
    ok = {"origin": "http://testserver", "x-csrf-token": csrf}

    def act(action: str, body: bytes, **headers: str) -> tuple[int, str]:
        r = c.post(f"/api/act/{action}", content=body,
                   headers={"content-type": "application/json", **ok, **headers})
        return r.status_code, r.json().get("error", "")

    assert act("explode", b"{}")[0] == 404
    assert act("purge", b"{}") == (400, "a purge must name task_type (null: every type)")
    assert act("retry_dead", b'{"task_type": ""}')[0] == 400
    assert act("purge", b'{"task_type": null, "before": "2026-13-01"}')[0] == 400
    assert act("purge", b'{"task_type": null, "older_than_s": -1}')[0] == 400
    assert act("purge", b'{"task_type": null, "older_than_s": 1, "before": "2026-01-01"}') == (
        400, "give before or older_than_s, not both")
    assert act("cancel", b'{"task_id": 7}') == (
        400, "task_id must be a non-empty string of at most 1024 characters")
    assert act("cancel", b'{"task_id": "a\\u0000b"}')[0] == 400
    assert act("retry", b'{"task_id": "a", "shard": true}')[0] == 400
    assert act("retry", b'{"task_id": "a", "shard": 9}') == (409, f"shard-9 is not a shard of {q}")
    assert act("pause", b"[1]") == (400, "the body must be a JSON object")
    assert act("pause", b"{") == (400, "the body is not JSON")
    assert act("pause", b"{}", **{"content-type": "text/plain"})[0] == 415
    assert act("pause", b" " * 5000)[0] == 413
    assert act("pause", b"{}", **{"x-csrf-token": "0" * 64})[0] == 403
    assert act("pause", b"{}", origin="http://testserver.evil.example")[0] == 403
    # The Referer stands in for a missing Origin.
    r = c.post("/api/act/pause", content=b'{"task_type": "email"}',
               headers={"content-type": "application/json", "x-csrf-token": csrf,
                        "referer": "http://testserver/"})
    assert r.status_code == 200, r.text
    # No daemon runs: the pause is durable in the inbox, and pending.
    assert r.json()["pending"] == ["shard-0"] and r.json()["unowned_shards"] == ["shard-0"]
    assert len(list(q.glob("shard-0/inbox/tool-*.log"))) == 1
    # So is a purge: the dashboard never writes the log of a shard no daemon holds.
    size = log(q).stat().st_size
    r = c.post("/api/act/purge", json={"task_type": None, "older_than_s": 0},
               headers={"content-type": "application/json", **ok})
    assert r.status_code == 200, r.text
    assert (r.json()["action"], r.json()["count"], r.json()["pending"]) == (
        "purged", 0, ["shard-0"])
    assert log(q).stat().st_size == size
    assert len(list(q.glob("shard-0/inbox/tool-*.log"))) == 2
    # Without a daemon no owner can say an id is unknown: pending, a 200 (with a daemon, a
    # 404: `_actions_in_chromium`).
    assert act("cancel", b'{"task_id": "nope"}')[0] == 200


def test_a_read_only_app_refuses_every_write(tmp_path: Path) -> None:
    q = hand_made_queue(tmp_path)
    app = create_app(view_of(q), allowed_hosts=["testserver"], read_only=True)
    with TestClient(app) as c:
        session = c.get("/api/session").json()
        assert session["read_only"] is True
        for action in ("cancel", "retry", "pause", "resume", "purge", "retry_dead"):
            r = c.post(f"/api/act/{action}", json={"task_id": "dead-1", "task_type": None},
                       headers={"origin": "http://testserver", "x-csrf-token": session["csrf"]})
            assert r.status_code == 403 and "read-only" in r.json()["error"]
    assert not (q / "shard-0" / "inbox").exists()
