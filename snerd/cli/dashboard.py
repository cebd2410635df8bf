"""`snerdmq dashboard DIR [--host H] [--port P] [--token T]`: serve a live web dashboard.

The server is `snerd.dashboard.server` (the one an SDK starts too); this module parses the
command line, checks the address and token (`check_exposure`), listens, prints the address it
listens on (the real port when `--port 0`) on stdout, then serves on trio until SIGINT or
SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import trio
from hypercorn.trio import serve

from snerd.cli.args import UsageError, command_parser, number_arg, run_command, tool_settings
from snerd.dashboard.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    check_exposure,
    dashboard_app,
    hypercorn_config,
    listen,
    url_of,
)
from snerd.queuedir import open_queue

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """`snerdmq dashboard DIR [--host H] [--port P] [--token T]`."""
    parser = command_parser(
        "dashboard",
        "Serve a live web dashboard of the queue in DIR: shards and their owners, daemons, "
        "tasks by state, dead letters with their final errors; updated as the files change "
        "(WebSocket). Its buttons retry dead letters, cancel tasks and pause or resume task "
        "types, through the same routed commands as `snerdmq cancel` etc. (never by writing "
        "a daemon's log); --read-only refuses every write and shows no button.\nReads come "
        "from the files (like `snerdmq stats`): safe while daemons run, on any host that "
        "mounts DIR.",
        "Listens on loopback unless --host says otherwise; any other address needs a token "
        "(SNERD_DASHBOARD_TOKEN, or --token), which every request must then carry: open "
        "http://HOST:PORT/?token=TOKEN once in the browser (it sets a cookie), or send "
        "`Authorization: Bearer TOKEN` to the JSON API under /api/. A write (POST /api/act/...) "
        "must also come from the dashboard's own origin and carry its session's CSRF token.",
    )
    parser.add_argument("directory", metavar="DIR", help="queue directory")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=number_arg(
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
    parser.add_argument("--read-only", action="store_true",
                        help="refuse every write (retry, cancel, pause, resume)")
    return run_command(parser, argv, _dashboard)


def _dashboard(args: argparse.Namespace) -> int:
    try:
        token = check_exposure(args.host, args.token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    queue = open_queue(args.directory)
    # A bad SNERD_CLOCK_SKEW_MARGIN or SNERD_TEST_CLOCK_OFFSET is refused here, not inside
    # the server.
    settings = tool_settings()
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        print(f"snerdmq dashboard: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    app = dashboard_app(queue.directory, args.host, token, settings, read_only=args.read_only)
    note = " (token required: open it with ?token=<token> once)" if token else ""
    print(f"snerd dashboard for {queue.directory}: {url_of(sock)}{note}", flush=True)

    async def main() -> None:
        with trio.open_signal_receiver(2, 15) as signals:  # SIGINT, SIGTERM

            async def stop() -> None:
                async for _ in signals:
                    return

            await serve(app, hypercorn_config(sock), shutdown_trigger=stop)

    trio.run(main)
    return 0
