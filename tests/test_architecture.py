"""The layout's arrows run one way: every import of minitp goes down (or across) a floor.

Every module of the package is parsed (no import is executed), and every import
statement is an edge — module level and inside functions alike, since a lazy
import is still a dependency. ``from pkg import name`` is an edge to ``pkg.name``
when that is a module, else to ``pkg``. The floors are the map in
docs/repository.md; a module missing from this map fails the test, so a new
file must say where it stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minitp"

# Floor of each module (by dotted name or package prefix); lower floors never import
# higher ones. The package facade (minitp/__init__) is the roof: nothing imports it.
FLOORS = [
    (0, ["rules", "sharding.tags", "sharding.plan", "data.text", "runtime.errors",
         "runtime.io_counters", "model.routing", "model.expert_mlps",
         "tensor_parallel.weight_grad", "runtime._processes", "course.paths"]),
    (1, ["calc", "mixed_precision", "model.config", "model.attention_core", "model.cross_entropy",
         "model.kv_cache",
         "data.images", "data",
         "runtime._device", "runtime.trace", "runtime.mesh", "runtime.layout", "runtime.peak",
         "runtime._pickling",
         "runtime._signals", "runtime._run",
         "runtime._comm_buffers", "runtime._traced_op", "runtime._collective_checks",
         "runtime._flight_recorder", "runtime.chrome_trace"]),
    (2, ["runtime.comm", "runtime.comm_pending", "runtime._worker", "runtime._forkserver",
         "runtime._failure_report", "fp8.formats", "fp8.blocks"]),
    (3, ["runtime._rank_set", "runtime.launch", "runtime", "sharding", "tensor_parallel.mappings",
         "tensor_parallel.dropout", "tensor_parallel.partial_grads", "model.moe",
         "model.llama_layers", "model.vision", "fp8.scaling", "fp8.casts", "fp8.reference",
         "fp8.block_shards"]),
    (4, ["model", "tensor_parallel.layers", "tensor_parallel.loss"]),
    (5, ["fp8", "tensor_parallel", "context_parallel", "recompute", "parallel_gpt",
         "pipeline.schedules",
         "pipeline.on_paper",
         "data_parallel.grad_sync", "data_parallel.zero_stage1"]),
    # (pipeline.stages and .executor; optim: Muon inside the ZeRO optimizers)
    (6, ["pipeline", "data_parallel", "expert_parallel", "optim"]),
    (7, ["parallelize"]),
    (8, ["step", "checkpoint", "memory", "serving", "torch_parallel"]),
    # the debugging tools' library half (they run the library's steps; the grader of lesson
    # 26 draws a museum bug), below the CLI of `python -m minitp.debug`
    (9, ["course.viz", "debug.record", "debug.layout", "debug.divergence", "debug.stragglers",
         "debug.museum", "export"]),  # (export: a checkpoint to transformers and back)
    (10, ["course.labs"]),
    (11, ["course.graders", "course.make_exercises"]),
    (12, ["course", "train", "generate", "debug"]),  # the front ends: the grader, the doctor,
    # the CLIs (`python -m minitp.debug` reads the train CLI's flags)
]
ROOF = "minitp"


def _module_name(path: Path) -> str:
    parts = ["minitp", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _floor(module: str) -> int:
    if module == ROOF:
        return len(FLOORS)
    inner = module.removeprefix("minitp.")
    for floor, names in FLOORS:
        if any(inner == n or inner.startswith(n + ".") for n in names):
            return floor
    raise KeyError(f"{module} has no floor: add it to FLOORS (and to docs/repository.md)")


def _imports(module: str, path: Path) -> set[str]:
    """The minitp modules `module` imports, lazy imports included."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "minitp"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "minitp":
                continue
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                found.add(candidate if candidate in MODULES else source)
    return found - {module}


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_floor():
    for module in MODULES:
        _floor(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_or_across(module):
    for target in sorted(GRAPH[module]):
        assert target in MODULES, f"{module} imports {target}, which is not a module"
        assert _floor(target) <= _floor(module), (
            f"{module} (floor {_floor(module)}) imports {target} (floor {_floor(target)}): "
            "an arrow that runs up"
        )


def test_nothing_inside_imports_the_facade():
    for module, targets in GRAPH.items():
        assert ROOF not in targets or module == ROOF, f"{module} imports the package facade"


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def test_calc_is_pure_arithmetic():
    """The calculator imports only itself and the rules: it never pulls in the runtime."""
    for module, targets in GRAPH.items():
        if module.startswith("minitp.calc"):
            for target in targets:
                assert target.startswith(("minitp.calc", "minitp.rules")), (
                    f"{module} imports {target}")


def test_viz_reads_traces_only():
    """Pictures read what runs recorded; they import nothing that runs a model."""
    allowed = ("minitp.course.viz", "minitp.rules", "minitp.runtime.trace", "minitp.runtime.mesh",
               "minitp.runtime.layout",
               "minitp.calc")
    for module, targets in GRAPH.items():
        if module.startswith("minitp.course.viz"):
            for target in targets:
                assert target.startswith(allowed), f"{module} imports {target}"


def test_the_map_sees_a_real_edge():
    """The parser must see the edges that exist, or every test above passes vacuously."""
    assert "minitp.rules" in GRAPH["minitp.step.train"]
    assert "minitp.tensor_parallel.plan" in GRAPH["minitp.parallelize"]
    assert "minitp.calc.counts.params" in GRAPH["minitp.calc.footprint.memory"]


MAX_LINES = 300


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_is_short(module):
    """Small files with one concern: a module has at most 300 lines, with no escape
    clause, the course's included (a grader's checks by part, its run on the ranks and
    its judgements; a lab's model, its pictures, its widget)."""
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, (
        f"{module} has {lines} lines (at most {MAX_LINES}): split it by concern")


# What belongs to the course, not the library: minitp.course (the grader and its graders,
# the labs, the pictures, the exercise generator, the doctor).
def _is_course(module: str) -> bool:
    return module == "minitp.course" or module.startswith("minitp.course.")


def test_the_library_never_imports_the_course():
    """Only the course itself, the training CLI (its run directory's pictures) and the
    facade's lazy `mt.grade`/`mt.viz`/`mt.labs` may reach into minitp.course."""
    front_ends = ("minitp.course", "minitp.train", ROOF)
    for module, targets in GRAPH.items():
        if module == ROOF or module.startswith(tuple(f + "." for f in front_ends[:2])):
            continue
        reached = [t for t in targets if _is_course(t)]
        assert reached == [], f"{module} (the library) imports the course: {reached}"


def test_import_minitp_loads_no_course_module():
    """`import minitp` (and so every launched rank: the forkserver preloads it) loads the
    library only; `mt.grade`, `mt.viz` and `mt.labs` import the course on first use."""
    import subprocess
    import sys

    code = "import minitp, sys; print(*sorted(m for m in sys.modules if m.startswith('minitp')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    loaded = done.stdout.split()
    assert "minitp.runtime.launch" in loaded  # the library did load
    course = [m for m in loaded if _is_course(m)]
    assert course == [], f"import minitp loads the course: {course}"
