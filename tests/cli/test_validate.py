"""What `snerdmq validate` gathers from a queue directory before the core judges it
(`snerd.cli.validate`, `snerd.queuedir`), on real files. The judgement itself is tested on a
fixed clock in tests/core/test_health.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from snerd.cli.fsck import main as fsck_main
from snerd.cli.validate import main as validate_main
from snerd.queuedir import inbox_waiting


def test_inbox_bytes_waiting_are_read_from_the_shard_folder(tmp_path: Any) -> None:
    """What `validate` gathers for a shard's inboxes: bytes past each file's ingested offset."""
    folder = tmp_path / "shard-0" / "inbox"
    assert inbox_waiting(tmp_path, 0, {}) == {"inbox_waiting_bytes": 0, "inbox_waiting_files": 0}
    folder.mkdir(parents=True)
    (folder / "a.log").write_bytes(b"x" * 30)
    (folder / "b.log").write_bytes(b"x" * 10)
    (folder / "b.read").write_bytes(b"10\n")  # a hint, not an inbox
    assert inbox_waiting(tmp_path, 0, {"a": 12, "b": 10}) == {
        "inbox_waiting_bytes": 18,
        "inbox_waiting_files": 1,
    }



@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "the file is empty"),
        (b"[1]", "the document is an array, not an object"),
        (b'{"queue": "q", "shards": "x", "version": 0}', "'shards' is \"x\""),
        (b'{"queue": "q", "shards": 2, "version": 0, "claims": [1]}', "'claims' is an array"),
    ],
)
def test_validate_and_fsck_report_an_unusable_membership_file(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], content: bytes, problem: str
) -> None:
    q = tmp_path / "q"
    (q / "shard-0" / "tasks").mkdir(parents=True)
    (q / "shard-1" / "tasks").mkdir(parents=True)
    (q / "membership.json").write_bytes(content)
    named = f"{q / 'membership.json'} is not a usable membership file: {problem}"
    for main in (validate_main, fsck_main):
        assert main([str(q)]) == 1
        out = capsys.readouterr().out
        assert named in out and "refuses to start on it (exit 2)" in out, out
        assert "shard-1" in out  # the shard directories found on disk are still looked at
        assert main([str(q), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        if main is validate_main:
            texts = report["problems"]
        else:
            texts = [e["problem"] for e in report["refused_entries"]]
        assert any(named in text for text in texts), texts
