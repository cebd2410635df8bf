"""The `snerdmq` subcommands other than the daemon itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["SUBCOMMANDS"]

SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {}
