"""The public surface of `snerd` and of the `snerd.sdk` modules, pinned (in the manner of trio's
`test_exports.py`): a name lost or added fails here, so a change of the API is a decision
written down in this file, not the side effect of a move.

`snerd` resolves its names lazily (PEP 562), so the test checks both views of it: what a type
checker sees (the `if TYPE_CHECKING:` imports) and what runs (the lazy table, `__all__`, `dir`).
Each `snerd.sdk` module lists its public names in `__all__`; every name it defines without a
leading underscore must be listed, and nothing else.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import snerd

#: `snerd.__all__`: the faces, their errors and values, and the handler-side functions.
SNERD_PUBLIC = [
    "Cancelled",
    "ConfigError",
    "ControlError",
    "DaemonExited",
    "DataDirectoryError",
    "DuplicateTaskId",
    "Engine",
    "EnqueueError",
    "Enqueued",
    "FinalError",
    "Paused",
    "Producer",
    "QueueNotRunning",
    "Retried",
    "ScheduleError",
    "Scheduled",
    "SnerdError",
    "SnerdQueue",
    "Swept",
    "TaskDetails",
    "TaskFailed",
    "TaskFunction",
    "TaskInfo",
    "current_task",
    "producer",
    "yield_progress",
]

#: Each `snerd.sdk` module's `__all__`.
SDK_PUBLIC = {
    "snerd.sdk.bulk": ["BulkEnqueue"],
    "snerd.sdk.control": ["JobControl", "REPLY_ACTIONS"],
    "snerd.sdk.context": [
        "CURRENT_ATTEMPT",
        "RunningAttempt",
        "TaskInfo",
        "current_task",
        "yield_progress",
    ],
    "snerd.sdk.errors": [
        "ControlError",
        "DaemonExited",
        "DuplicateTaskId",
        "EnqueueError",
        "FinalError",
        "QueueNotRunning",
        "ScheduleError",
        "SnerdError",
        "TaskFailed",
    ],
    "snerd.sdk.face": [
        "EXIT_GRACE_S",
        "ProgressCallback",
        "QueueFace",
        "drain_timeout_from_env",
        "env_overrides",
        "result_max_bytes_from_env",
    ],
    "snerd.sdk.messages": [
        "Cancelled",
        "ENQUEUE_ARGS",
        "Enqueued",
        "FINISHED_STATES",
        "Paused",
        "ReplyKey",
        "Retried",
        "SCHEDULE_OPTIONS",
        "Scheduled",
        "Swept",
        "TaskDetails",
        "batch_message",
        "build_enqueue_message",
        "build_schedule_message",
        "build_unschedule_message",
        "cancelled_from_reply",
        "check_control_message",
        "control_message",
        "describe_error",
        "details_from_reply",
        "enqueue_call_message",
        "enqueued_from_ack",
        "json_text",
        "parse_task_data",
        "pause_message",
        "paused_from_reply",
        "reply_key",
        "request_key",
        "result_message",
        "result_value",
        "retried_from_reply",
        "scheduled_from_reply",
        "sweep_message",
        "swept_from_reply",
        "task_spec_message",
    ],
    "snerd.sdk.isolation": [
        "AttemptProcessFailed",
        "ChildAttempt",
        "ISOLATIONS",
        "forkable",
        "preload",
        "run_in_process",
    ],
    "snerd.sdk.producer": ["PREFIX", "Producer", "SEGMENT_BYTES", "producer"],
    "snerd.sdk.signals": ["Signal", "Waiter", "signal_factory"],
    "snerd.sdk.tasks": ["TaskFactory", "TaskFunction", "TaskHandler", "task_options"],
    "snerd.sdk.workers": [
        "AttemptEnded",
        "DeadLetterHandler",
        "Handler",
        "HandlerWorkers",
        "is_async",
    ],
}

SDK_DIR = Path(snerd.__file__).parent / "sdk"


def _tree(module: ModuleType) -> ast.Module:
    assert module.__file__ is not None
    return ast.parse(Path(module.__file__).read_text(encoding="utf-8"))


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """Name -> module of every `from M import name` under the module's `if TYPE_CHECKING:`."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module is not None
                names.update({alias.name: stmt.module for alias in stmt.names})
    return names


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """The literal `_LAZY = {name: module}` table, as written."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_LAZY":
            table = ast.literal_eval(node.value)
            assert isinstance(table, dict)
            return table
    raise AssertionError("snerd/__init__.py has no _LAZY table")


def _defined_public_names(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level without a leading underscore."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def test_snerd_exports_exactly_the_pinned_names() -> None:
    assert snerd.__all__ == SNERD_PUBLIC  # (sorted, so a diff shows the name)


def test_every_snerd_name_resolves_to_the_object_its_module_defines() -> None:
    table = _lazy_table(_tree(snerd))
    assert sorted(table) == SNERD_PUBLIC
    for name, module_name in table.items():
        value = getattr(snerd, name)
        assert value is getattr(importlib.import_module(module_name), name), name
        assert name in dir(snerd)


def test_type_checkers_see_the_same_names_from_the_same_modules() -> None:
    tree = _tree(snerd)
    assert _type_checking_imports(tree) == _lazy_table(tree)


def test_an_unknown_snerd_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'handlers'"):
        _ = snerd.handlers  # type: ignore[attr-defined]


def test_importing_snerd_loads_neither_the_sdk_nor_its_event_loop_libraries() -> None:
    """The daemon imports `snerd.core` and `snerd.io` through this package; it must not pay
    for the SDK (the reason the names are lazy)."""
    probe = (
        "import sys, snerd; print(sorted(m for m in ('snerd.sdk', 'anyio') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_sdk_modules_are_the_pinned_ones() -> None:
    found = {f"snerd.sdk.{p.stem}" for p in SDK_DIR.glob("*.py") if p.stem != "__init__"}
    assert found == set(SDK_PUBLIC)


def test_the_sdk_package_itself_exports_nothing() -> None:
    """Its modules are imported by name; the package re-exports none of their names."""
    package = importlib.import_module("snerd.sdk")
    assert not hasattr(package, "__all__")
    assert _defined_public_names(_tree(package)) == set()


@pytest.mark.parametrize("module_name", sorted(SDK_PUBLIC))
def test_each_sdk_module_exports_exactly_the_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == SDK_PUBLIC[module_name]
    assert _defined_public_names(_tree(module)) == set(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name
