"""The daemon process's own settings (`snerd.io.stdio`), each checked in a fresh interpreter:
they change process-wide state that must not leak into the test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_young_collection_survivors_are_frozen_and_a_full_collection_frees_their_cycles() -> None:
    _run(
        """
        import gc, weakref
        from snerd.io.stdio import collect_all, tune_gc

        class Node:
            pass

        tune_gc()
        assert gc.get_threshold()[0] == 20_000
        frozen = gc.get_freeze_count()
        # Long-lived task state: scanned by one young collection, then out of its sight.
        kept = [Node() for _ in range(500)]
        gc.collect(0)
        assert gc.get_freeze_count() >= frozen + 500
        assert gc.get_count()[0] < 100 and not gc.get_objects(1)
        # A cycle that becomes garbage after it was frozen outlives young collections...
        a = Node()
        a.me = a
        gone = weakref.ref(a)
        gc.collect(0)
        del a
        gc.collect(0)
        assert gone() is not None
        # ... and not a full one, after which what is left is frozen again.
        collect_all()
        assert gone() is None
        assert gc.get_freeze_count() >= 500 and len(kept) == 500
        """
    )
