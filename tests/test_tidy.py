"""Style rules kept as a test (TigerBeetle's `tidy.zig`): what review alone lets slip.

No production module imports another module's `_private` name. A leading underscore says "not
part of this module's interface"; importing it from elsewhere ties two modules together
through a name the first may change at will, and hides a seam that wants a public name (or a
move).

No import cycle anywhere: the contracts in pyproject.toml order the layers, and within a layer
no two modules import each other in a ring at run time (a ring makes the import order matter
and hides which module is the lower one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = [ROOT / "snerd", ROOT / "sim", ROOT / "jepsen-lite" / "jepsen_lite"]

#: Imports of private names still to be given a public name, each with the move that ends it:
#: (file, imported name). Remove an entry with its move (a stale one fails), and add none.
KNOWN: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) for each `from module import _name` and `import a._b` in the file
    at `path` (function-level imports and `if TYPE_CHECKING:` ones included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [(module, a.name, node.lineno) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            found += [
                (a.name, part, node.lineno)
                for a in node.names
                for part in a.name.split(".")
                if _private(part)
            ]
    return found


def test_no_production_module_imports_another_modules_private_name() -> None:
    offences, seen = [], set()
    for top in PRODUCTION:
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for module, name, line in private_imports(path):
                seen.add((rel, name))
                if (rel, name) not in KNOWN:
                    offences.append(f"{rel}:{line}: {name} from {module}")
    assert not offences, "private names imported from another module:\n" + "\n".join(offences)
    assert not KNOWN - seen, f"no longer imported, delete from KNOWN: {sorted(KNOWN - seen)}"


def import_cycles(*packages: str) -> list[list[str]]:
    """The groups of modules of `packages` that import each other in a ring at run time
    (imports under `if TYPE_CHECKING:` left out: they run only in the type checker)."""
    import grimp  # import-linter's own graph builder

    graph = grimp.build_graph(
        *packages, include_external_packages=False, exclude_type_checking_imports=True
    )
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    rings: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            ring = []
            while not ring or ring[-1] != module:
                ring.append(stack.pop())
            if len(ring) > 1:
                rings.append(sorted(ring))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return rings


def test_no_import_cycle_anywhere() -> None:
    assert import_cycles("snerd", "sim") == []
