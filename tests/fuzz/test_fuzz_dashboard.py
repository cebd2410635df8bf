"""Fuzzing the dashboard's web face (`snerd.dashboard.app`): no path, query, header or
WebSocket handshake can fail the app. Requests go to the ASGI app itself, as raw scopes, so
they may hold what an HTTP client would refuse to send (bytes that are not UTF-8, NUL, a second
`Host`), for the app as it runs on loopback (a `Host` allow-list) and as it runs elsewhere (a
token). Every request must end in a response below 500 (a WebSocket: accepted or closed), and
`host_of` must spell every host one way. Example counts come from the hypothesis profile
(tests/conftest.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.types import Message

from snerd.dashboard.app import create_app, host_of
from snerd.dashboard.view import QueueView
from tests.dashboard.test_dashboard import hand_made_queue, wall_us

PATHS = [
    *("/", "/app.js", "/style.css", "/ws", "/api/", "/api/snapshot", "/api/stats"),
    *("/api/tasks", "/api/dead-letters", "/api/daemons", "/api/membership", "/api/progress"),
]
PARAMS = ["limit", "status", "token", "x"]
HEADERS = [b"host", b"origin", b"authorization", b"cookie", b"connection", b"content-length"]


def _bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=40),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.sampled_from(
            [
                *(b"localhost", b"127.0.0.1:8642", b"[::1]:8642", b"[::1", b"::1"),
                *(b"localhost:99999", b"http://[::1", b"http://localhost", b"Bearer s3cret"),
                *(b"%ff", b"\xff"),
            ]
        ),
    )


def _query() -> st.SearchStrategy[bytes]:
    pair = st.tuples(st.sampled_from(PARAMS).map(str.encode), _bytes()).map(
        lambda kv: kv[0] + b"=" + kv[1]
    )
    return st.one_of(st.lists(pair, max_size=4).map(b"&".join), st.binary(max_size=60))


REQUESTS = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["http", "websocket"]),
        "path": st.one_of(
            st.sampled_from(PATHS).map(str.encode),
            st.binary(max_size=30).map(lambda b: b"/" + b),
            st.sampled_from(PATHS).map(lambda p: p.encode() + b"/%00"),
        ),
        "query": _query(),
        "headers": st.lists(st.tuples(st.sampled_from(HEADERS), _bytes()), max_size=5),
    }
)


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Starlette]]:
    q = hand_made_queue(tmp_path_factory.mktemp("fuzz-dashboard"))
    # A clock that never moves: the queue is read once, then every request is the app's work.
    view = QueueView(q, skew_us=5_000_000, clock=wall_us)
    yield [
        create_app(view, allowed_hosts=["127.0.0.1", "localhost", "::1"], monotonic=lambda: 0.0),
        create_app(view, token="s3cret", monotonic=lambda: 0.0),
    ]


async def _call(app: Starlette, request: dict[str, Any]) -> list[Message]:
    kind = request["type"]
    raw_path: bytes = request["path"]
    scope = {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http" if kind == "http" else "ws",
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "query_string": request["query"],
        "root_path": "",
        "headers": list(request["headers"]),
        "server": ("127.0.0.1", 8642),
        "client": ("127.0.0.1", 40000),
    }
    sent: list[Message] = []
    incoming: list[Message] = [{"type": "websocket.connect"}] if kind == "websocket" else []

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        if kind == "websocket":
            return {"type": "websocket.disconnect", "code": 1000}
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    with trio.fail_after(10):
        await app(scope, receive, send)
    return sent


@given(request=REQUESTS)
def test_no_request_fails_the_app(apps: list[Starlette], request: dict[str, Any]) -> None:
    for app in apps:
        sent = trio.run(_call, app, request)
        kinds = [m["type"] for m in sent]
        if request["type"] == "http":
            (start,) = [m for m in sent if m["type"] == "http.response.start"]
            assert start["status"] < 500, (request, start)
        else:  # accepted, closed, or denied with an HTTP response (ASGI's denial response)
            assert kinds, request
            if kinds[0] == "websocket.http.response.start":
                assert sent[0]["status"] < 500, (request, sent)
            else:
                assert kinds[0] in ("websocket.accept", "websocket.close"), (request, sent)


@given(
    name=st.from_regex(r"[A-Za-z0-9._~-]{1,30}", fullmatch=True),
    port=st.none() | st.integers(0, 65535),
)
def test_a_name_with_any_port_is_that_name_in_lower_case(name: str, port: int | None) -> None:
    header = name if port is None else f"{name}:{port}"
    try:
        expected = str(ipaddress.ip_address(name))
    except ValueError:
        expected = name.lower()
    assert host_of(header) == expected


@given(address=st.ip_addresses(v=6), port=st.none() | st.integers(0, 65535), upper=st.booleans())
def test_a_bracketed_ipv6_address_is_that_address(
    address: ipaddress.IPv6Address, port: int | None, upper: bool
) -> None:
    written = address.exploded.upper() if upper else str(address)
    header = f"[{written}]" if port is None else f"[{written}]:{port}"
    assert host_of(header) == str(address)
    assert host_of(written if ":" in written else f"{written}:1:2") is None  # unbracketed


@given(header=st.text(max_size=60))
def test_host_of_never_raises(header: str) -> None:
    host = host_of(header)
    assert host is None or host == host_of(host if ":" not in host else f"[{host}]")


# -- the writes (`snerd.dashboard.actions`): any body, to any action, with or without the
# guards' headers, is answered below 500. With no daemon on the queue a well-formed command
# is written and answered pending at once.

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=6,
)
BODIES = st.one_of(
    st.binary(max_size=60),
    st.fixed_dictionaries({}, optional={"task_id": JSON_VALUES, "task_type": JSON_VALUES,
                                        "x": JSON_VALUES}).map(orjson.dumps),
    JSON_VALUES.map(orjson.dumps),
)
WRITES = st.fixed_dictionaries(
    {
        "action": st.one_of(st.sampled_from(["cancel", "retry", "pause", "resume"]),
                            st.text(max_size=12)),
        "body": BODIES,
        "csrf": st.booleans(),
        "origin": st.sampled_from([b"http://127.0.0.1:8642", b"http://evil.example", b"null",
                                   b"http://[::1", b""]),
        "content_type": st.sampled_from([b"application/json", b"text/plain", b""]),
    }
)


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Starlette, bytes, bytes]:
    """An app that takes writes, a session cookie of it and that session's CSRF token."""
    q = hand_made_queue(tmp_path_factory.mktemp("fuzz-writes"))
    app = create_app(QueueView(q, skew_us=5_000_000, clock=wall_us),
                     allowed_hosts=["127.0.0.1"], command_wait_s=0.0, monotonic=lambda: 0.0)
    request = {"type": "http", "path": b"/api/session", "query": b"",
               "headers": [(b"host", b"127.0.0.1:8642")]}
    sent = trio.run(_call, app, request)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    cookie = next(v for k, v in start["headers"] if k == b"set-cookie").split(b";")[0]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return app, cookie, orjson.loads(body)["csrf"].encode()


