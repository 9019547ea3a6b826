"""The peak FLOP/s that model FLOPs utilisation (MFU) divides by.

A GPU's peak comes from a table of datasheet figures (dense, no sparsity), looked
up by the device's name and the dtype its matrix multiplies run in: a vendor's
number, not a measurement, and said so. A CPU has no such table, so its peak is
*measured*: the fastest of a few square matrix multiplies in this process, with
all its threads (the best this machine did, as a datasheet's peak is the best the
chip can do). Ranks on one CPU share its cores, so a CPU's peak is the machine's,
counted once; a GPU's is per GPU, counted once per rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Dense FLOP/s per GPU by (name fragment, dtype), from the vendors' datasheets (SXM
# parts). float32 is the non-tensor-core figure: PyTorch leaves TF32 off for matmuls.
GPU_PEAKS = {
    ("H100", "bfloat16"): 989e12, ("H100", "float16"): 989e12, ("H100", "float32"): 67e12,
    ("H200", "bfloat16"): 989e12, ("H200", "float16"): 989e12, ("H200", "float32"): 67e12,
    ("A100", "bfloat16"): 312e12, ("A100", "float16"): 312e12, ("A100", "float32"): 19.5e12,
    ("V100", "float16"): 125e12, ("V100", "float32"): 15.7e12,
}
CPU_MATMUL_SIZE = 512
CPU_REPEATS = 8


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of one device
    devices: int  # how many of them the run had: GPUs, or 1 for a shared CPU
    source: str  # where the number comes from, in words

    @property
    def total(self) -> float:
        return self.flops * self.devices


def gpu_peak(name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak of GPU ``name`` in ``dtype``; None when not tabled."""
    dtype_name = str(dtype).removeprefix("torch.")
    for (fragment, tabled), flops in GPU_PEAKS.items():
        if fragment in name and tabled == dtype_name:
            return flops
    return None


def measure_cpu_peak(dtype: torch.dtype = torch.float32, size: int = CPU_MATMUL_SIZE,
                     repeats: int = CPU_REPEATS) -> float:
    """FLOP/s of the fastest of ``repeats`` (size × size) matrix multiplies here, by
    ``torch.mm`` and by ``F.linear``, the best of both: on a CPU without native bf16
    instructions the two reach different kernels (measured on an AVX2 machine:
    bf16 ``mm`` ~1 GFLOP/s, bf16 ``linear`` several times faster), and a model's
    layers run through ``F.linear``."""
    a, b = (torch.randn(size, size, dtype=dtype) for _ in range(2))
    best = float("inf")
    for multiply in (torch.mm, torch.nn.functional.linear):
        multiply(a, b)  # warm: threads started, buffers allocated
        for _ in range(repeats):
            start = time.perf_counter()
            multiply(a, b)
            best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best


def peak(on_gpus: bool, ranks: int, dtype: torch.dtype) -> Peak | None:
    """The peak a run of ``ranks`` ranks in ``dtype`` is measured against; None for
    a GPU the table does not know (then no MFU is reported rather than a guess)."""
    if on_gpus:
        name = torch.cuda.get_device_name()
        flops = gpu_peak(name, dtype)
        if flops is None:
            return None
        return Peak(flops, ranks, f"datasheet: {name}, dense {str(dtype).removeprefix('torch.')}")
    flops = measure_cpu_peak(dtype)
    return Peak(flops, 1, f"measured here: the fastest {CPU_MATMUL_SIZE}x{CPU_MATMUL_SIZE} "
                          f"{str(dtype).removeprefix('torch.')} matmul (mm or linear) on this "
                          "CPU, all its cores (the ranks share them)")
