"""The dashboard's writes: retry, cancel, pause and resume, the sweeps (purge, retry of a
type's dead letters), and what guards them.

    GET  /api/session          {"csrf": TOKEN, "read_only": bool}; sets the session cookie
    POST /api/act/cancel       {"task_id": ID}
    POST /api/act/retry        {"task_id": ID[, "shard": N]}   (N: the dead letter's shard)
    POST /api/act/pause        {"task_type": TYPE | null}   (null: the whole queue)
    POST /api/act/resume       {"task_type": TYPE | null}
    POST /api/act/purge        {"task_type": TYPE | null[, "before": DATE | "older_than_s": S]}
    POST /api/act/retry_dead   {"task_type": TYPE | null[, "before": DATE | "older_than_s": S]}

Each write is the same routed command `snerdmq cancel` (etc.) sends (`snerd.commands`): a
`command` record in the shards' inboxes, decided by each shard's owner. The dashboard never
writes a shard log: a sweep of a shard no daemon holds is pending there (applied when a daemon
takes it; `snerdmq purge` purges such a shard itself). The answer is the command's
(`TaskAnswer.json`, `PauseAnswer.json`, `SweepAnswer.json`). A sweep must name its
`task_type` (null, the whole queue, only when written so); its cutoff is RFC 3339 or a day
(`before`), or an age in seconds on the server's clock (`older_than_s`); neither: whenever.

A write is refused unless every guard passes, in this order (the access token, when there is
one, was checked before, by `snerd.dashboard.app`):

- the dashboard is not read-only (`--read-only`: 403 for every write, and the page shows no
  button);
- its `Origin` header (or, without one, its `Referer`) is this dashboard's own address, the
  `Host` the browser sent: a page on another site cannot post here (403);
- its body is `application/json` (a cross-site HTML form cannot send that without a CORS
  preflight, which this server never answers), at most `_BODY_LIMIT` bytes (413);
- it carries the session's CSRF token in `X-CSRF-Token`: HMAC-SHA256, under a key drawn when
  the app starts, of the session cookie (`snerd_dashboard_session`, random, HttpOnly,
  SameSite=Strict). Only a same-origin script can read it (`/api/session`; no CORS headers are
  ever sent), so a forged request has the cookie at most, never the token (403).

Bad input is a 4xx JSON `{"error": ...}` naming what is wrong, never a 500: an unknown action
404, a body that is not a JSON object or a malformed id, type or cutoff 400, an id no shard holds 404,
a queue that cannot be written 409.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import orjson
from starlette.requests import Request
from starlette.responses import Response

from snerd import commands
from snerd.config import ConfigError, load_tool_settings
from snerd.core.control import FOUND_UNKNOWN
from snerd.core.timefmt import parse_rfc3339
from snerd.queuedir import QueueError, UsageError, wall_now_us

__all__ = ["ACTIONS", "SESSION_COOKIE", "Actions"]

SESSION_COOKIE = "snerd_dashboard_session"
ACTIONS = ("cancel", "retry", "pause", "resume", "purge", "retry_dead")
_BODY_LIMIT = 4096
#: A day given as a sweep's cutoff (`YYYY-MM-DD`): its midnight, UTC.
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
#: Longest task id or type accepted (a task id is at most what a log line holds; a button's
#: id is one the page showed).
_MAX_NAME = 1024


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _error(text: str, status: int) -> Response:
    return _json({"error": text}, status)


def _name(value: Any, what: str, *, optional: bool) -> str | Response | None:
    """A task id or type from the body: a non-empty string of printable characters."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME:
        return _error(f"{what} must be a non-empty string of at most {_MAX_NAME} characters",
                      400)
    if not value.isprintable():
        return _error(f"{what} must not hold control characters", 400)
    return value


