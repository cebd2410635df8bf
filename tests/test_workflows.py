"""docs/workflows.md runs as written: each `python` block, as its own process, prints the lines
of the `text` block after it, in order (`...` matching any text). The machinery is the tour's
(tests/test_tour.py); each block starts a daemon of its own on a fresh directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_tour import Block, blocks, check_block, check_links

WORKFLOWS = Path(__file__).resolve().parent.parent / "docs" / "workflows.md"
BLOCKS = blocks(WORKFLOWS.read_text())


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_an_example_of_the_workflows_page_runs_as_written(block: Block) -> None:
    check_block(block)


def test_the_page_has_an_example_of_each_workflow_and_its_links_resolve() -> None:
    assert [b.lang for b in BLOCKS] == ["python"] * 5
    assert all(b.expected for b in BLOCKS)
    text = WORKFLOWS.read_text()
    for needed in ("trigger_after_ids=parts", "q.schedule(", "unique_key=", "max_retry_handler"):
        assert needed in text, needed
    check_links(WORKFLOWS)
