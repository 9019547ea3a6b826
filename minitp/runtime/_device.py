"""The device this rank computes on: cuda:r under NCCL, the CPU under gloo.

The launcher sets it as a rank starts; `mt.device()` reads it.
"""

from __future__ import annotations

import torch

_current = torch.device("cpu")


def set_current(device: torch.device) -> None:
    global _current
    _current = torch.device(device)


def device() -> torch.device:
    """Where this rank's tensors belong (allocate with ``device=mt.device()``)."""
    return _current


# --------------------------------------------------------------------------- the device rule
def synchronize(where: torch.device) -> None:
    """Wait until `where` has finished what was queued on it: CUDA runs kernels
    asynchronously, so a timer stopped without this measures only their launch.
    A CPU has nothing queued."""
    if where.type == "cuda":
        torch.cuda.synchronize(where)


def choose_backend(requested: str, local_ranks: int, gpus: int,
                   nccl_available: bool) -> tuple[str, str]:
    """The one rule for where ranks run: ``(backend, why)``.

    "auto": NCCL with rank r on cuda:r when this node sees at least as many GPUs as
    it runs ranks (and NCCL is built in), else gloo with every rank on the CPU —
    never two ranks on one GPU, never "invalid device ordinal". ``why`` is one line
    a learner can read; it is worth saying only when a GPU is there but unused.
    """
    if requested not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {requested!r}")
    enough = gpus >= local_ranks and nccl_available
    if requested == "nccl" and not enough:
        has = f"this node sees {gpus}" + ("" if nccl_available else " and torch has no NCCL")
        raise ValueError(
            f"backend='nccl' puts one rank on each GPU, so {local_ranks} ranks on a node need "
            f"{local_ranks} GPUs; {has}. Use backend='gloo' (CPU), fewer ranks, or torchrun "
            "across nodes")
    if requested == "gloo":
        return "gloo", "gloo on the CPU, as asked"
    if enough:
        return "nccl", f"NCCL: {local_ranks} ranks on {gpus} GPUs, rank r on cuda:r"
    if gpus == 0:
        return "gloo", "gloo on the CPU: no CUDA device"
    return "gloo", (f"gloo on the CPU: {local_ranks} ranks on this node but {gpus} GPU"
                    f"{'s' if gpus != 1 else ''}" + ("" if nccl_available else " (no NCCL)")
                    + "; one rank per GPU, so the GPUs stay unused")


def process_group_backend(backend: str) -> str:
    """What to hand init_process_group: under NCCL, gloo too for CPU tensors (a
    checkpoint's bookkeeping, an object gather), where the installed torch allows it."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
