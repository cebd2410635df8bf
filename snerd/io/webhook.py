"""Webhook execution over HTTP (httpx): the shell's half of `CallWebhook`.

Owns the HTTP client every webhook call of a daemon shares, name resolution for it, and the
SSRF guard's I/O. It must never raise out of `WebhookCaller.call`: whatever a task carries (its
record may come from an older version or be written by hand), a failure while calling it fails
that attempt, with a reason, and never the daemon that runs it.

What a call does, in order:

1. The URL is checked again by the core's rule (`snerd.core.webhook_target.parse_webhook_url`);
   the enqueue refused bad ones before its ack, but a log may hold anything.
2. The HTTP client connects through `_CheckedNetwork`, which resolves the host once, asks the
   core's address rule (`refused_address`) about every address it resolves to, refuses the call
   if any is not public, and connects to one of the addresses it checked. Resolving once and
   connecting to what was checked closes DNS rebinding (a name that answers a public address to
   the check and a private one to the connect). The request still names the host: its `Host`
   header, and for https the TLS server name and the certificate check, are the URL's.
3. A timeout always applies, redirects are never followed, at most `_BODY_LIMIT` bytes of the
   answer are read. With `SNERD_WEBHOOK_SECRET` set, the request carries
   `X-SnerdMQ-Signature: sha256=<hex HMAC of the body>`.

`SNERD_WEBHOOK_ALLOW` lifts the address rule: `private` for every address, or a comma list of
host names (as the URL writes them; IPv6 addresses without brackets) whose addresses are not
checked. Reasons never name the URL, the host or its addresses: they become the task's error,
which dead letters, `stats` and the dashboard show.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import ipaddress
import os
import re
import ssl
from collections.abc import AsyncGenerator, Iterable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

import orjson
import trio

from snerd.core.schema import TASK_ID, TASK_TYPE
from snerd.core.webhook_target import BadWebhookUrl, parse_webhook_url, refused_address

if TYPE_CHECKING:
    import httpcore
    import httpx

__all__ = ["WebhookCaller"]

#: The most of an answer's body read: enough for any webhook's "ok", so its connection can be
#: kept; a longer body is dropped unread with its connection.
_BODY_LIMIT = 64 << 10


class _CallStopped(Exception):
    """Raised by `_CheckedNetwork` through httpx (which passes on what it does not know): the
    call stops here, and `message` is the whole reason."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _CheckedNetwork:
    """An httpcore network backend that resolves once, checks, and connects to what it checked.

    (Duck-typed as `httpcore.AsyncNetworkBackend`, so httpcore is imported only with httpx, on
    the first webhook call.)"""

    def __init__(
        self,
        *,
        allow_private: bool,
        allow_hosts: frozenset[str],
        connect_to: httpcore.AsyncNetworkBackend,
    ) -> None:
        self._allow_private = allow_private
        self._allow_hosts = allow_hosts
        self._connect_to = connect_to

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        import httpcore

        addresses = await self._checked_addresses(host, port)
        failures: list[BaseException] = []
        for address in addresses:
            try:
                return await self._connect_to.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failures.append(exc)
        # httpcore's text names the address ("all attempts to connect to 10.1.2.3:80 failed").
        raise httpcore.ConnectError(f"cannot connect to the host ({_why_not(failures)})")

    async def _checked_addresses(self, host: str, port: int) -> list[str]:
        literal = _is_ip_literal(host)
        try:
            infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        except OSError as exc:
            raise _CallStopped(
                f"Webhook request failed: the host name does not resolve ({_os_text(exc)})"
            ) from None
        # dict.fromkeys: each address once, in the resolver's order (its preference).
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise _CallStopped("Webhook request failed: the host name resolves to no address")
        if self._allow_private or _allow_key(host) in self._allow_hosts:
            return addresses
        for address in addresses:
            kind = refused_address(address)
            if kind is not None:
                subject = "the host is" if literal else "the host name resolves to"
                raise _CallStopped(
                    f"Webhook request refused: {subject} {kind}; allow it with SNERD_WEBHOOK_ALLOW"
                )
        return addresses

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise _CallStopped("Webhook request refused: a Unix socket is not a webhook target")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class WebhookCaller:
    """One shared client for every webhook call of a daemon.

    `network` is where checked addresses are connected to: httpcore's trio backend, unless a
    test gives another."""

    def __init__(
        self,
        *,
        allow: str | None = None,
        secret: str | None = None,
        network: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        allow = os.environ.get("SNERD_WEBHOOK_ALLOW", "") if allow is None else allow
        entries = {a.strip() for a in allow.split(",") if a.strip()}
        self.allow_private = "private" in entries
        self.allow_hosts = frozenset(_allow_key(a) for a in entries)
        secret = os.environ.get("SNERD_WEBHOOK_SECRET") if secret is None else secret
        self.secret = secret.encode() if secret else None
        self._network = network
        self._client: httpx.AsyncClient | None = None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            # Imported on first use: they cost ~0.4 s of CPU at daemon start.
            import httpcore
            import httpx

            checked = _CheckedNetwork(
                allow_private=self.allow_private,
                allow_hosts=self.allow_hosts,
                connect_to=self._network or httpcore.TrioBackend(),
            )
            transport = httpx.AsyncHTTPTransport(verify=_tls_context(), trust_env=False)
            # httpx has no argument for the network backend, so its pool is replaced by one
            # with the same TLS settings that connects through `checked`. `_pool` is what
            # httpx's transport sends through; test_webhook proves the swap on every call.
            transport._pool = httpcore.AsyncConnectionPool(
                ssl_context=_tls_context(),
                network_backend=cast("httpcore.AsyncNetworkBackend", checked),
            )
            self._client = httpx.AsyncClient(
                transport=transport, follow_redirects=False, trust_env=False
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    async def call(
        self,
        *,
        url: str,
        event: str,
        task_id: str,
        task_type: str,
        data: str,
        timeout_s: float,
    ) -> tuple[bool, str | None]:
        """POST one task; (True, None) on a 2xx answer, else (False, why). Never raises but
        trio.Cancelled: any failure of one call is that call's outcome."""
        try:
            return await self._call(url, event, task_id, task_type, data, timeout_s)
        except Exception as exc:
            # A bug, or data no rule foresaw (a record from an older version): it fails this
            # attempt, and in the end dead-letters the task, instead of killing the daemon and
            # then every daemon that takes the shard over.
            return False, f"Webhook request failed: snerd could not make the call ({_name(exc)})"

    async def _call(
        self, url: str, event: str, task_id: str, task_type: str, data: str, timeout_s: float
    ) -> tuple[bool, str | None]:
        target = parse_webhook_url(url)
        if isinstance(target, BadWebhookUrl):
            return False, f"Webhook request refused: {target.reason}"
        body = orjson.dumps({TASK_ID: task_id, TASK_TYPE: task_type, "data": data})
        headers = {"Content-Type": "application/json", "X-SnerdMQ-Event": event}
        if self.secret is not None:
            digest = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers["X-SnerdMQ-Signature"] = f"sha256={digest}"
        try:
            with trio.fail_after(timeout_s):
                async with self._get_client().stream(
                    "POST", url, content=body, headers=headers, timeout=timeout_s
                ) as response:
                    status = response.status_code
                    read = 0
                    # (aiter_raw is an async generator, closed here if left early.)
                    raw = cast("AsyncGenerator[bytes, None]", response.aiter_raw())
                    async with aclosing(raw) as chunks:
                        async for chunk in chunks:
                            read += len(chunk)
                            if read > _BODY_LIMIT:
                                break
        except trio.TooSlowError:
            return False, f"Webhook request failed: timed out after {timeout_s:g} seconds"
        except _CallStopped as exc:
            return False, exc.message
        except Exception as exc:
            import httpx

            if not isinstance(exc, httpx.HTTPError | httpx.InvalidURL | ValueError | OSError):
                raise  # not the HTTP client's: `call` reports its class only
            return False, f"Webhook request failed: {_described(exc, url, target.host)}"
        if 200 <= status < 300:
            return True, None
        return False, f"Webhook returned non-2xx status: {status}"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings (certifi's roots), built once a process: loading the roots
    costs ~40 ms of CPU, and every engine of a process has a client of its own."""
    import httpx

    return httpx.create_ssl_context(trust_env=False)


def _allow_key(host: str) -> str:
    """A host as `SNERD_WEBHOOK_ALLOW` compares it: lowercase, no brackets, no trailing dot."""
    return host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _described(exc: BaseException, url: str, host: str) -> str:
    """An HTTP client error as a reason: its class and text (or, when it has none, the text of
    what caused it: a failed TLS handshake is an empty ConnectError over the ssl module's
    error), with the URL and the host cut out (a TLS error names the host it expected)."""
    text = next((str(e) for e in _chain(exc) if str(e)), "")
    for secret in sorted({url, host, host.rstrip(".")}, key=len, reverse=True):
        if secret:
            text = re.sub(re.escape(secret), "<host>", text, flags=re.IGNORECASE)
    return f"{_name(exc)}: {text}" if text else _name(exc)


def _why_not(failures: list[BaseException]) -> str:
    """Why no address could be connected to, from the OS errors under httpcore's."""
    for failure in failures:
        for exc in _chain(failure):
            if isinstance(exc, OSError) and exc.errno:
                return _os_text(exc)
    if any(type(f).__name__ == "ConnectTimeout" for f in failures):
        return "timed out"
    return "no address answered"


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """`exc`, its causes and contexts, and the members of exception groups among them."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for link in (current.__cause__, current.__context__):
            if link is not None:
                todo.append(link)


def _os_text(exc: OSError) -> str:
    """An OS error's own words, without the file name or address it may carry (trio's
    strerror says "error connecting to ('10.1.2.3', 80): ...")."""
    if exc.errno is not None and exc.errno > 0:
        name = errno.errorcode.get(exc.errno, "")
        text = os.strerror(exc.errno)
        return f"{text} ({name})" if name else text
    return exc.strerror or _name(exc)  # a resolver's error (a negative EAI_* code)
