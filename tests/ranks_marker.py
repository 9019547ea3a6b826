"""The `ranks` marker: every test that starts a process (ranks, a CLI run, JupyterLab, a
notebook's kernel) carries it, so that `pytest -m "not ranks"` is the developer's quick
loop (docs/testing.md).

Which tests start processes is read from their source, not kept by hand: a test is marked
when its function, a fixture it uses, or a function of its own module or of
tests/helpers.py that it calls (followed transitively) names one of `STARTERS`, or a lab. That
reading can miss a way to start one; so the other half is a guard: a test left unmarked
that starts a process anyway fails, saying so (`processes_refused`, around its setup,
call and teardown). The marker is therefore right for every test the suite runs.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import multiprocessing.process
import subprocess
from functools import cache
from pathlib import Path

import pytest

# Names whose call starts processes: the launcher, the grader, the training CLI's entry
# points, subprocesses (git's too) and a kernel; and, in a test module, whatever it
# imported from the course's labs (their experiments launch: `_lab_aliases`).
STARTERS = frozenset({
    "launch", "grade", "run_grader", "main", "train_one_process", "reference_losses",
    "subprocess", "Popen", "check_output", "check_call", "run_cli", "ExecutePreprocessor",
    "tracked_files", "activation_table", "ring_work", "start_new_kernel", "session",
})
LABS = "minitp.course.labs"
HELPERS = Path(__file__).with_name("helpers.py")


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute a piece of code mentions."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


@cache
def _functions(path: Path) -> dict[str, set[str]]:
    """name -> the names its body mentions, for every function and class a module defines
    (and every module-level name bound to an expression: ``_cli = run_cli``)."""
    tree = ast.parse(path.read_text(), str(path))
    found = {node.name: _names(node) for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, set()).update(_names(node.value))
    return found


@cache
def _lab_aliases(path: Path) -> frozenset[str]:
    """The names a test module binds to the course's labs or their functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LABS):
            found |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "minitp.course":
            found |= {a.asname or a.name for a in node.names if a.name == "labs"}
        elif isinstance(node, ast.Import):
            found |= {a.asname for a in node.names if a.name.startswith(LABS) and a.asname}
    return frozenset(found)


def _starts_processes(path: Path, names: set[str]) -> bool:
    local = {**_functions(HELPERS), **_functions(path)}
    seen: set[str] = set()
    todo = set(names)
    while todo:
        name = todo.pop()
        if name in STARTERS or name in _lab_aliases(path):
            return True
        if name in local and name not in seen:
            seen.add(name)
            todo |= local[name]
    return False


def mark_ranks(items) -> None:
    """pytest_collection_modifyitems: mark every item that starts processes."""
    for item in items:
        if not isinstance(item, pytest.Function):  # a notebook's cells run in a kernel
            item.add_marker(pytest.mark.ranks)
            continue
        path = Path(inspect.getsourcefile(item.function) or item.path)
        names = _names(ast.parse(inspect.getsource(item.function).lstrip()))
        names |= set(item.fixturenames)
        if _starts_processes(path, names):
            item.add_marker(pytest.mark.ranks)


@contextlib.contextmanager
def processes_refused(item):
    """Around each phase of a test without the marker (its fixtures' setup included, a
    module's too): starting a process fails it, since the reading above missed a
    starter and the quick loop would run it."""
    if item.get_closest_marker("ranks"):
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{item.nodeid} starts a process but is not marked 'ranks': add "
                             "the function that starts it to STARTERS in tests/ranks_marker.py")

    saved = multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__
    multiprocessing.process.BaseProcess.start = subprocess.Popen.__init__ = refuse
    try:
        yield
    finally:
        multiprocessing.process.BaseProcess.start, subprocess.Popen.__init__ = saved
