"""Serving the dashboard: the web server behind `snerdmq dashboard DIR` (hypercorn on trio,
`snerd.cli.dashboard`) and the same server started by an SDK (`SnerdQueue.start_dashboard` /
`Engine.start_dashboard`: `EmbeddedDashboard`, hypercorn on the SDK's own event loop, asyncio
or trio), which also shows the progress its handlers report.

Both listen on 127.0.0.1:8642 unless told otherwise, and refuse an address other than loopback
without a token (`check_exposure`: `--token` or, better, as `--token` shows in `ps`,
SNERD_DASHBOARD_TOKEN). It must never serve a queue's task ids, types and errors to the network
without a token.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import sniffio
from hypercorn.asyncio import serve as asyncio_serve
from hypercorn.config import Config
from hypercorn.trio import serve as trio_serve

from snerd.config import ToolSettings, env_dashboard_token, load_tool_settings
from snerd.dashboard.app import ProgressFeed, create_app
from snerd.dashboard.view import QueueView
from snerd.queuedir import wall_now_us

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LOOPBACK_NAMES",
    "EmbeddedDashboard",
    "check_exposure",
    "dashboard_app",
    "hypercorn_config",
    "is_loopback",
    "listen",
    "url_of",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
#: The `Host` names a loopback-bound dashboard answers to.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> str | None:
    """The token to require (`token`, else SNERD_DASHBOARD_TOKEN, else none); refuses
    (ValueError) an empty one, and an address other than loopback without one."""
    if token is None:
        token = env_dashboard_token()
    if token is not None and token.strip() == "":
        raise ValueError("the dashboard token (--token or SNERD_DASHBOARD_TOKEN) is empty")
    if token is None and not is_loopback(host):
        raise ValueError(
            f"--host {host} is not a loopback address: refusing to serve the queue's task "
            "ids, types and errors to the network without a token; set SNERD_DASHBOARD_TOKEN "
            "(or --token), or listen on 127.0.0.1 and reach it through an SSH tunnel or an "
            "authenticating proxy"
        )
    return token


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: any free port). OSError when it cannot."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bare, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    address, port = sock.getsockname()[:2]
    return f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"


def hypercorn_config(sock: socket.socket) -> Any:
    """hypercorn's configuration, serving on `sock`, which it then owns (and closes)."""
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = "-"
    config.graceful_timeout = 2.0
    return config


def dashboard_app(
    directory: Path,
    host: str,
    token: str | None,
    settings: ToolSettings,
    progress: Any = None,
    *,
    read_only: bool = False,
) -> Any:
    """The web app of the queue in `directory`: lease states judged with `settings`' skew
    margin on its wall clock, the hosts it answers to (loopback names when bound to one);
    `read_only`: no write at all."""
    view = QueueView(
        directory, skew_us=settings.skew_margin_us, clock=lambda: wall_now_us(settings)
    )
    return create_app(
        view,
        token=token,
        allowed_hosts=[*LOOPBACK_NAMES, host] if is_loopback(host) else None,
        progress=progress,
        read_only=read_only,
    )


# ------------------------------------------------------------------------------------------
# Served by an SDK
# ------------------------------------------------------------------------------------------


class EmbeddedDashboard:
    """The dashboard of an SDK's queue directory, served on the SDK's event loop, with the
    progress messages the SDK sees (`feed`, an `on_progress` observer)."""

    def __init__(self) -> None:
        self.url: str | None = None
        self._stop: Any = None
        self._done: Any = None

    async def start(
        self,
        directory: Path,
        *,
        host: str,
        port: int,
        token: str | None,
        read_only: bool = False,
        observe_progress: Callable[[Callable[[Any, Any], None]], object],
        spawn: Callable[..., Any],
    ) -> str:
        """Listen, start serving in the background (`spawn(coroutine_fn)`, the SDK's way to run
        something outside the caller's task tree), and return the URL. The caller has checked
        the address and token (`check_exposure`).

        Raises:
            OSError: the address cannot be listened on.
            snerd.config.ConfigError: SNERD_CLOCK_SKEW_MARGIN, SNERD_LEASE_TTL or
                SNERD_TEST_CLOCK_OFFSET is set to a value the daemon refuses.
        """
        settings = load_tool_settings()
        sock = listen(host, port)
        feed = ProgressFeed(clock=lambda: wall_now_us(settings))
        app = dashboard_app(directory, host, token, settings, progress=feed, read_only=read_only)
        observe_progress(feed.add)
        self._stop = stop = anyio.Event()
        self._done = done = anyio.Event()
        library = sniffio.current_async_library()

        async def run(*, task_status: Any = None) -> None:
            try:
                if task_status is not None:
                    task_status.started()
                if library == "trio":
                    await trio_serve(app, hypercorn_config(sock), shutdown_trigger=stop.wait)
                else:
                    await asyncio_serve(app, hypercorn_config(sock), shutdown_trigger=stop.wait)
            finally:
                done.set()

        self.url = url_of(sock)
        await spawn(run)
        return self.url

    async def aclose(self) -> None:
        """Stop serving (open connections get hypercorn's graceful timeout, 2 s)."""
        if self._stop is not None and self._done is not None:
            self._stop.set()
            await self._done.wait()
