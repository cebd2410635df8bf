"""The pytest plugin of `snerd.testing` (entry point `pytest11`: `snerd`): the `snerd_queue`
fixture.

It must never import pytest anywhere but here: the rest of `snerd.testing` works without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from snerd.testing.blocking import TestQueue

__all__ = ["snerd_queue"]


@pytest.fixture
def snerd_queue(tmp_path: Path) -> Iterator[TestQueue]:
    """A started `snerd.testing.TestQueue` on `tmp_path / "snerdata"`, closed after the test:
    register handlers, enqueue, `run_until_idle()`, `advance(hours=...)`."""
    with TestQueue(tmp_path / "snerdata") as queue:
        yield queue
