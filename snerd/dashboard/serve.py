"""Serving the dashboard: `snerdmq dashboard DIR` (hypercorn on trio), and the same server
started by an SDK (`SnerdQueue.start_dashboard` / `Engine.start_dashboard`, hypercorn on the
SDK's own event loop, asyncio or trio), which also shows the progress its handlers report.

Both listen on 127.0.0.1:8642 unless told otherwise, and refuse an address other than loopback
without a token (`--token` or, better, as `--token` shows in `ps`, SNERD_DASHBOARD_TOKEN). The
command prints the address it listens on (the real port when `--port 0`) on stdout, then serves
until SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from snerd.tools import (
    UsageError,
    _now_us,
    _number_arg,
    _parser,
    _run,
    _skew_margin_us,
    open_queue,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LOOPBACK_NAMES",
    "EmbeddedDashboard",
    "check_exposure",
    "dashboard_main",
    "is_loopback",
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
        token = os.environ.get("SNERD_DASHBOARD_TOKEN")
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


def _listen(host: str, port: int) -> socket.socket:
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


def _url(sock: socket.socket) -> str:
    address, port = sock.getsockname()[:2]
    return f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"


def _config(sock: socket.socket) -> Any:
    """hypercorn's configuration, serving on `sock`, which it then owns (and closes)."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = "-"
    config.graceful_timeout = 2.0
    return config


def _app(
    directory: Path, host: str, token: str | None, skew_us: int, progress: Any = None
) -> Any:
    from snerd.dashboard.app import create_app
    from snerd.dashboard.view import QueueView

    view = QueueView(directory, skew_us=skew_us, clock=_now_us)
    return create_app(
        view,
        token=token,
        allowed_hosts=[*LOOPBACK_NAMES, host] if is_loopback(host) else None,
        progress=progress,
    )


# ------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------


def dashboard_main(argv: Sequence[str]) -> int:
    """`snerdmq dashboard DIR [--host H] [--port P] [--token T]`."""
    parser = _parser(
        "dashboard",
        "Serve a live web dashboard of the queue in DIR: shards and their owners, daemons, "
        "tasks by state, dead letters with their final errors; updated as the files change "
        "(WebSocket).\nRead-only, from the files (like `snerdmq stats`): safe while daemons "
        "run, on any host that mounts DIR.",
        "Listens on loopback unless --host says otherwise; any other address needs a token "
        "(SNERD_DASHBOARD_TOKEN, or --token), which every request must then carry: open "
        "http://HOST:PORT/?token=TOKEN once in the browser (it sets a cookie), or send "
        "`Authorization: Bearer TOKEN` to the JSON API under /api/.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=_number_arg(
            "--port",
            int,
            "a whole number from 0 to 65535",
            "a whole number from 0 to 65535",
            lambda v: 0 <= v <= 65535,
        ),
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="token every request must carry (default: SNERD_DASHBOARD_TOKEN; none on loopback)",
    )
    return _run(parser, argv, _dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    try:
        token = check_exposure(args.host, args.token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    queue = open_queue(args.directory)
    skew_us = _skew_margin_us()
    _now_us()  # a bad SNERD_TEST_CLOCK_OFFSET is refused here, not inside the server
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        print(f"snerdmq dashboard: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    # Imported here: the other subcommands start without the web stack.
    import trio
    from hypercorn.trio import serve

    app = _app(queue.directory, args.host, token, skew_us)
    note = " (token required: open it with ?token=<token> once)" if token else ""
    print(f"snerd dashboard for {queue.directory}: {_url(sock)}{note}", flush=True)

    async def main() -> None:
        with trio.open_signal_receiver(2, 15) as signals:  # SIGINT, SIGTERM

            async def stop() -> None:
                async for _ in signals:
                    return

            await serve(app, _config(sock), shutdown_trigger=stop)

    trio.run(main)
    return 0


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
        observe_progress: Callable[[Callable[[Any, Any], None]], object],
        spawn: Callable[..., Any],
    ) -> str:
        """Listen, start serving in the background (`spawn(coroutine_fn)`, the SDK's way to run
        something outside the caller's task tree), and return the URL. The caller has checked
        the address and token (`check_exposure`).

        Raises:
            OSError: the address cannot be listened on.
        """
        import anyio
        import sniffio

        from snerd.dashboard.app import ProgressFeed

        sock = _listen(host, port)
        feed = ProgressFeed(clock=_now_us)
        app = _app(directory, host, token, _skew_margin_us(), progress=feed)
        observe_progress(feed.add)
        self._stop = stop = anyio.Event()
        self._done = done = anyio.Event()
        library = sniffio.current_async_library()

        async def run(*, task_status: Any = None) -> None:
            try:
                if task_status is not None:
                    task_status.started()
                if library == "trio":
                    from hypercorn.trio import serve as trio_serve

                    await trio_serve(app, _config(sock), shutdown_trigger=stop.wait)
                else:
                    from hypercorn.asyncio import serve as asyncio_serve

                    await asyncio_serve(app, _config(sock), shutdown_trigger=stop.wait)
            finally:
                done.set()

        self.url = _url(sock)
        await spawn(run)
        return self.url

    async def aclose(self) -> None:
        """Stop serving (open connections get hypercorn's graceful timeout, 2 s)."""
        if self._stop is not None and self._done is not None:
            self._stop.set()
            await self._done.wait()
