"""Record the figures lessons 01, 07 and 16 show beside their CPU measurements, on this node.

    python bench/gpu_figures.py                  # -> bench/results/figures-<device>.json
    python bench/gpu_figures.py --quick          # everything shrunk: ~20 s on a 2-core CPU
    python bench/gpu_figures.py --out my.json    # somewhere else

Run it on a GPU node (an instructor before class, say) and commit the JSON it
writes: the lessons then show its figures, labelled with the device and the
date (`minitp.course.labs.gpu_figures`). Where ranks run follows `mt.launch`'s device
rule (`minitp.runtime._device.choose_backend`): NCCL with rank r on cuda:r when the node
has at least as many GPUs as the run has ranks, else gloo on the CPU. The code
is the same either way, and every measurement records the backend and device it
actually ran on: on a one-GPU node the one-rank runs are GPU figures and the
multi-rank ones CPU figures, and the lessons show only the former.

What is measured, each the way its lesson measures it (the functions imported,
not copied):

* 01: all-reduce time against message size, fitted to t = α + n·β, per world size
  2 .. min(8, ranks this node can run): `minitp.course.doctor`'s probe (the best of the
  repeats, each the slowest rank's time) and `fit_alpha_beta`;
* 07: forward + backward time of lesson 07's GPT (s 128, b 2, h 64, a 8, 2 layers,
  dropout 0.1, float32) with no / selective / full recomputation at t = 1, and
  lesson 07's five settings (TP, +SP, +selective, both, full) at t = 2: the
  models take turns (`minitp.course.labs.step_timing.step_seconds`), the median step;
* 16: a tensor-parallel training step (Adam) of lesson 16's shrunk Megatron-LM
  family at t = 1, 2, 4, 8 as far as the node allows (`scaling.measure_tp`):
  the fastest step and its share in collectives.

Every launch has a timeout; progress is printed as each measurement ends.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import minitp as mt
from minitp.course.doctor import ALL_REDUCE_BYTES, REPEATS, _all_reduce_probe, collective_seconds
from minitp.course.labs import scaling
from minitp.course.labs.step_timing import step_seconds
from minitp.course.viz.collectives import fit_alpha_beta
from minitp.runtime import _device

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT_S = 120.0  # per launch: a rank stuck this long in a collective ends the run

# Lesson 01: the doctor's sizes, and larger ones so that a GPU's β is resolved.
SIZES = {False: (*ALL_REDUCE_BYTES, 16 << 20, 64 << 20), True: ALL_REDUCE_BYTES}
# Lesson 07's model, micro-batch and settings (cells "Memory, compute and time").
CFG_07 = mt.GPTConfig(vocab_size=256, seq_len=128, n_layer=2, n_head=8, d_model=64, dropout=0.1)
MICRO_BATCH_07 = 2
SETTINGS_07 = {
    1: {"no recompute": (False, None), "selective": (False, "selective"),
        "full recompute": (False, "full")},
    2: {"TP": (False, None), "TP + SP": (True, None), "TP + selective": (False, "selective"),
        "TP + SP + selective": (True, "selective"), "full recompute": (False, "full")},
}
# Lesson 16's shrunk family and batch.
SHRINK_16 = dict(head_dim=16, head_divisor=2, layer_divisor=8, vocab_size=256, seq_len=64)
BATCH_16 = 8


# --------------------------------------------------------------------------- the node
def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def max_ranks() -> int:
    """Ranks this node can run at once, at most 8: one per GPU, or one per core."""
    return min(8, max(gpus(), os.cpu_count() or 1))


def placement(world: int) -> tuple[str, str]:
    """(backend, rank 0's device) that `mt.launch`'s rule gives a run of ``world`` ranks here."""
    backend, _ = _device.choose_backend("auto", world, gpus(),
                                        dist.is_available() and dist.is_nccl_available())
    return backend, _rank0_device(backend)


def _rank0_device(backend: str) -> str:
    return "cuda:0" if backend == "nccl" else "cpu"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    nccl = None
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "python": platform.python_version()}


# --------------------------------------------------------------------------- lesson 01
def figure_01(quick: bool) -> list[dict]:
    sizes, repeats = SIZES[quick], 3 if quick else REPEATS
    worlds = [2] if quick else list(range(2, max(2, max_ranks()) + 1))
    rows = []
    for world in worlds:
        run = mt.launch(_all_reduce_probe, world, sizes, repeats, timeout=TIMEOUT_S)
        if not all(r["correct"] for r in run):
            raise RuntimeError(f"all-reduce on {world} ranks ({run.backend}) gave a wrong sum")
        seconds = [collective_seconds([r["seconds"][i] for r in run]) for i in range(len(sizes))]
        fit = fit_alpha_beta(sizes, seconds)
        rows.append({"world": world, "backend": run.backend,
                     "device": _rank0_device(run.backend),
                     "bytes": list(sizes), "seconds": seconds,
                     "alpha_s": fit.alpha, "beta_s_per_byte": fit.beta})
        print(f"[01] all-reduce, world {world} ({run.backend}): {fit}", flush=True)
    return rows


# --------------------------------------------------------------------------- lesson 07
def _recompute_steps(cfg, settings, micro_batch, rounds):
    """On every rank: lesson 07's models, one per setting, timed in turn."""
    mesh = mt.Mesh(tp=mt.world().size)
    torch.manual_seed(0)
    ref = mt.GPT(cfg).to(mt.device())
    x = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len), device=mt.device())
    y = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len), device=mt.device())
    models = {name: mt.parallelize(ref, mesh, sequence_parallel=sp, recompute=rc)
              for name, (sp, rc) in settings.items()}
    step_seconds(models, x, y, mesh.tp, 1)  # warm-up: first allocations, kernels loaded
    return {"device": str(mt.device()), "times": step_seconds(models, x, y, mesh.tp, rounds)}


