"""docs/tour.md runs as written: every command and code block, its exit status, its output.

The tour is for people new to snerd, who will paste its commands; a tour that drifts from the
code teaches the wrong thing. So this runs each fenced `sh` block (one command a line, from
the repository root, `.venv/bin/` meaning the bin directory of the interpreter running the
tests) and each `python` block (with this interpreter, as its own process), checks that each
command exits with the status its `# exits N` comment gives (0 without one), and that every
line of the `text` block right after a block appears in the block's output, in order (`...` in
an expected line matches any text). It also checks that every relative link of the tour
resolves, that every file it names exists, and that every `Class.member` it names is defined.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "tour.md"
#: Where `.venv/bin/` points when the tests run (the tour is written for a fresh clone).
BIN = Path(sys.executable).parent
#: Seconds a block may take (the longest, a simulator run, takes about one).
TIMEOUT_S = 60

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
_EXITS = re.compile(r"#\s*exits (\d+)\s*$")


@dataclass(frozen=True)
class Block:
    """One runnable block of the tour, and the output quoted after it (None: none)."""

    lang: str
    body: str
    expected: str | None
    line: int

    @property
    def name(self) -> str:
        first = next(ln for ln in self.body.splitlines() if ln.strip())
        return f"line {self.line}: {first[:60]}"


def blocks(text: str) -> list[Block]:
    """The `sh` and `python` blocks of `text`, each with the `text` block that directly
    follows it (only blank lines between)."""
    fences = list(_FENCE.finditer(text))
    found = []
    for i, fence in enumerate(fences):
        if fence.group(1) not in ("sh", "python"):
            continue
        expected = None
        if i + 1 < len(fences):
            after = fences[i + 1]
            between = text[fence.end() : after.start()]
            if after.group(1) == "text" and not between.strip():
                expected = after.group(2)
        line = text.count("\n", 0, fence.start()) + 1
        found.append(Block(fence.group(1), fence.group(2), expected, line))
    return found


BLOCKS = blocks(TOUR.read_text())


def commands(block: Block) -> list[tuple[str, int]]:
    """Each command of an `sh` block with the exit status the tour gives it."""
    out = []
    for line in block.body.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        status = _EXITS.search(line)
        out.append((line, int(status.group(1)) if status else 0))
    return out


def check_block(block: Block) -> None:
    """`block` runs, and prints the lines of the `text` block after it, in order (a page's
    test: tests/test_workflows.py, tests/test_python_docs.py)."""
    output = run_block(block)
    assert block.expected is not None
    gone = missing(block.expected, output)
    assert gone is None, f"{block.name}: no output line matches {gone!r}:\n{output[-3000:]}"


def check_links(page: Path) -> None:
    """Every relative link of `page` names a file beside it."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    assert links and all((page.parent / link).exists() for link in links), links


def run_block(block: Block) -> str:
    """Run `block` as the tour says; returns its output (stdout and stderr)."""
    if block.lang == "python":
        proc = subprocess.run(
            [sys.executable, "-"],
            input=block.body,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert proc.returncode == 0, f"{block.name} exited {proc.returncode}:\n{proc.stderr}"
        return proc.stdout + proc.stderr
    output = ""
    for command, status in commands(block):
        resolved = command.replace(".venv/bin/", f"{BIN}/")
        proc = subprocess.run(
            ["bash", "-c", resolved],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        output += proc.stdout + proc.stderr
        assert proc.returncode == status, (
            f"{command!r} exited {proc.returncode}, the tour says {status}:\n{output[-3000:]}"
        )
    return output


def expected_lines(expected: str) -> list[re.Pattern[str]]:
    """Each non-blank expected line as a pattern for a whole output line."""
    return [
        re.compile(".*".join(map(re.escape, line.strip().split("..."))))
        for line in expected.splitlines()
        if line.strip()
    ]


def missing(expected: str, output: str) -> str | None:
    """The first expected line not found in `output` after the lines matched before it."""
    lines = [ln.strip() for ln in output.splitlines()]
    at = 0
    for pattern in expected_lines(expected):
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return pattern.pattern
        at += 1
    return None


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_a_block_of_the_tour_runs_as_written(block: Block) -> None:
    output = run_block(block)
    if block.expected is not None:
        gone = missing(block.expected, output)
        assert gone is None, f"{block.name}: no output line matches {gone!r}:\n{output[-3000:]}"


def test_the_tour_has_its_blocks_and_its_negative_control() -> None:
    # The parser must find what the tour runs, or the test above proves nothing.
    langs = [b.lang for b in BLOCKS]
    assert langs.count("python") >= 3 and langs.count("sh") >= 3, langs
    assert all(b.expected is not None for b in BLOCKS), [b.name for b in BLOCKS if not b.expected]
    failing = [c for b in BLOCKS if b.lang == "sh" for c, status in commands(b) if status]
    assert any("--unsafe-" in c for c in failing), "the negative control must be run, exiting 1"


def test_matching_is_strict_enough_to_fail() -> None:
    assert missing("a ... c", "a b c") is None
    assert missing("a ... c\nd", "d\na b c") == "d"  # in order
    assert missing("a b", "a b c") is not None  # a whole line, not a part of one


def test_every_relative_link_and_file_named_exists() -> None:
    text = TOUR.read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    broken = [t for t in links if "://" not in t and not (TOUR.parent / t).exists()]
    named = re.findall(r"`((?:snerd|sim|tests|docs|jepsen-lite)/[\w./-]*)`", text)
    absent = [p for p in named if not (ROOT / p).exists()]
    assert links and named
    assert not broken and not absent, f"broken links {broken}, absent files {absent}"


@cache
def definitions() -> dict[str, set[str]]:
    """Every class of snerd/ and sim/ by name, with the names defined in its body (methods,
    properties, fields, enum members), merged over classes of one name."""
    found: dict[str, set[str]] = {}
    for top in ("snerd", "sim"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ClassDef):
                    continue
                members = found.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members.update(t.id for t in item.targets if isinstance(t, ast.Name))
                members.update(_self_attributes(node))
    return found


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """The attributes the methods of `cls` assign on `self` (`self.x = ...`, `self.x: T = ...`)."""
    names = set()
    for node in ast.walk(cls):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def test_every_class_and_member_named_exists() -> None:
    text = TOUR.read_text()
    prose = _FENCE.sub("", text)  # (the blocks are checked by running them)
    classes = definitions()
    wrong = []
    for name in sorted(set(re.findall(r"`([A-Z]\w*[a-z]\w*)(?:\.(\w+))?[`(]", prose))):
        cls, member = name
        if hasattr(builtins, cls):
            continue  # (`False`, `None`: a value, not a name to look up)
        if cls not in classes or (member and member not in classes[cls]):
            wrong.append(f"{cls}.{member}" if member else cls)
    assert not wrong, f"named in docs/tour.md, defined nowhere in snerd/ or sim/: {wrong}"


def test_the_venv_prefix_is_resolved_for_this_interpreter() -> None:
    # The tour's commands say `.venv/bin/python`; here that is this interpreter.
    assert (BIN / Path(sys.executable).name).exists()
    assert os.access(BIN / Path(sys.executable).name, os.X_OK)
