"""Every tensor and module a notebook, solution or grader creates on the ranks goes
on ``mt.device()`` (issue 11, item 1): on a GPU node ``mt.launch`` picks NCCL,
which refuses CPU tensors, so a lesson that builds its data on the CPU would fail
there at its first collective while passing here.

The check is static (``ast``: no kernel, no launch) and deliberately simple.

* Launched functions: the first argument of every ``launch(...)`` or
  ``<anything>.launch(...)`` call, when it is a name or ``partial(name, ...)``;
  every ``def`` of that name in the same source is checked, nested functions
  included. A notebook is one source: its code cells joined, IPython ``%`` and
  ``!`` lines left out.
* ``<device>``: a call ``mt.device()`` / ``device()``, or a name the function bound
  to one (``dev = device()``).
* A torch factory (``torch.randn``, ``torch.zeros``, ``torch.tensor``, ... see
  ``FACTORIES``; the ``*_like`` ones follow their argument) passes with a
  ``device=`` keyword; or chained straight into ``.to(<device>)`` (the form for a
  draw from a CPU ``generator=``: ``torch.randn(3, generator=g).to(mt.device())``);
  or assigned to a name that a later line rebinds, ``x = x.to(<device>)`` (tuple
  assignments too: ``x, y = x.to(dev), y.to(dev)``).
* A module construction (``GPT(...)``/``mt.GPT(...)``, or an ``nn.``/``torch.nn.``
  layer with parameters, see ``MODULES``) passes with a ``device=`` keyword; or a
  ``.to(<device>)`` anywhere in the chain that starts at it
  (``mt.GPT(cfg).double().to(mt.device()).blocks[0]``, ``.to(mt.device(), dtype)``);
  or, when that chain is assigned to a name, a later ``name.to(<device>)`` in the
  same function (``Module.to`` moves in place).

Not covered, so moved by hand: tensors that reach a launched function as
arguments or globals, and helpers it calls.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FACTORIES = {"randn", "rand", "randint", "zeros", "ones", "full", "empty", "arange", "tensor",
             "eye", "linspace", "logspace", "randperm", "as_tensor", "normal", "bernoulli",
             "tril_indices", "triu_indices"}
MODULES = {"Linear", "Bilinear", "Embedding", "EmbeddingBag", "LayerNorm", "RMSNorm",
           "GroupNorm", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d", "MultiheadAttention",
           "GRU", "LSTM", "RNN"}


# --------------------------------------------------------------------------- sources
def notebook_source(cells: list[dict]) -> tuple[str, list[str]]:
    """A notebook's code cells as one Python source (``%``/``!`` lines blanked), and
    for each of its lines where it came from ("cell 5, line 3", both from 1)."""
    lines, places = [], []
    for number, cell in enumerate(cells, 1):
        if cell["cell_type"] != "code":
            continue
        for index, line in enumerate("".join(cell["source"]).splitlines(), 1):
            lines.append("" if line.lstrip().startswith(("%", "!")) else line)
            places.append(f"cell {number}, line {index}")
    return "\n".join(lines), places


def course_sources() -> list[tuple[str, str, list[str] | None]]:
    """(name, source, places) for every notebook, solution and grader."""
    out = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        out.append((str(path.relative_to(ROOT)), *notebook_source(cells)))
    for path in [*sorted((ROOT / "solutions").glob("*.py")),
                 *sorted((ROOT / "minitp" / "checks").glob("*.py"))]:
        out.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), None))
    return out


# --------------------------------------------------------------------------- the checker
def _launched_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        if not ((isinstance(func, ast.Name) and func.id == "launch")
                or (isinstance(func, ast.Attribute) and func.attr == "launch")):
            continue
        first = node.args[0]
        if (isinstance(first, ast.Call) and first.args
                and "partial" in (getattr(first.func, "id", None),
                                  getattr(first.func, "attr", None))):
            first = first.args[0]
        if isinstance(first, ast.Name):
            names.add(first.id)
    return names


def _is_device_call(node: ast.AST) -> bool:
    """``mt.device()`` or ``device()``."""
    return (isinstance(node, ast.Call) and not node.args
            and ((isinstance(node.func, ast.Name) and node.func.id == "device")
                 or (isinstance(node.func, ast.Attribute) and node.func.attr == "device"
                     and isinstance(node.func.value, ast.Name))))


def _device_names(fn: ast.AST) -> set[str]:
    """Names ``fn`` binds to ``device()``: ``dev = device()``, ``axis, dev = world(), device()``."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name, value in _pairs(target, node.value):
                    if _is_device_call(value):
                        names.add(name)
    return names