class Actions:
    """The write endpoints of one dashboard (the module docstring)."""

    def __init__(self, directory: Path, *, read_only: bool, wait_s: float) -> None:
        self.directory = directory
        self.read_only = read_only
        self.wait_s = wait_s
        self._key = secrets.token_bytes(32)

    def csrf_of(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def with_session(self, request: Request, response: Response) -> Response:
        """`response`, setting a session cookie when the request had none."""
        if not request.cookies.get(SESSION_COOKIE):
            response.set_cookie(SESSION_COOKIE, secrets.token_urlsafe(32), httponly=True,
                                samesite="strict")
        return response

    async def session(self, request: Request) -> Response:
        """The CSRF token of the caller's session (a new session when it has none)."""
        session = request.cookies.get(SESSION_COOKIE)
        if not session:
            session = secrets.token_urlsafe(32)
            response = _json({"csrf": self.csrf_of(session), "read_only": self.read_only})
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
            return response
        return _json({"csrf": self.csrf_of(session), "read_only": self.read_only})

    async def act(self, request: Request) -> Response:
        action = request.path_params.get("action", "")
        if action not in ACTIONS:
            return _error(f"unknown action {action[:100]!r}; one of {', '.join(ACTIONS)}", 404)
        refused = self._refusal(request)
        if refused is not None:
            return refused
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        send = self._command(action, body)
        if isinstance(send, Response):
            return send
        try:
            answer = await anyio.to_thread.run_sync(send)
        except (QueueError, UsageError) as exc:
            return _error(str(exc), 409)
        if isinstance(answer, commands.TaskAnswer) and not answer.done and not answer.pending \
                and answer.found == FOUND_UNKNOWN:
            return _json({**answer.json(), "error": f"no shard holds task {answer.task_id!r}"},
                         404)
        return _json(answer.json())

    def _refusal(self, request: Request) -> Response | None:
        """Why this write is refused (read-only, another origin, no CSRF token), or None."""
        if self.read_only:
            return _error("this dashboard is read-only (started with --read-only)", 403)
        host = request.headers.get("host", "")
        origin = request.headers.get("origin") or request.headers.get("referer")
        if origin is None or not _same_origin(origin, host):
            return _error("refused: this write does not come from the dashboard's own page "
                          "(its Origin is another site's, or missing)", 403)
        session = request.cookies.get(SESSION_COOKIE, "")
        given = request.headers.get("x-csrf-token", "")
        if not session or not hmac.compare_digest(given.encode(), self.csrf_of(session).encode()):
            return _error("refused: the X-CSRF-Token header is missing or not this session's "
                          "(GET /api/session gives it)", 403)
        return None

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return _error("the body must be application/json", 415)
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > _BODY_LIMIT:
                return _error(f"the body must be at most {_BODY_LIMIT} bytes", 413)
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return _error("the body is not JSON", 400)
        if not isinstance(body, dict):
            return _error("the body must be a JSON object", 400)
        return body

    def _command(self, action: str, body: dict[str, Any]) -> Callable[[], Any] | Response:
        """The command `body` asks for, ready to run in a worker thread."""
        root, wait = str(self.directory), self.wait_s
        if action in ("cancel", "retry"):
            task_id = _name(body.get("task_id"), "task_id", optional=False)
            if isinstance(task_id, Response):
                return task_id
            assert task_id is not None
            if action == "cancel":
                return lambda: commands.cancel(root, task_id, wait)
            shard = body.get("shard")
            if shard is not None and (not isinstance(shard, int) or isinstance(shard, bool)
                                      or shard < 0):
                return _error("shard must be a shard number (0 or more)", 400)
            return lambda: commands.retry(root, task_id, wait, shard=shard)
        if action in ("purge", "retry_dead") and "task_type" not in body:
            return _error(f"a {action} must name task_type (null: every type)", 400)
        task_type = _name(body.get("task_type"), "task_type", optional=True)
        if isinstance(task_type, Response):
            return task_type
        if action in ("purge", "retry_dead"):
            before = _cutoff(body)
            if isinstance(before, Response):
                return before
            sweep = commands.purge if action == "purge" else commands.retry_dead
            return lambda: sweep(root, task_type, before, wait)
        send = commands.pause if action == "pause" else commands.resume
        return lambda: send(root, task_type, wait)


def _cutoff(body: dict[str, Any]) -> int | Response | None:
    """A sweep's cutoff (wall µs; None: none): `before`, RFC 3339 or a day, or
    `older_than_s` seconds before now (the clock the tools share with the daemons)."""
    before, age = body.get("before"), body.get("older_than_s")
    if before is not None and age is not None:
        return _error("give before or older_than_s, not both", 400)
    if before is not None:
        if not isinstance(before, str):
            return _error("before must be an RFC 3339 time or a day (YYYY-MM-DD)", 400)
        try:
            return parse_rfc3339(before + "T00:00:00Z" if _DATE.fullmatch(before) else before)
        except ValueError as exc:
            return _error(f"before must be an RFC 3339 time or a day (YYYY-MM-DD): {exc}", 400)
    if age is None:
        return None
    if not isinstance(age, int) or isinstance(age, bool) or not 0 <= age <= 100 * 365 * 86_400:
        return _error("older_than_s must be a whole number of seconds, 0 to 100 years", 400)
    try:
        now = wall_now_us(load_tool_settings())
    except ConfigError as exc:
        return _error(str(exc), 409)
    return now - age * 1_000_000


def _same_origin(origin: str, host: str) -> bool:
    """Whether `origin` (an Origin or Referer value) is this server's own address (`host`, as
    the browser wrote it in the `Host` header). A malformed one, or `null`, is not."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc.lower() == host.lower()
