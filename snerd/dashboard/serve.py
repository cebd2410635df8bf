"""`snerdmq dashboard DIR`: serve the dashboard of the queue in DIR (hypercorn, trio).

Listens on 127.0.0.1:8642 unless told otherwise, and refuses an address other than loopback
without a token (`--token` or, better, as `--token` shows in `ps`, SNERD_DASHBOARD_TOKEN).
Prints the address it listens on (the real port when `--port 0`) on stdout, then serves until
SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Sequence
from functools import partial

from snerd.tools import UsageError, _now_us, _parser, _run, _skew_margin_us, open_queue

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "LOOPBACK_NAMES", "dashboard_main", "is_loopback"]

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


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--port must be a whole number from 0 to 65535, got {text!r}"
        ) from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"--port must be a whole number from 0 to 65535, got {text!r}"
        )
    return value


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
        type=_port,
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
    token = args.token if args.token is not None else os.environ.get("SNERD_DASHBOARD_TOKEN")
    if token is not None and token.strip() == "":
        raise UsageError("the dashboard token (--token or SNERD_DASHBOARD_TOKEN) is empty")
    loopback = is_loopback(args.host)
    if not loopback and token is None:
        raise UsageError(
            f"--host {args.host} is not a loopback address: refusing to serve the queue's "
            "task ids, types and errors to the network without a token; set "
            "SNERD_DASHBOARD_TOKEN (or --token), or listen on 127.0.0.1 and reach it through "
            "an SSH tunnel or an authenticating proxy"
        )
    queue = open_queue(args.directory)
    skew_us = _skew_margin_us()
    _now_us()  # a bad SNERD_TEST_CLOCK_OFFSET is refused here, not inside the server
    # Imported here: the other subcommands start without the web stack.
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    from snerd.dashboard.app import create_app
    from snerd.dashboard.view import QueueView

    view = QueueView(queue.directory, skew_us=skew_us, clock=_now_us)
    app = create_app(
        view,
        token=token,
        allowed_hosts=[*LOOPBACK_NAMES, args.host] if loopback else None,
    )
    config = Config()
    host = f"[{args.host.strip('[]')}]" if ":" in args.host else args.host
    config.bind = [f"{host}:{args.port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.graceful_timeout = 2.0

    async def main() -> None:
        with trio.open_signal_receiver(2, 15) as signals:  # SIGINT, SIGTERM

            async def stop() -> None:
                async for _ in signals:
                    return

            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    partial(serve, app, config, shutdown_trigger=stop)  # type: ignore[arg-type]
                )
                for bind in binds:
                    note = " (token required: open it with ?token=<token> once)" if token else ""
                    print(f"snerd dashboard for {queue.directory}: {bind}/{note}", flush=True)

    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        exc = _os_error(group)
        if exc is None:
            raise
        print(f"snerdmq dashboard: cannot listen on {host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"snerdmq dashboard: cannot listen on {host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _os_error(group: BaseExceptionGroup[BaseException]) -> OSError | None:
    """The first OSError in a (nested) exception group, if that is all it holds."""
    errors = group.subgroup(OSError)
    if errors is None or group.split(OSError)[1] is not None:
        return None
    leaf: BaseException = errors
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf if isinstance(leaf, OSError) else None