def _pairs(target: ast.AST, value: ast.AST):
    """(name, value) for ``a = v`` and for ``a, b = v, w``."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
          and len(target.elts) == len(value.elts)):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from _pairs(t, v)


def _is_to_device(node: ast.AST, devices: set[str]) -> bool:
    """``<something>.to(...)`` with a ``<device>`` among its arguments."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "to"):
        return False
    return any(_is_device_call(a) or (isinstance(a, ast.Name) and a.id in devices)
               for a in [*node.args, *(k.value for k in node.keywords)])


def _factory_name(call: ast.Call) -> str | None:
    f = call.func
    if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch"
            and f.attr in FACTORIES):
        return f"torch.{f.attr}"
    return None


def _module_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name) and f.id == "GPT":
        return "GPT"
    if isinstance(f, ast.Attribute):
        owner = ast.unparse(f.value)
        if f.attr == "GPT" and owner in ("mt", "minitp"):
            return f"{owner}.GPT"
        if f.attr in MODULES and owner in ("nn", "torch.nn"):
            return f"{owner}.{f.attr}"
    return None


def _chain(node: ast.AST, parents: dict) -> list[ast.AST]:
    """What is chained onto ``node``: for ``node.a(1)[0]``, ``.a``, ``.a(1)``, ``[0]``."""
    out = []
    while True:
        parent = parents.get(node)
        if not ((isinstance(parent, ast.Attribute) and parent.value is node)
                or (isinstance(parent, ast.Call) and parent.func is node)
                or (isinstance(parent, ast.Subscript) and parent.value is node)):
            return out
        node = parent
        out.append(node)


def _assigned_name(node: ast.AST, parents: dict) -> str | None:
    """``name`` when ``node`` is the whole right-hand side of ``name = node``, or one
    element of ``a, name = ..., node``."""
    parent = parents.get(node)
    if isinstance(parent, ast.Tuple):
        assign = parents.get(parent)
        if isinstance(assign, ast.Assign) and assign.value is parent:
            for target in assign.targets:
                for name, value in _pairs(target, parent):
                    if value is node:
                        return name
        return None
    if isinstance(parent, ast.Assign) and parent.value is node:
        names = [n for t in parent.targets for n, v in _pairs(t, node)]
        return names[0] if len(names) == 1 else None
    return None


def _moves(fn: ast.AST, devices: set[str], parents: dict) -> tuple[dict, dict]:
    """Lines of ``name.to(<device>)`` in ``fn``: all of them, and those rebinding ``name``."""
    moved, rebound = {}, {}
    for node in ast.walk(fn):
        if _is_to_device(node, devices) and isinstance(node.func.value, ast.Name):
            name = node.func.value.id
            moved.setdefault(name, []).append(node.lineno)
            if _assigned_name(node, parents) == name:
                rebound.setdefault(name, []).append(node.lineno)
    return moved, rebound


