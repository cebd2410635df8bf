"""docs/python.md runs as written: each `python` block, as its own process, prints the lines of
the `text` block after it, in order (the tour's machinery, tests/test_tour.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_tour import Block, blocks, check_block, check_links

PAGE = Path(__file__).resolve().parent.parent / "docs" / "python.md"
BLOCKS = blocks(PAGE.read_text())


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_an_example_of_the_python_page_runs_as_written(block: Block) -> None:
    check_block(block)


def test_the_page_shows_each_part_and_its_links_resolve() -> None:
    assert [b.lang for b in BLOCKS] == ["python"] * 4
    assert all(b.expected for b in BLOCKS)
    text = PAGE.read_text()
    for needed in ("@queue.task(", "never_retry=", "snerd.producer(", "enqueue_many("):
        assert needed in text, needed
    check_links(PAGE)
