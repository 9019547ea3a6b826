"""``python -m minitp.course.doctor``: what an instructor runs on the node before class.

    python -m minitp.course.doctor                  # every check, a table, a verdict
    python -m minitp.course.doctor --max-world 8    # device rule and timings up to 8 ranks
    python -m minitp.course.doctor --json           # the same, machine-readable

One table, one row per check, then a verdict; exit code 0 when the node is ready
for the course, 1 when a check failed (the row says which and why):

- versions: Python, torch, CUDA, NCCL, gloo;
- the GPUs torch sees;
- the device rule (`minitp.runtime._device.choose_backend`): for each world size, the
  backend and device `mt.launch` will choose here, and why;
- a real all-reduce on every backend this node can run, checked for the right sum;
- the α–β cost of an all-reduce per world size, *measured* here (the smallest of
  ten timed repeats per message size, each the slowest rank's time, the best
  repeat kept, fitted by `fit_alpha_beta`);
- whether every import in the course's notebooks resolves.

Nothing here is modelled: every time is a measurement on this node.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..runtime import _device
from ..runtime.launch import launch
from .paths import repo_root
from .viz.collectives import fit_alpha_beta

ALL_REDUCE_BYTES = (4 << 10, 64 << 10, 1 << 20)  # small enough for a laptop, large enough to fit β
REPEATS = 10  # the best of these is kept: a busy node disturbs some repeats, rarely all
LAUNCH_TIMEOUT_S = 60.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


# --------------------------------------------------------------------------- what runs on ranks
def _all_reduce_probe(sizes: tuple[int, ...], repeats: int) -> dict:
    """On every rank: one all-reduce checked for its sum, then each size timed."""
    device = _device.device()
    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(x)
    correct = bool((x == world * (world + 1) / 2).all())
    seconds = []  # per size, every repeat's time on this rank
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm: buffers and connections set up outside the timing
        times = []
        for _ in range(repeats):
            dist.barrier()
            _device.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(x)
            _device.synchronize(device)
            times.append(time.perf_counter() - start)
        seconds.append(times)
    return {"correct": correct, "seconds": seconds}


def collective_seconds(per_rank: list[list[float]]) -> float:
    """One size's time from every rank's repeats: a collective ends when its slowest rank does,
    so each repeat counts as its slowest rank's time; the best repeat is the one least
    disturbed by whatever else the node was running."""
    return min(max(repeat) for repeat in zip(*per_rank, strict=True))


# --------------------------------------------------------------------------- the checks
def _gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [f"{torch.cuda.get_device_name(i)} "
            f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
            for i in range(torch.cuda.device_count())]


def check_versions() -> Check:
    nccl = "none"
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    detail = (f"Python {platform.python_version()}, torch {torch.__version__}, "
              f"CUDA {torch.version.cuda or 'none'}, NCCL {nccl}, "
              f"gloo {'yes' if dist.is_gloo_available() else 'NO'}")
    return Check("versions", dist.is_available() and dist.is_gloo_available(), detail)


def check_gpus() -> Check:
    gpus = _gpus()
    detail = f"{len(gpus)}: " + "; ".join(gpus) if gpus else "none: every rank runs on the CPU"
    return Check("GPUs", True, detail)


def check_device_rule(worlds: list[int]) -> Check:
    gpus = len(_gpus())
    lines = []
    for world in worlds:
        backend, why = _device.choose_backend("auto", world, gpus, dist.is_nccl_available())
        lines.append(f"world {world}: {backend} ({why})")
    return Check("device rule", True, "\n".join(lines))


def check_all_reduce(worlds: list[int]) -> tuple[list[Check], dict]:
    """A real all-reduce and its α–β fit, per backend this node can run and world size."""
    gpus = len(_gpus())
    checks, fits = [], {}
    backends = ["gloo"] + (["nccl"] if gpus >= 2 and dist.is_nccl_available() else [])
    for backend in backends:
        for world in worlds:
            if world < 2 or (backend == "nccl" and world > gpus):
                continue
            name = f"all-reduce, {backend}, world {world}"
            try:
                run = launch(_all_reduce_probe, world, ALL_REDUCE_BYTES, REPEATS,
                             backend=backend, timeout=LAUNCH_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 - the doctor reports, never crashes
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                checks.append(Check(name, False, f"{type(error).__name__}: {first_line}"))
                continue
            if not all(r["correct"] for r in run):
                checks.append(Check(name, False, "wrong sum: the collective ran but disagreed"))
                continue
            seconds = [collective_seconds([r["seconds"][i] for r in run])
                       for i in range(len(ALL_REDUCE_BYTES))]
            fit = fit_alpha_beta(ALL_REDUCE_BYTES, seconds)
            fits[f"{backend}/{world}"] = {"bytes": list(ALL_REDUCE_BYTES), "seconds": seconds,
                                          "alpha_s": fit.alpha, "beta_s_per_byte": fit.beta}
            measured = (f"measured {fit}" if fit.beta > 0 else
                        f"measured α ≈ {fit.alpha * 1e6:.0f} µs; β not resolved (the time did "
                        "not grow with the message: a busy node?)")
            checks.append(Check(name, True, f"correct sum; {measured}"))
    return checks, fits


def notebook_imports(notebooks: Path) -> dict[str, list[str]]:
    """Top-level modules the notebooks import, each with the notebooks that do."""
    wanted: dict[str, list[str]] = {}
    for path in sorted(notebooks.glob("*.ipynb")):
        for cell in json.loads(path.read_text()).get("cells", []):
            if cell.get("cell_type") != "code":
                continue
            source = "".join(cell.get("source", []))
            # IPython's magics and shell escapes are not Python
            source = "\n".join(line for line in source.splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    users = wanted.setdefault(name.split(".")[0], [])
                    if path.name not in users:
                        users.append(path.name)
    return wanted


def check_notebook_imports(notebooks: Path) -> Check:
    if not notebooks.is_dir():
        return Check("notebook imports", True,
                     f"no notebooks at {notebooks} (an installed package, not a checkout)")
    wanted = notebook_imports(notebooks)
    missing = {m: users for m, users in wanted.items() if importlib.util.find_spec(m) is None}
    if missing:
        return Check("notebook imports", False, "; ".join(
            f"{m} (in {', '.join(users)}) is not installed"
            for m, users in sorted(missing.items())))
    return Check("notebook imports", True,
                 f"all {len(wanted)} modules resolve: {', '.join(sorted(wanted))}")


# --------------------------------------------------------------------------- report
def default_worlds(max_world: int | None) -> list[int]:
    gpus = len(_gpus())
    top = max_world if max_world is not None else max(2, min(gpus, 8))
    worlds = [1]
    while worlds[-1] * 2 <= top:
        worlds.append(worlds[-1] * 2)
    return worlds if worlds[-1] == top else worlds + [top]


def examine(max_world: int | None = None,
            notebooks: Path | None = None) -> tuple[list[Check], dict]:
    worlds = default_worlds(max_world)
    checks = [check_versions(), check_gpus(), check_device_rule(worlds)]
    reduce_checks, fits = check_all_reduce(worlds)
    checks += reduce_checks
    checks.append(check_notebook_imports(notebooks or repo_root() / "notebooks"))
    return checks, fits


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for check in checks:
        mark = "ok  " if check.ok else "FAIL"
        first, *rest = check.detail.splitlines() or [""]
        lines.append(f"{mark}  {check.name:<{width}}  {first}")
        lines += [f"      {'':<{width}}  {line}" for line in rest]
    failed = [c.name for c in checks if not c.ok]
    lines.append("")
    lines.append("verdict: ready for class" if not failed
                 else f"verdict: NOT ready: {', '.join(failed)} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minitp.course.doctor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--max-world", type=int, default=None,
                        help="largest world size to check (default: the GPUs here, at least 2)")
    parser.add_argument("--notebooks", type=Path, default=None,
                        help="the notebooks whose imports to check (default: the checkout's)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    if args.max_world is not None and not 1 <= args.max_world <= 64:
        parser.exit(2, "python -m minitp.course.doctor: --max-world must be 1..64, "
                       f"got {args.max_world}\n")
    checks, fits = examine(args.max_world, args.notebooks)
    if args.json:
        print(json.dumps({"checks": [asdict(c) for c in checks], "all_reduce": fits,
                          "ready": all(c.ok for c in checks)}, indent=1))
    else:
        print(render(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
