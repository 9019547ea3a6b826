"""Lab: scaling experiments. Megatron-LM's model family, shrunk; real runs timed and split.

Shoeybi et al. 2019 (Megatron-LM, arXiv 1909.08053) measured *weak scaling*:
the model grows with the number t of tensor-parallel GPUs (their Table 1: 1.2B
on 1 GPU ... 8.3B on 8, hidden size per head fixed at 96), so the work per GPU
stays about the same, and a perfect system would keep the step time constant.
*Strong scaling* splits one model over more GPUs and hopes the step gets t
times faster.

    cfg = megatron_family(2, head_dim=16, head_divisor=2, layer_divisor=8,
                          vocab_size=256, seq_len=64)     # the t = 2 member, laptop-sized
    steps = measure_tp([cfg], tp=2, batch=8)               # a real run on 2 processes
    steps[0].seconds, steps[0].comm_share                  # step time; communication share

The split of a step into communication and the rest is read from the run's
trace: every collective of `minitp.runtime.comm` records when it started and ended, so
the time a rank spends inside collectives is the sum of their durations; the
rest of its step (the step's window minus that) is compute, with the optimizer
and Python overhead in it.

The family and the measurement are this module; the laws a result is read through
are scaling_laws.py (pure arithmetic), imported here so that lesson 16 reads all three
as ``scaling.<name>``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ... import calc
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...rules import check_parallel_config, layer_label
from ...runtime import comm, trace
from ...runtime._device import device
from ...runtime.launch import Run, launch
from ...runtime.mesh import Mesh, world
from ...step import train_step
from .scaling_laws import (  # noqa: F401 - lesson 16 reads the laws as scaling.<name>
    amdahl,
    fitted_overhead,
    speedup_with_overhead,
    strong_efficiency,
    weak_efficiency,
)


@dataclass(frozen=True)
class FamilyMember:
    """One row of Megatron-LM's Table 1."""

    tp: int  # tensor-parallel GPUs
    hidden: int
    heads: int
    layers: int
    params: float  # as the paper prints it (parameters)


# Shoeybi et al. 2019, Table 1 (vocabulary 51,200, sequence 1024, hidden size per head 96).
TABLE1 = (
    FamilyMember(1, 1536, 16, 40, 1.2e9),
    FamilyMember(2, 1920, 20, 54, 2.5e9),
    FamilyMember(4, 2304, 24, 64, 4.2e9),
    FamilyMember(8, 3072, 32, 72, 8.3e9),
)


def table1_row(tp: int) -> FamilyMember:
    for row in TABLE1:
        if row.tp == tp:
            return row
    raise ValueError(f"Table 1 has rows for tp = {[r.tp for r in TABLE1]}, not {tp}")


def megatron_family(tp: int, head_dim: int = 96, head_divisor: int = 1, layer_divisor: float = 1,
                    vocab_size: int = 51200, seq_len: int = 1024) -> GPTConfig:
    """The weak-scaling model for ``tp`` GPUs: Table 1's row, optionally shrunk.

    heads = Table 1's heads / ``head_divisor`` (which must divide them),
    hidden = heads × ``head_dim`` (the hidden size per head stays fixed, as in
    the table), layers = Table 1's layers / ``layer_divisor``, rounded half up.
    The defaults give the table itself.
    """
    row = table1_row(tp)
    if row.heads % head_divisor:
        raise ValueError(f"head_divisor={head_divisor} does not divide Table 1's "
                         f"{row.heads} heads (t = {tp})")
    heads = row.heads // head_divisor
    layers = max(1, int(row.layers / layer_divisor + 0.5))
    cfg = GPTConfig(vocab_size=vocab_size, seq_len=seq_len, n_layer=layers, n_head=heads,
                    d_model=heads * head_dim)
    check_parallel_config(cfg, tp=tp)
    return cfg