def figure_07(quick: bool) -> list[dict]:
    rounds = 2 if quick else 7
    rows = []
    for tp, settings in SETTINGS_07.items():
        if tp > max_ranks():
            continue
        run = mt.launch(_recompute_steps, tp, CFG_07, settings, MICRO_BATCH_07, rounds,
                        timeout=TIMEOUT_S)
        for name, (sp, rc) in settings.items():
            # a step lasts as long as its slowest rank
            slowest = [max(r["times"][name][i] for r in run) for i in range(rounds)]
            rows.append({"tp": tp, "setting": name, "sequence_parallel": sp, "recompute": rc,
                         "backend": run.backend, "device": run[0]["device"],
                         "seconds": statistics.median(slowest), "all_seconds": slowest})
            print(f"[07] t = {tp}, {name} ({run.backend}): "
                  f"{rows[-1]['seconds'] * 1e3:.2f} ms per forward + backward", flush=True)
    return rows


# --------------------------------------------------------------------------- lesson 16
def figure_16(quick: bool) -> list[dict]:
    sizes = [t for t in ((1, 2) if quick else (1, 2, 4, 8)) if t <= max_ranks()]
    rows = []
    for tp in sizes:
        cfg = scaling.megatron_family(tp, **SHRINK_16)
        backend, device = placement(tp)  # the rule measure_tp's launch follows
        (split,) = scaling.measure_tp([cfg], tp, batch=BATCH_16, steps=2 if quick else 5,
                                      timeout=TIMEOUT_S)
        rows.append({"tp": tp, "d_model": cfg.d_model, "n_layer": cfg.n_layer,
                     "batch": BATCH_16, "backend": backend, "device": device,
                     "seconds": split.seconds, "comm_seconds": split.comm_seconds,
                     "comm_share": split.comm_share, "all_seconds": list(split.all_seconds)})
        print(f"[16] {split} ({backend})", flush=True)
    return rows


# --------------------------------------------------------------------------- the record
def record(quick: bool, argv: list[str]) -> dict:
    figures = {"01": figure_01(quick), "07": figure_07(quick), "16": figure_16(quick)}
    on_gpu = any(row["device"].startswith("cuda") for rows in figures.values() for row in rows)
    return {
        "script": "bench/gpu_figures.py",
        "command": shlex.join(["python", *argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_kind": "cuda" if on_gpu else "cpu",
        "device_name": torch.cuda.get_device_name(0) if on_gpu else cpu_model(),
        "gpus": gpus(), "cpus": os.cpu_count(), "quick": quick, **versions(),
        "figures": figures,
    }


def default_out(rec: dict) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", rec["device_name"].lower()).strip("-")
    prefix = "" if rec["device_kind"] == "cuda" else "cpu-"
    return RESULTS / f"figures-{prefix}{slug}.json"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON to write (default bench/results/figures-<device>.json)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes, ranks and repeats: a check that it runs, not figures")
    args = parser.parse_args(argv[1:])
    rec = record(args.quick, argv)
    out = args.out or default_out(rec)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} ({rec['device_kind']}: {rec['device_name']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
