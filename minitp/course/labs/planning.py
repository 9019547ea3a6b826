"""Lab: the planner's model of a machine, set against the machine (lesson 17).

`minitp.calc.plan` ranks configurations by `calc.step_time`, a MODEL: FLOPs at
a fixed share of a peak, every collective an α–β ring, nothing overlapped, the
bubble (p−1)/(v·m). An automatic planner is only as right as that model of the
machine. Here we give it the best chance we can on this machine — its constants
MEASURED here, as Alpa measures its stages — and then measure what it predicts:

* `profile`: on ``world_size`` real ranks at once, the fastest FLOP/s of a 512×512
  matrix multiply (the "peak"), and all-reduce times over a range of sizes,
  fitted t = a + S·c; returned as a `calc.Cluster` (for n = 2 the ring's
  2(n−1)(α + S/(nβ)) is 2α + S/β, so α = a/2 and β = 1/c);
* `measure_steps`: real training steps of a GPT for each (dp, pp, tp), timed
  (the slowest rank's step, median over steps);
* `compare`: both, beside `calc.step_time` on the profiled cluster with
  efficiency 1 (the peak is what this machine's matmul reached).

    cluster = profile()                                  # measured constants
    rows = compare(cfg, [(2, 1, 1), (1, 2, 1), (1, 1, 2)], cluster, global_batch=8)
    rows[0].modelled.total, rows[0].measured             # seconds: model, measured
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ... import calc
from ...calc.network.cluster import GiB
from ...model import GPT
from ...parallelize import parallelize
from ...runtime import comm
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from ...step import train_step
from ..viz import fit_alpha_beta

SIZES = tuple(2 ** k for k in range(12, 23, 2))  # all-reduce sizes profiled, bytes


def _profile_rank(sizes, repeats: int) -> tuple[float, list[float]]:
    axis, dev = world(), device()
    a, b = (torch.randn(512, 512, device=dev) for _ in range(2))
    times = []
    for _ in range(12):
        comm.barrier(axis)  # every rank multiplies at once, as in a step
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    flops = 2 * 512 ** 3 / min(times[2:])  # the fastest it ran: a peak, as a GPU's is
    seconds = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, device=dev)
        times = []
        for _ in range(repeats + 1):
            comm.barrier(axis)
            start = time.perf_counter()
            comm.all_reduce(x, axis)
            times.append(time.perf_counter() - start)
        seconds.append(statistics.median(times[1:]))
    return flops, seconds


def profile(world_size: int = 2, sizes=SIZES, repeats: int = 3,
            timeout: float = 60.0) -> calc.Cluster:
    """This machine as `calc` sees a cluster, every constant MEASURED here: the peak
    FLOP/s of one rank (the fastest matmul any rank ran, as a GPU's peak is the best
    case), all-reduce latency and bandwidth (the slowest rank's median times)."""
    run = launch(_profile_rank, world_size, sizes, repeats, timeout=timeout)
    fit = fit_alpha_beta(sizes, [max(r[1][i] for r in run) for i in range(len(sizes))])
    return machine(max(r[0] for r in run), fit.alpha, fit.beta, world_size)


def machine(flops: float, a: float, c: float, world_size: int = 2) -> calc.Cluster:
    """A `calc.Cluster` of ``world_size`` ranks computing ``flops`` FLOP/s each, whose
    all-reduce of S bytes over all of them takes a + S·c seconds: the ring's
    2(n−1)(α + S/(nβ)) gives α = a/(2(n−1)) and β = 2(n−1)/(n·c)."""
    steps = 2 * (world_size - 1)
    bandwidth, latency = steps / (world_size * c), a / steps
    return calc.Cluster(f"this machine, {world_size} CPU ranks (profiled)", world_size,
                        peak_flops=flops, memory=64 * GiB,  # memory: not used here
                        intra_bandwidth=bandwidth,
                        inter_bandwidth=bandwidth, intra_latency=latency,
                        inter_latency=latency)


def _steps(cfg, dp, pp, tp, global_batch, micro_batch, steps, seed):
    mesh = Mesh(dp=dp, pp=pp, tp=tp)
    torch.manual_seed(seed)
    model = parallelize(GPT(cfg).to(device()), mesh, sequence_parallel=tp > 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (global_batch, cfg.seq_len), device=device())
    times = []
    for _ in range(steps + 1):  # the first step warms up (allocations, autograd's caches)
        comm.barrier(world())
        start = time.perf_counter()
        train_step(model, (x, x), mesh, optimizer,
                   microbatches=global_batch // (dp * micro_batch))
        times.append(time.perf_counter() - start)
    return times[1:]


def measure_steps(cfg, sizes, global_batch: int, micro_batch: int = 1, steps: int = 3,
                  seed: int = 0, timeout: float = 120.0) -> list[float]:
    """MEASURED seconds per training step (AdamW, float32) of `cfg` for each
    (dp, pp, tp) in ``sizes``: the slowest rank's step, median over ``steps``."""
    measured = []
    for dp, pp, tp in sizes:
        run = launch(_steps, dp * pp * tp, cfg, dp, pp, tp, global_batch, micro_batch, steps,
                     seed, timeout=timeout)
        measured.append(statistics.median(max(step) for step in zip(*run, strict=True)))
    return measured


@dataclass(frozen=True)
class Prediction:
    """One configuration: the model's seconds by part, and the measured step."""

    dp: int
    pp: int
    tp: int
    modelled: calc.StepTime  # MODEL: calc.step_time on the profiled cluster
    measured: float  # MEASURED: seconds per step

    @property
    def ratio(self) -> float:
        return self.measured / self.modelled.total


def compare(cfg, sizes, cluster: calc.Cluster, global_batch: int, micro_batch: int = 1,
            steps: int = 3, timeout: float = 120.0) -> list[Prediction]:
    """`calc.step_time` on ``cluster`` (efficiency 1: its peak is this machine's
    measured matmul speed; float32: 4 bytes per value and per gradient) beside
    `measure_steps`, for each (dp, pp, tp)."""
    measured = measure_steps(cfg, sizes, global_batch, micro_batch, steps, timeout=timeout)
    rows = []
    for (dp, pp, tp), seconds in zip(sizes, measured, strict=True):
        model = calc.step_time(cfg, cluster, dp, pp, tp, micro_batch, global_batch, sp=tp > 1,
                               efficiency=1.0, bytes_per_value=4, grad_bytes=4)
        rows.append(Prediction(dp, pp, tp, model, seconds))
    return rows


def table(rows: list[Prediction]) -> str:
    """`compare`'s rows as lesson 17 prints them: the MODEL's milliseconds by part beside the
    MEASURED step and their ratio, then the order each puts them in."""
    lines = [f"{'':>15} {'MODEL (ms): compute':>20} {'tp':>6} {'pp':>6} {'dp':>6} "
             f"{'bubble':>7} {'total':>7}   {'MEASURED':>9}  measured/model"]
    for r in rows:
        t = r.modelled
        lines.append(f"d={r.dp} p={r.pp} t={r.tp}:  {t.compute * 1e3:>19.1f} {t.tp * 1e3:>6.1f} "
                     f"{t.pp * 1e3:>6.1f} {t.dp * 1e3:>6.1f} {t.bubble * 1e3:>7.1f} "
                     f"{t.total * 1e3:>7.1f}   {r.measured * 1e3:>6.1f} ms  {r.ratio:>8.1f}x")
    model = [f"{r.dp}{r.pp}{r.tp}" for r in sorted(rows, key=lambda r: r.modelled.total)]
    measured = [f"{r.dp}{r.pp}{r.tp}" for r in sorted(rows, key=lambda r: r.measured)]
    return "\n".join(lines) + f"\n\nthe model ranks them {model} (d p t); measured: {measured}"