def check_source(source: str, where: str, places: list[str] | None = None) -> list[str]:
    """One line per tensor or module a launched function creates off ``mt.device()``:
    ``file, place: function: what``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    launched = _launched_names(tree)
    findings = []
    for fn in ast.walk(tree):
        if not (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in launched):
            continue
        devices = _device_names(fn)
        moved, rebound = _moves(fn, devices, parents)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            chain = _chain(node, parents)
            end = chain[-1] if chain else node
            target = _assigned_name(end, parents)
            if name := _factory_name(node):
                if (name.endswith("_like") or any(k.arg == "device" for k in node.keywords)
                        or (len(chain) > 1 and _is_to_device(chain[1], devices))
                        or any(line > node.lineno for line in rebound.get(target, []))):
                    continue
                problem = f"{name}(...) without device=mt.device()"
            elif name := _module_name(node):
                if (any(k.arg == "device" for k in node.keywords)
                        or any(_is_to_device(c, devices) for c in chain)
                        or any(line > node.lineno for line in moved.get(target, []))):
                    continue
                problem = f"{name}(...) not moved with .to(mt.device())"
            else:
                continue
            place = places[node.lineno - 1] if places else f"line {node.lineno}"
            findings.append(f"{where}, {place}: {fn.name}: {problem}")
    return findings


def course_findings() -> list[str]:
    return [f for name, source, places in course_sources()
            for f in check_source(source, name, places)]


# --------------------------------------------------------------------------- the tests
BAD = '''
import torch, minitp as mt
from torch import nn

def on_ranks(cfg, n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64)
    y = torch.randint(0, 5, (2, 3), generator=g)
    model = mt.parallelize(mt.GPT(cfg).double(), mt.Mesh(tp=2))
    lin = nn.Linear(3, 4)
    ln = torch.nn.LayerNorm(3)
    same = torch.zeros_like(x)
    y.to(mt.device())  # a tensor's .to is not in place: y stays on the CPU

    def inner():
        return torch.arange(n)
    return inner()

def not_launched():
    return torch.randn(3), mt.GPT(None)

mt.launch(on_ranks, 2, None, 3)
'''

GOOD = '''
import functools, torch, minitp as mt
from torch import nn
from minitp.runtime._device import device

def on_ranks(cfg, n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64, device=mt.device())
    y = torch.randint(0, 5, (2, 3), generator=g).to(mt.device())
    model = mt.parallelize(mt.GPT(cfg).double().to(mt.device()), mt.Mesh(tp=2))
    block = mt.GPT(cfg).to(mt.device(), torch.float64).blocks[0]
    lin = nn.Linear(3, 4)
    lin.to(mt.device())
    ln = torch.nn.LayerNorm(3, device=device())
    same = torch.zeros_like(x)
    axis, dev = mt.world(), device()
    a = torch.ones(2, generator=g)
    b = torch.zeros(2, generator=g)
    a, b = a.to(dev), b.to(dev)

    def inner():
        return torch.arange(n, device=mt.device())
    return inner()

def also_launched():
    return torch.ones(1, device=mt.device())

mt.launch(on_ranks, 2, None, 3)
launch(functools.partial(also_launched), 2)
'''


def _what(findings):
    return sorted((f.split(": ")[2].split("(")[0], int(f.split(", line ")[1].split(":")[0]))
                  for f in findings)


def test_the_checker_flags_each_kind_of_violation_and_accepts_the_fixed_forms():
    found = check_source(BAD, "bad.py")
    assert _what(found) == [("mt.GPT", 9), ("nn.Linear", 10), ("torch.arange", 16),
                            ("torch.nn.LayerNorm", 11), ("torch.randint", 8),
                            ("torch.randn", 7)], found
    assert all(": on_ranks: " in f for f in found), found  # not_launched is not checked
    assert check_source(GOOD, "good.py") == []
    # a move before the construction does not count
    late = GOOD.replace("    lin = nn.Linear(3, 4)\n    lin.to(mt.device())\n",
                        "    lin = None\n    lin.to(mt.device())\n    lin = nn.Linear(3, 4)\n")
    assert _what(check_source(late, "late.py")) == [("nn.Linear", 14)]
    # in a notebook: every code cell, IPython lines skipped, the place named by cell
    cells = [{"cell_type": "code", "source": ["%matplotlib inline\n", "!ls\n", "import torch"]},
             {"cell_type": "markdown", "source": ["# a title"]},
             {"cell_type": "code", "source": ["def f():\n", "    return torch.ones(1)\n",
                                              "mt.launch(f, 2)"]}]
    source, places = notebook_source(cells)
    assert check_source(source, "nb.ipynb", places) == [
        "nb.ipynb, cell 3, line 2: f: torch.ones(...) without device=mt.device()"]


def test_no_notebook_solution_or_grader_creates_on_the_ranks_off_the_device():
    start = time.perf_counter()
    sources = course_sources()
    findings = [f for name, source, places in sources for f in check_source(source, name, places)]
    seconds = time.perf_counter() - start
    for line in findings:
        print(line)
    assert sum(name.endswith(".ipynb") for name, _, _ in sources) >= 13
    assert sum("launch(" in source for _, source, _ in sources) >= 10  # not vacuous
    assert not findings, (f"{len(findings)} tensors or modules created on the ranks off "
                          "mt.device():\n" + "\n".join(findings))
    print(f"the scan took {seconds:.2f} s")  # a figure, not an assertion: timing is bench/'s
