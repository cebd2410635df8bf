"""How the `snerdmq` subcommands print: sizes, spans, tables, one-line texts and JSON.

Machine output (`--json`) goes to stdout as indented JSON; tables are plain text, left-aligned
but for the columns named right-aligned. Nothing here reads a file or decides anything.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["clip", "fmt_bytes", "format_table", "print_json"]


def fmt_bytes(n: int) -> str:
    """`512 B`, `1.5 KiB`, ... up to TiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]
) -> list[str]:
    """The lines of a table: columns as wide as their widest cell, those in `right`
    right-aligned, two spaces between."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(out).rstrip()

    return [line(headers), *(line(row) for row in rows)]


def clip(text: str, width: int) -> str:
    """`text` on one line (runs of whitespace made one space), cut to `width` with `…`."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_json(value: Any) -> None:
    """`value` as indented JSON on stdout."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