async def _post(app: Starlette, path: bytes, headers: list[tuple[bytes, bytes]],
                body: bytes) -> list[Message]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path.decode("latin-1"), "raw_path": path, "query_string": b"",
        "root_path": "", "headers": headers, "server": ("127.0.0.1", 8642),
        "client": ("127.0.0.1", 40000),
    }
    sent: list[Message] = []
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    with trio.fail_after(10):
        await app(scope, receive, send)
    return sent


@given(write=WRITES)
def test_no_write_fails_the_app(
    writer: tuple[Starlette, bytes, bytes], write: dict[str, Any]
) -> None:
    app, cookie, csrf = writer
    headers = [(b"host", b"127.0.0.1:8642"), (b"cookie", cookie)]
    headers += [(b"origin", write["origin"])] if write["origin"] else []
    headers += [(b"content-type", write["content_type"])] if write["content_type"] else []
    headers += [(b"x-csrf-token", csrf)] if write["csrf"] else []
    path = b"/api/act/" + write["action"].encode("utf-8", "surrogatepass")
    sent = trio.run(_post, app, path, headers, write["body"])
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    assert start["status"] < 500, (write, sent)
    guarded = (write["csrf"] and write["origin"] == b"http://127.0.0.1:8642")
    if start["status"] < 300:
        assert guarded and write["content_type"] == b"application/json", write
