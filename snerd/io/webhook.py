"""Webhook execution over HTTP (httpx): the shell's half of `CallWebhook`.

Fixes upstream's SSRF hole (bug 6.5.26): a timeout always applies, redirects are never followed,
and targets that resolve to loopback, private, link-local or otherwise non-public addresses are
refused unless `SNERD_WEBHOOK_ALLOW` lists them (`private` allows every such address; or a comma
list of hosts). With `SNERD_WEBHOOK_SECRET` set, each request carries
`X-SnerdMQ-Signature: sha256=<hex HMAC of the body>`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson
import trio

if TYPE_CHECKING:
    import httpx

__all__ = ["WebhookCaller"]


class WebhookCaller:
    """One shared client for every webhook call of a daemon."""

    def __init__(self, *, allow: str | None = None, secret: str | None = None) -> None:
        allow = os.environ.get("SNERD_WEBHOOK_ALLOW", "") if allow is None else allow
        self.allow_private = "private" in {a.strip() for a in allow.split(",")}
        self.allow_hosts = {a.strip().lower() for a in allow.split(",") if a.strip()}
        secret = os.environ.get("SNERD_WEBHOOK_SECRET") if secret is None else secret
        self.secret = secret.encode() if secret else None
        self._client: httpx.AsyncClient | None = None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx  # imported on first use: it costs ~0.4 s of CPU at daemon start

            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    async def _refusal(self, url: str) -> str | None:
        """Why `url` may not be called, or None."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return f"webhook URL scheme {parts.scheme!r} is not http or https"
        host = (parts.hostname or "").lower()
        if not host:
            return "webhook URL has no host"
        if self.allow_private or host in self.allow_hosts:
            return None
        try:
            infos = await trio.socket.getaddrinfo(host, parts.port or 443, type=0)
        except OSError as exc:
            return f"cannot resolve webhook host {host!r}: {exc}"
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global:
                return (
                    f"webhook host {host!r} resolves to the non-public address {address}; "
                    "allow it with SNERD_WEBHOOK_ALLOW"
                )
        return None

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
        """POST one task; (True, None) on a 2xx answer, else (False, why)."""
        refusal = await self._refusal(url)
        if refusal is not None:
            return False, f"Webhook request refused: {refusal}"
        body = orjson.dumps({"taskId": task_id, "taskType": task_type, "data": data})
        headers = {"Content-Type": "application/json", "X-SnerdMQ-Event": event}
        if self.secret is not None:
            digest = hmac.new(self.secret, body, hashlib.sha256).hexdigest()
            headers["X-SnerdMQ-Signature"] = f"sha256={digest}"
        try:
            with trio.fail_after(timeout_s):
                response = await self._get_client().post(
                    url, content=body, headers=headers, timeout=timeout_s
                )
        except trio.TooSlowError:
            return False, f"Webhook request failed: timed out after {timeout_s:g} seconds"
        except Exception as exc:  # httpx.HTTPError and friends: report, never crash
            if isinstance(exc, trio.Cancelled):
                raise
            return False, f"Webhook request failed: {exc!r}"
        if 200 <= response.status_code < 300:
            return True, None
        return False, f"Webhook returned non-2xx status: {response.status_code}"
