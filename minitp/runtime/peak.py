"""The peak FLOP/s that model FLOPs utilisation (MFU) divides by.

A GPU's peak comes from a table of datasheet figures (dense, no sparsity), looked
up by the device's name and the dtype its matrix multiplies run in: a vendor's
number, not a measurement, and said so. A CPU has no such table, so its peak is
*measured*, before any rank starts: the best FLOPs per CPU-second of ONE thread
multiplying square matrices, times the cores this process may run on. Ranks on one
CPU share its cores, so a CPU's peak is the machine's, counted once; a GPU's is per
GPU, counted once per rank.

Why one thread's CPU time, and not the wall-clock time of a matmul on all cores (the
old measurement): the wall clock counts the time other processes held the cores. On
a busy 2-core machine that measurement gave 17-24 GFLOP/s where the idle machine gives
105-202, and runs reported an MFU of 1.32 and 1.76. ``time.thread_time()`` counts only
the time the measuring thread ran, which time-slicing does not stretch. The CPU time of
a many-threaded matmul (``process_time``) would not do either: OpenMP's workers
spin-wait at each barrier, and that spinning counts as CPU time, so such a peak comes
out low by however long they spun. Hence single-threaded × cores: an upper bound on what
the cores do together (all of them at once run at a lower clock than one alone and
share memory bandwidth), so an MFU against it errs low, never above 1 by the machine's
fault. Measured on a 2-core machine of CI's kind, float32: 179-207 GFLOP/s without and
186-197 with two busy loops holding both cores (by the old wall clock: 4-207 and 3-43).

Cores: the CPUs this process may run on (``os.sched_getaffinity``), counted once per
physical core where Linux says which are SMT siblings (two hardware threads of a core
share its multiply units), and at most a cgroup's CPU quota (a container allowed 2 CPUs
of a 64-core host). A peak is believed only when its trials agree (`disagreement`):
otherwise there is no peak, and the run's MFU is null with the reason.
"""

from __future__ import annotations

import os
import statistics
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
CPU_TRIALS = 8
# Trials of one kernel whose median is more than this many times slower than their best
# do not measure one number: a clock that misattributes time, or a core whose speed moved
# while we looked. (Measured on the CI machine, idle and with both cores busy: within 1.1.)
MOST_SPREAD = 1.5
FINEST_TICK_SHARE = 0.01  # the CPU clock's tick must be under 1% of one timed multiply


@dataclass(frozen=True)
class Peak:
    flops: float | None  # FLOP/s of one device; None: not measurable here (source says why)
    devices: int  # how many of them the run had: GPUs, or 1 for a shared CPU
    source: str  # where the number comes from, in words

    @property
    def total(self) -> float | None:
        return None if self.flops is None else self.flops * self.devices


def gpu_peak(name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak of GPU ``name`` in ``dtype``; None when not tabled."""
    dtype_name = str(dtype).removeprefix("torch.")
    for (fragment, tabled), flops in GPU_PEAKS.items():
        if fragment in name and tabled == dtype_name:
            return flops
    return None


def disagreement(seconds: list[float], tick: float) -> str | None:
    """Why the CPU seconds of one kernel's trials do not measure one speed, or None
    when they do: a trial too short for the clock's tick, or the median more than
    `MOST_SPREAD` times the best."""
    best, median = min(seconds), statistics.median(seconds)
    if best <= 0 or tick > FINEST_TICK_SHARE * best:
        return (f"the thread CPU clock ticks every {tick:.2g} s, too coarse to time a "
                f"{best:.2g} s multiply")
    if median > MOST_SPREAD * best:
        return (f"the trials disagree: median {median * 1e3:.3g} ms, best {best * 1e3:.3g} ms "
                f"of CPU time (more than {MOST_SPREAD}x apart)")
    return None


def measure_core_flops(dtype: torch.dtype = torch.float32, size: int = CPU_MATMUL_SIZE,
                       trials: int = CPU_TRIALS) -> tuple[float | None, str]:
    """(FLOP/s of one core, or None; why None) from ``trials`` (size × size) multiplies
    on one thread, timed by that thread's CPU clock, by ``torch.mm`` and by ``F.linear``,
    the better of the two: on a CPU without native bf16 instructions the two reach
    different kernels (measured on an AVX2 machine: bf16 ``mm`` ~1 GFLOP/s, bf16
    ``linear`` several times faster), and a model's layers run through ``F.linear``.
    torch's thread count is set to 1 while it runs, and put back."""
    a, b = (torch.randn(size, size, dtype=dtype) for _ in range(2))
    tick = time.get_clock_info("thread_time").resolution
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the work on this thread only: see the module's docstring
    try:
        best, why = None, "no kernel measured"
        for multiply in (torch.mm, torch.nn.functional.linear):
            multiply(a, b)  # warm: buffers allocated, code paged in
            seconds = []
            for _ in range(trials):
                start = time.thread_time()
                multiply(a, b)
                seconds.append(time.thread_time() - start)
            why = disagreement(seconds, tick)
            if why is not None:
                return None, why
            best = max(best or 0.0, 2 * size ** 3 / min(seconds))
        return best, ""
    finally:
        torch.set_num_threads(threads)


def cpu_cores() -> float:
    """The cores this process may compute on: its allowed CPUs, SMT siblings counted
    once where Linux says which they are, at most a cgroup's CPU quota."""
    allowed = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else list(range(os.cpu_count() or 1)))
    cores = set()
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                cores.add(f.read().strip())
        except OSError:
            cores.add(str(cpu))  # not told: one core per CPU
    quota = _cgroup_quota()
    return min(float(len(cores)), quota) if quota else float(len(cores))


def _cgroup_quota() -> float | None:
    """CPUs' worth of time per second this process's cgroup allows (v2's cpu.max, else
    v1's cfs quota); None where none is set or found."""
    try:
        with open("/proc/self/cgroup") as f:
            v2 = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")),
                      None)
    except OSError:
        v2 = None
    limits = [_read(f"/sys/fs/cgroup{v2.rstrip('/')}/cpu.max")] if v2 is not None else []
    limits.append(" ".join(filter(None, (_read(f"/sys/fs/cgroup/cpu/cpu.cfs_{name}_us")
                                         for name in ("quota", "period")))))
    for text in filter(None, limits):
        quota, *period = text.split()
        if quota in ("max", "-1") or not period:
            return None
        return int(quota) / int(period[0])
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def peak(on_gpus: bool, ranks: int, dtype: torch.dtype) -> Peak | None:
    """The peak a run of ``ranks`` ranks in ``dtype`` is measured against; None for
    a GPU the table does not know (then no MFU is reported rather than a guess), and
    a `Peak` whose ``flops`` is None, with the reason, where a CPU's cannot be measured."""
    name = str(dtype).removeprefix("torch.")
    if on_gpus:
        device_name = torch.cuda.get_device_name()
        flops = gpu_peak(device_name, dtype)
        if flops is None:
            return None
        return Peak(flops, ranks, f"datasheet: {device_name}, dense {name}")
    per_core, why = measure_core_flops(dtype)
    if per_core is None:
        return Peak(None, 1, f"not measured: {why}")
    cores = cpu_cores()
    return Peak(per_core * cores, 1,
                f"measured here: the fastest {CPU_MATMUL_SIZE}x{CPU_MATMUL_SIZE} {name} matmul "
                f"(mm or linear) per CPU-second of one thread, {per_core / 1e9:.4g} GFLOP/s, "
                f"x {cores:g} cores (the ranks share them)")
