"""The dashboard's web app (Starlette): one page, a JSON API and a WebSocket that pushes.

    GET /                    the page (static/index.html, app.js, style.css)
    GET /task/{id}           a task's page (static/task.html, task.js; common.js, shared): its details and story
    GET /api/snapshot        everything the page shows: stats, daemons, tasks, dead letters
    GET /api/stats           `snerdmq stats --json`'s report
    GET /api/tasks           ?status=<one of STATUSES>&limit=<1..1000, default 100>
    GET /api/dead-letters    ?limit=<1..1000, default 100>, with their final errors
    GET /api/daemons         heartbeats and the shards each daemon's claims name
    GET /api/membership      membership.json as read
    GET /api/task/{id}       a task's details and story (`snerdmq status --json`'s report);
                             404 (with the report) when no file holds it, 400 for an id no
                             enqueue takes
    GET /api/progress        the latest progress messages (only when served by an SDK, which
                             sees them: `SnerdQueue.start_dashboard`; else 404)
    WS  /ws                  a snapshot at once, then one whenever the files change (at most
                             one a `refresh_s`) and at least every `push_every_s`
    GET /api/session, POST /api/act/{cancel,retry,pause,resume,purge,retry_dead}
                             the writes and their guards (`snerd.dashboard.actions`: an
                             Origin check and a per-session CSRF token; none when read-only)

Upstream's dashboards listened on every interface, with no authentication, `Access-Control-
Allow-Origin: *` and WebSockets that accepted any origin. Here:

- `Host` must be one of `allowed_hosts` when given (the server passes the loopback names when
  it listens on loopback): a DNS-rebinding page cannot reach a local dashboard. The header is
  parsed as RFC 3986 writes a host (`host_of`): a name or IPv4 address, or an IPv6 address in
  brackets (`[::1]:8642`), each with an optional port; anything else is a 400.
- With a `token`, every request must carry it, as `Authorization: Bearer <token>` or as the
  HttpOnly, SameSite=Strict cookie that `/?token=<token>` sets (then redirects to `/`, so the
  token leaves the address bar). The server refuses a non-loopback address without a token.
- A WebSocket whose `Origin` is not this server's own address is refused (cross-site
  WebSocket hijacking); no CORS headers are sent at all.
- Every response forbids framing, sniffing and referrers, and the page's Content-Security-
  Policy allows only its own script, style and connections; the page renders every value as
  text, never as HTML.
- No request can fail the app: a bad query value is a 400 naming the parameter, a bad `Host`
  a 400 naming the header, a malformed `Origin` a refused WebSocket, an unknown path a 404.

Reads go through one lock: a refresh (at most one a `refresh_s`) and the view's queries run in a
worker thread, one at a time.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from snerd.commands import DEFAULT_WAIT_S
from snerd.core.timefmt import format_rfc3339
from snerd.dashboard.actions import Actions
from snerd.dashboard.view import STATUSES, QueueView
from snerd.queuedir import QueueError, UsageError

__all__ = ["COOKIE", "ProgressFeed", "create_app", "host_of"]

#: The cookie `/?token=` sets.
COOKIE = "snerd_dashboard_token"
#: How many rows `/api/tasks` and `/api/dead-letters` give at most.
MAX_LIMIT = 1000

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]

_T = TypeVar("_T")

#: A `Host` header (RFC 9110 §7.2: uri-host [ ":" port ]): a bracketed IP literal or a name
#: without a colon, then an optional port of digits. RFC 3986 §3.2.2 allows more characters in
#: a reg-name than a DNS name has; a dashboard is reached by a DNS name or an address.
_HOST_HEADER = re.compile(
    r"(?:\[(?P<literal>[^\[\]]+)\]|(?P<name>[A-Za-z0-9._~-]+))(?::(?P<port>[0-9]{1,5}))?"
)


class ProgressFeed:
    """The latest `keep` progress messages (`add` is an SDK's `on_progress` observer). Used on
    the event loop thread only."""

    def __init__(self, clock: Callable[[], int], keep: int = 50) -> None:
        self.clock = clock
        self.events: deque[dict[str, Any]] = deque(maxlen=keep)
        #: Bumped by each `add`.
        self.version = 0

    def add(self, task_id: Any, data: Any) -> None:
        self.events.append({"task_id": task_id, "data": data, "at": format_rfc3339(self.clock())})
        self.version += 1

    def lines(self) -> list[dict[str, Any]]:
        """Oldest first."""
        return list(self.events)


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _error(text: str, status: int = 400) -> Response:
    return _json({"error": text}, status)


def host_of(header: str) -> str | None:
    """The host a `Host` header names, in one spelling per host: a name in lower case, an IP
    address as `ipaddress` writes it (`[::1]:8642` and `[0:0::1]` are both `::1`). None when
    the header is not a host with an optional port (a bare IPv6 address, a bracketed text that
    is not one, a port beyond 65535, blanks)."""
    match = _HOST_HEADER.fullmatch(header)
    if match is None or int(match["port"] or 0) > 65535:
        return None
    literal = match["literal"]
    if literal is not None:
        try:
            return str(ipaddress.IPv6Address(literal))
        except ValueError:
            return None
    return _host_name(match["name"])


def _host_name(name: str) -> str:
    """`name` as `host_of` spells it (an allowed name, given with or without brackets)."""
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare.lower()


class _HostCheck:
    """Only requests whose `Host` names one of `allowed` pass (DNS rebinding); a bad one is a
    400 naming the header (a WebSocket is closed with 1008)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(_host_name(name) for name in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope["headers"] if k == b"host"]
        header = values[0].decode("latin-1") if len(values) == 1 else None
        host = None if header is None else host_of(header)
        if host in self.allowed:
            await self.app(scope, receive, send)
            return
        if header is None:
            why = "the request needs exactly one Host header"
        elif host is None:
            why = f"the Host header {header[:100]!r} is not a host[:port]"
        else:
            why = f"the Host header {header[:100]!r} is not a name this dashboard answers to"
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})
            return
        if scope["path"].startswith("/api/"):
            response = _error(why)
        else:
            response = Response(why + "\n", status_code=400, media_type="text/plain")
        await response(scope, receive, send)