# --------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class StepSplit:
    """A model's measured training step at one tensor-parallel size.

    ``seconds`` is the step time (the slowest rank's) of the fastest timed step:
    on a shared machine, other programs can only add time, so the fastest step
    is the one they disturbed least. ``comm_seconds`` is, for that step, the time
    the ranks spent inside collectives (their mean); ``rank_comm_seconds`` each
    rank's. It has two parts: ``wait_seconds``, inside a collective before the
    last rank of the group arrived in it (waiting for a slower rank), and
    ``transfer_seconds``, after (moving and adding the bytes).
    ``all_seconds`` are every timed step's times, in order.
    ``layer_model_bytes[i]`` is what rank 0 sent for transformer layer i in that
    step under the ring MODEL (the formula applied to the traced collectives);
    ``layer_sent_bytes[i]`` what it measurably wrote to its sockets there (the
    kernel's count, `minitp.runtime.io_counters`; None where any collective of the
    layer could not be measured). ``layer_collectives[i]`` the collectives it
    ran there, as "op:phase" ("all_reduce:fwd"); at tp=1 there are none.
    ``rank_cpu_seconds[r]`` is the CPU time rank r's process used in that step
    (`time.process_time`: every thread of it, gloo's included; measured by the
    kernel): against the step's wall time it says how much of the step the rank
    was running on a core, and the sum over ranks how many core-seconds the step
    cost.
    """

    cfg: GPTConfig
    tp: int
    batch: int
    seconds: float
    comm_seconds: float
    rank_comm_seconds: tuple[float, ...]
    wait_seconds: float
    all_seconds: tuple[float, ...]
    loss: float
    layer_model_bytes: tuple[int, ...]
    layer_sent_bytes: tuple[int | None, ...]
    layer_collectives: tuple[tuple[str, ...], ...]
    rank_cpu_seconds: tuple[float, ...] = ()

    @property
    def cpu_seconds(self) -> float:
        """Core-seconds the step cost: every rank's CPU time, summed."""
        return sum(self.rank_cpu_seconds)

    @property
    def compute_seconds(self) -> float:
        """Everything in the step that is not inside a collective."""
        return self.seconds - self.comm_seconds

    @property
    def transfer_seconds(self) -> float:
        return self.comm_seconds - self.wait_seconds

    @property
    def comm_share(self) -> float:
        return self.comm_seconds / self.seconds

    @property
    def flops(self) -> int:
        """FLOPs of the whole step, all ranks together: a MODEL (Korthikanti et al.
        2022, Eq. 7, from the shape), not counted in the run."""
        return calc.flops_per_iteration(self.cfg, self.batch)

    def __str__(self) -> str:
        return (f"t={self.tp} h={self.cfg.d_model} l={self.cfg.n_layer}: "
                f"{self.seconds * 1e3:.1f} ms per step, communication "
                f"{self.comm_seconds * 1e3:.1f} ms ({self.comm_share:.0%}: waiting "
                f"{self.wait_seconds * 1e3:.1f}, transfer {self.transfer_seconds * 1e3:.1f})")


def _time_steps(configs, batch, steps, warmup, seed, threads, lr):
    """Runs on every rank: for each config, build the plain GPT, shard it, train
    `warmup` untimed steps and `steps` timed ones; return each timed step's window
    on the trace clock and its loss."""
    if threads:
        torch.set_num_threads(threads)  # one core per rank, as one GPU per rank
    mesh = Mesh(tp=world().size)
    rec = trace.recorder()
    results = []
    for cfg in configs:
        torch.manual_seed(seed)  # the same plain model and batch on every rank
        # on this rank's device: under NCCL, CPU tensors would go through gloo unnoticed
        model = parallelize(GPT(cfg).to(device()), mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        generator = torch.Generator().manual_seed(seed + 1)
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator).to(device())
        y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator).to(device())
        with trace.paused():
            for _ in range(warmup):
                train_step(model, (x, y), mesh, optimizer)
        windows, losses, cpu = [], [], []
        for _ in range(steps):
            with trace.paused():
                comm.barrier(mesh.tp)  # start every step together
            start, cpu_start = rec.now(), time.process_time()
            losses.append(train_step(model, (x, y), mesh, optimizer))
            windows.append((start, rec.now()))
            cpu.append(time.process_time() - cpu_start)
        results.append({"windows": windows, "losses": losses, "cpu": cpu})
    return results


