"""`snerdmq demo`: the guided tour runs to completion against a real daemon, twice on one DIR.

The first run goes through `snerd.cli.demo.main` in-process; the second through the console script,
as `make run` calls it. Both spawn a real `snerdmq` daemon through `snerd.SnerdQueue`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from snerd.cli import main as cli_main
from snerd.cli.demo import main

SNERDMQ = Path(sys.executable).parent / "snerdmq"
COMMAND = [str(SNERDMQ)] if SNERDMQ.exists() else [sys.executable, "-m", "snerd.cli"]
EXPECTED = {
    "succeeded": 15,
    "retried": 3,
    "dead-lettered": 1,
    "dropped (dedupe)": 1,
    "still waiting": 1,
}


def counts(out: str) -> dict[str, int]:
    found = re.findall(
        r"^  (succeeded|retried|dead-lettered|dropped \(dedupe\)|still waiting): +(\d+)",
        out,
        re.MULTILINE,
    )
    return {name: int(n) for name, n in found}


def test_the_demo_runs_to_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = tmp_path / "q"
    assert main([str(q), "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert counts(out) == EXPECTED, out
    assert "urgent jobs jumped the line: yes" in out
    assert "The daemon drained and exited with code 0" in out
    assert f"`snerdmq dashboard {q}`" in out
    for event in (
        "failed    pay-1        attempt 1: RuntimeError: card network timed out -> retry",
        "started   pay-1        flaky-payment, attempt 3 of 3",
        "DEAD      export-1     dead-lettered: PermissionError: export bucket is read-only",
        "progress  report-1     50% (section 2 of 4)",
        "dropped   contacts-2",
        "waiting   partner-4",
        "started   reminder-1",
    ):
        assert event in out
    # Drained: the claim was handed back; the files hold exactly what the summary says.
    assert cli_main(["validate", str(q)]) == 0
    assert "shard-0: free" in capsys.readouterr().out
    assert cli_main(["stats", str(q), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert (totals["live"], totals["completed"], totals["dead_letters"]) == (1, 15, 1)
    assert totals["types"] == {"call-partner-api": 1}


def test_the_demo_runs_again_on_the_same_directory(tmp_path: Path) -> None:
    q = tmp_path / "q"
    for _ in (1, 2):
        done = subprocess.run(
            [*COMMAND, "demo", str(q)], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert counts(done.stdout) == EXPECTED, done.stdout
    # The second run saw the first run's rate-limited task still queued.
    assert "queued from earlier runs or other programs: 1" in done.stdout
    assert "[Snerd] Shutdown complete." in done.stderr


def test_the_demo_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main([str(tmp_path), "--timeout", "soon"]) == 2
    assert "--timeout must be a number of seconds, got 'soon'" in capsys.readouterr().err
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert main([str(not_a_dir)]) == 2
    assert f"DIR '{not_a_dir}' is not a directory" in capsys.readouterr().err
    monkeypatch.setenv("SNERD_FSYNC", "sometimes")
    assert main([str(tmp_path / "q")]) == 2
    assert "SNERD_FSYNC='sometimes'" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