def _same_origin(origin: str, host: str) -> bool:
    """Whether a WebSocket's `Origin` is this server's own address (`host`, as the browser
    wrote it in the `Host` header). A malformed origin is not."""
    try:
        return urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:  # urlsplit refuses "http://[::1"
        return False


class _SecurityHeaders:
    """Adds `_SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + _SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _TokenAuth:
    """Every HTTP request and WebSocket must carry the token (Bearer header or cookie);
    `GET /?token=<token>` sets the cookie and redirects to `/`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _matches(self, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(value.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        auth = conn.headers.get("authorization", "")
        given = [auth[7:].strip()] if auth[:7].lower() == "bearer " else []
        given.append(conn.cookies.get(COOKIE, ""))
        if any(self._matches(g) for g in given):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "token required"})
            return
        # The path as the server decoded it (`conn.url` would decode the raw query as UTF-8).
        path = scope["path"]
        if path == "/" and self._matches(conn.query_params.get("token")):
            response = Response(status_code=303, headers={"location": "/"})
            response.set_cookie(COOKIE, self.token.decode(), httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        if path.startswith("/api/"):
            response = _error(
                "this dashboard needs its token: send `Authorization: Bearer "
                "<token>` (the token is SNERD_DASHBOARD_TOKEN)",
                401,
            )
        else:
            response = Response(
                "This dashboard needs its token: open /?token=<token> once (the token is "
                "the dashboard's SNERD_DASHBOARD_TOKEN or --token).\n",
                status_code=401,
                media_type="text/plain",
            )
        await response(scope, receive, send)


class _Reader:
    """Runs the view's refresh and queries in a worker thread, one at a time, refreshing at
    most once a `refresh_s`; a snapshot is built at most once a refresh, however many pages
    ask for it."""

    def __init__(self, view: QueueView, refresh_s: float, monotonic: Callable[[], float]):
        self.view = view
        self.refresh_s = refresh_s
        self.monotonic = monotonic
        self.lock = anyio.Lock()
        self.refreshed = -math.inf
        self._snapshot: dict[str, Any] | None = None

    async def read(self, query: Callable[[QueueView], _T]) -> _T:
        async with self.lock:
            fresh = self.monotonic() - self.refreshed < self.refresh_s

            def run() -> _T:
                if not fresh:
                    self.view.refresh()
                    self._snapshot = None
                return query(self.view)

            result = await anyio.to_thread.run_sync(run)
            if not fresh:
                self.refreshed = self.monotonic()
            return result

    def snapshot(self, view: QueueView) -> dict[str, Any]:
        """`view.snapshot()`, built once a refresh (a query for `read`; the caller must not
        change it)."""
        if self._snapshot is None:
            self._snapshot = view.snapshot()
        return self._snapshot


def _limit(request: Request) -> int | Response:
    raw = request.query_params.get("limit")
    if raw is None:
        return 100
    try:
        value = int(raw)
    except ValueError:
        return _error(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {raw!r}")
    if not 1 <= value <= MAX_LIMIT:
        return _error(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {raw!r}")
    return value


def _static(name: str) -> bytes:
    return resources.files("snerd.dashboard").joinpath("static", name).read_bytes()


def create_app(
    view: QueueView,
    *,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh_s: float = 1.0,
    push_every_s: float = 5.0,
    monotonic: Callable[[], float] = time.monotonic,
    progress: ProgressFeed | None = None,
    read_only: bool = False,
    command_wait_s: float = DEFAULT_WAIT_S,
) -> Starlette:
    """The dashboard of `view`'s queue. `allowed_hosts`: the `Host` names accepted (None:
    any); `token`: required on every request when set; `progress`: the progress messages to
    show (snapshots then carry `progress`); `read_only`: every write refused;
    `command_wait_s`: how long a write waits for the owners' answers."""
    reader = _Reader(view, refresh_s, monotonic)
    actions = Actions(view.directory, read_only=read_only, wait_s=command_wait_s)

    def with_progress(snap: dict[str, Any]) -> dict[str, Any]:
        return snap if progress is None else {**snap, "progress": progress.lines()}

    pages = {
        "/": (_static("index.html"), "text/html; charset=utf-8"),
        "/app.js": (_static("app.js"), "text/javascript; charset=utf-8"),
        "/style.css": (_static("style.css"), "text/css; charset=utf-8"),
        "/task.js": (_static("task.js"), "text/javascript; charset=utf-8"),
        "/common.js": (_static("common.js"), "text/javascript; charset=utf-8"),
    }
    task_page = _static("task.html")

    async def page(request: Request) -> Response:
        body, media_type = pages[request.scope["path"]]
        return actions.with_session(request, Response(body, media_type=media_type))

    async def task_html(request: Request) -> Response:
        # The page reads its id from its own address and asks `/api/task/{id}`.
        return Response(task_page, media_type="text/html; charset=utf-8")

    async def task(request: Request) -> Response:
        task_id = request.path_params["task_id"]

        def query(v: QueueView) -> tuple[int, dict[str, Any]]:
            try:
                report = v.task(task_id)
            except UsageError as exc:
                return 400, {"error": f"not a task id: {exc}"}
            except QueueError as exc:
                return 503, {"error": str(exc)}
            if not report["found"]:
                return 404, {"error": f"no task {task_id[:200]!r} in this queue", **report}
            return 200, report

        status, body = await reader.read(query)
        return _json(body, status)

    async def snapshot(request: Request) -> Response:
        return _json(with_progress(await reader.read(reader.snapshot)))

    async def progress_lines(request: Request) -> Response:
        if progress is None:
            return _error("no progress here: only a dashboard an SDK serves sees it", 404)
        return _json(progress.lines())

    async def stats(request: Request) -> Response:
        return _json(await reader.read(lambda v: v.stats()))

    async def daemons(request: Request) -> Response:
        return _json(await reader.read(lambda v: v.daemons()))

    async def membership(request: Request) -> Response:
        return _json(await reader.read(lambda v: v.membership()))

    async def tasks(request: Request) -> Response:
        limit = _limit(request)
        if isinstance(limit, Response):
            return limit
        status = request.query_params.get("status") or None
        if status is not None and status not in STATUSES:
            return _error(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        return _json(await reader.read(lambda v: v.tasks(status, limit)))

    async def dead_letters(request: Request) -> Response:
        limit = _limit(request)
        if isinstance(limit, Response):
            return limit
        return _json(await reader.read(lambda v: v.dead_letters(limit)))

    async def live(websocket: WebSocket) -> None:
        origin = websocket.headers.get("origin")
        host = websocket.headers.get("host", "")
        if origin is not None and not _same_origin(origin, host):
            await websocket.close(code=1008, reason="cross-origin WebSocket refused")
            return
        await websocket.accept()

        async def push() -> None:
            sent_version: int | None = None
            sent_progress = -1
            sent_at = -math.inf
            while True:
                moved = progress is not None and progress.version != sent_progress

                def changed(
                    v: QueueView,
                    version: int | None = sent_version,
                    at: float = sent_at,
                    moved: bool = moved,
                ) -> dict[str, Any] | None:
                    due = moved or monotonic() - at >= push_every_s
                    return reader.snapshot(v) if v.version != version or due else None

                snap = await reader.read(changed)
                if snap is not None:
                    if progress is not None:
                        sent_progress = progress.version
                    try:
                        await websocket.send_text(orjson.dumps(with_progress(snap)).decode())
                    except (WebSocketDisconnect, OSError, RuntimeError):
                        return  # the peer went away meanwhile; the loop below sees it
                    sent_version, sent_at = snap["version"], monotonic()
                await anyio.sleep(refresh_s)

        async with anyio.create_task_group() as tg:
            tg.start_soon(push)
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass  # the page sends nothing; anything it does send is ignored
            tg.cancel_scope.cancel()

    routes = [Route(path, page) for path in pages] + [
        Route("/api/snapshot", snapshot),
        Route("/api/stats", stats),
        Route("/api/tasks", tasks),
        Route("/api/dead-letters", dead_letters),
        Route("/api/daemons", daemons),
        Route("/api/membership", membership),
        Route("/task/{task_id:path}", task_html),
        Route("/api/task/{task_id:path}", task),
        Route("/api/progress", progress_lines),
        Route("/api/session", actions.session),
        Route("/api/act/{action}", actions.act, methods=["POST"]),
        WebSocketRoute("/ws", live),
    ]
    middleware = [Middleware(_SecurityHeaders)]
    if allowed_hosts is not None:
        middleware.append(Middleware(_HostCheck, allowed=list(allowed_hosts)))
    if token is not None:
        middleware.append(Middleware(_TokenAuth, token=token))
    return Starlette(routes=routes, middleware=middleware)