def read_step(run: Run, rank: int, window: tuple[float, float]) -> dict:
    """What ``run.trace`` says rank ``rank`` did in ``window`` (start, end on the
    trace clock): its seconds, seconds inside collectives, bytes sent, and the
    collectives of each trace label."""
    start, end = window
    events = [e for e in run.trace if e.rank == rank and e.is_comm
              and e.start >= start and e.end <= end]
    by_label: dict[str, list] = {}
    for e in events:
        by_label.setdefault(e.label, []).append(e)
    return {
        "seconds": end - start,
        "comm_seconds": sum(e.duration for e in events),
        "model_bytes": sum(e.model_bytes for e in events),
        "sent_bytes": sent_bytes(events),
        "events": events,
        "by_label": by_label,
    }


def sent_bytes(events) -> int | None:
    """The measured bytes of `events` together, or None if any has no measurement
    (a sum that skipped some would pass a partial count off as the whole)."""
    counts = [e.sent_bytes for e in events]
    return None if None in counts else sum(counts)


def waiting_seconds(per_rank_events) -> list[float]:
    """For each rank, the time it spent in collectives before the last rank of the
    group got there. ``per_rank_events``: each rank's collectives of one step, in
    order; the k-th of every rank is the same collective (tensor parallelism only:
    one group, every rank runs the same ones). All ranks share one clock."""
    counts = {len(events) for events in per_rank_events}
    if len(counts) != 1:
        raise ValueError(f"the ranks ran different numbers of collectives: {sorted(counts)}")
    waits = [0.0] * len(per_rank_events)
    for same_op in zip(*per_rank_events, strict=True):
        last_arrival = max(e.start for e in same_op)
        for r, e in enumerate(same_op):
            waits[r] += min(e.end, last_arrival) - e.start
    return waits


def split_run(run: Run, configs, batch: int, index: int) -> StepSplit:
    """The `StepSplit` of ``configs[index]`` in a run of `_time_steps`."""
    cfg, tp = configs[index], run.world_size
    steps = len(run[0][index]["windows"])
    reads = [[read_step(run, r, run[r][index]["windows"][i]) for r in range(tp)]
             for i in range(steps)]
    times = [max(read["seconds"] for read in step) for step in reads]
    best = min(range(steps), key=times.__getitem__)
    per_rank = tuple(read["comm_seconds"] for read in reads[best])
    waits = waiting_seconds([read["events"] for read in reads[best]])
    layers = [reads[best][0]["by_label"].get(layer_label(i), []) for i in range(cfg.n_layer)]
    return StepSplit(
        cfg=cfg, tp=tp, batch=batch, seconds=times[best],
        comm_seconds=statistics.fmean(per_rank), rank_comm_seconds=per_rank,
        wait_seconds=statistics.fmean(waits),
        all_seconds=tuple(times), loss=run[0][index]["losses"][0],
        layer_model_bytes=tuple(sum(e.model_bytes for e in events) for events in layers),
        layer_sent_bytes=tuple(sent_bytes(events) for events in layers),
        layer_collectives=tuple(tuple(f"{e.op}:{e.phase}" for e in events)
                                for events in layers),
        rank_cpu_seconds=tuple(run[r][index]["cpu"][best] for r in range(tp)),
    )


def measure_tp(configs, tp: int, batch: int = 8, steps: int = 5, warmup: int = 1,
               seed: int = 0, threads: int | None = 1, lr: float = 1e-3,
               timeout: float = 120.0) -> list[StepSplit]:
    """Train each of ``configs`` for a few steps on ``tp`` real processes
    (tensor parallelism only, Adam, float32, batch ``batch``) and split its
    fastest step into compute and communication from the trace.

    All configs run in one launch, one after the other, so a strong- and a
    weak-scaling model can share the start-up cost. ``threads`` per rank (None:
    the launcher's share of the cores).
    """
    configs = list(configs)
    for cfg in configs:
        check_parallel_config(cfg, tp=tp)
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    run = launch(_time_steps, tp, configs, batch, steps, warmup, seed, threads, lr,
                 timeout=timeout)
    return [split_run(run, configs, batch, i) for i in range(len(configs))]
