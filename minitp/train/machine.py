"""What this launch and machine hold, read before any process starts: torchrun or not, the
world size the flags ask for, GPUs, and whether the run's memory (a model) fits."""

from __future__ import annotations

import dataclasses
import os

import torch

from .model_flags import DTYPE


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def uses_mixed_precision(args) -> bool:
    return args.dtype == "bfloat16"


def world_size_of(args) -> int:
    return args.dp * args.pp * args.cp * args.tp


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def memory_needed(args, cfg) -> dict:
    """Bytes this run will hold, as `minitp.calc` models them (not measured):
    ``{"per_rank", "ranks", "machine"}``.

    Per rank: `calc.memory_per_gpu` with fp32 Adam (4 + 4 + 8 bytes per
    parameter; twice that in float64) and the paper's 2-byte activations scaled
    to --dtype, plus the dense CPU model every rank keeps for evaluation and
    sampling and the full state dict it copies into it (two copies of every
    parameter). On the CPU every rank shares this machine's memory, so "machine"
    is all of them plus, with --check, the single-process reference; under
    torchrun it counts this node's ranks; on GPUs only the dense copies and the
    reference stay on the host. Python's and torch's own ~0.3 GB per process
    are left out: the check is for runs that cannot fit, not a close call.
    """
    from .. import calc
    from .layout_flags import layers_per_rank_bound

    # bf16 with float32 gradients and masters: the 18-byte layout
    mixed = uses_mixed_precision(args)
    dtype = getattr(torch, args.dtype or DTYPE)  # None: left out, before `validate`
    scale = 1 if mixed else torch.tensor([], dtype=dtype).element_size() / 4
    world = world_size_of(args)
    micro = max(1, args.batch_size // (args.dp * args.microbatches))
    # an uneven --pipeline-layout: every rank charged as the busiest (calc's model is even)
    busiest = dataclasses.replace(cfg, n_layer=layers_per_rank_bound(args, cfg.n_layer))
    on_rank = calc.memory_per_gpu(busiest, micro, args.dp, args.pp, args.tp, args.sp,
                                  args.recompute, args.zero_stage,
                                  "megatron" if mixed else "adam-fp32", args.virtual_stages,
                                  args.microbatches, cp=args.cp, schedule=args.schedule,
                                  cp_comm=args.cp_comm)
    states = sum(on_rank[k] for k in ("parameters", "gradients", "optimizer"))
    per_rank = scale * (states + (1 if mixed else 2) * on_rank["activations"])
    dense = scale * 4 * 2 * calc.exact_param_count(cfg)  # float32 copies when mixed
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    host = ranks * (dense + (0 if on_gpus(world) else per_rank))
    if args.check:
        ref = calc.memory_per_gpu(cfg, args.batch_size, optimizer="adam-fp32")
        host += scale * (sum(ref[k] for k in ("parameters", "gradients", "optimizer"))
                         + 2 * ref["activations"])
    return {"per_rank": per_rank + dense, "ranks": ranks, "machine": host}


def too_big(need: dict, have: int | None, model: str, advice: str) -> str | None:
    """The one line that refuses a run whose modelled memory (`need`: ``{"per_rank",
    "ranks", "machine"}``) is more than the machine has (`have`; None: not known, never
    refused), or None. `model` says what was counted, `advice` what to make smaller."""
    if have is None or need["machine"] <= have:
        return None
    return (f"this run needs about {gib(need['per_rank'])} per rank, "
            f"{gib(need['machine'])} for its {need['ranks']} processes on this machine "
            f"({model}), but only {gib(have)} is available: {advice}")


def available_memory() -> int | None:
    """Bytes the machine can give without swapping: Linux's MemAvailable (free
    plus reclaimable cache), else free physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def on_gpus(world: int) -> bool:
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if under_torchrun() else world
    return torch.cuda.is_available() and torch.cuda.device_count() >= ranks
