"""Measured side by side: minitp's ZeRO-3, torch's FSDP2 and HSDP on the same model.

Per rank and per step: the bytes this rank wrote to its sockets (the kernel's counter,
`minitp.runtime.io_counters`: gloo's messages, headers included), the peak bytes allocated
during the step above what was allocated before it (`minitp.memory.peak_allocated`: the
profiler's allocations on the CPU, torch.cuda's counter on a GPU), and the bytes kept
between steps: this rank's parameters, gradients and optimizer state (local shards).
Every figure is measured; docs/torch-parallel.md explains each difference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from ..data_parallel import make_optimizer
from ..memory import peak_allocated
from ..model import GPT, GPTConfig
from ..parallelize import parallelize as minitp_parallelize
from ..runtime import Mesh, comm, device, io_counters, launch
from ..step import train_step as minitp_step
from .parallelize import parallelize
from .step import train_step


@dataclass
class StepCost:
    name: str
    sent: int | None  # bytes written to sockets in the last step (None: not measurable here)
    peak: int  # the last step's peak bytes allocated, above what was allocated before it
    kept: int  # parameters + gradients + optimizer state held between steps (local shards)
    seconds: float  # the last step's wall-clock time
    loss: float  # the last step's loss (the three sides must agree)


def _local(t) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def kept_bytes(model, optimizer) -> int:
    """This rank's parameters, gradients and optimizer state, as stored (local shards)."""
    tensors = [_local(p) for p in model.parameters()]
    tensors += [_local(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [_local(v) for state in optimizer.state.values() for v in state.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]
    return sum(t.numel() * t.element_size() for t in tensors)


def _sides(ref, dp: int, hsdp: int):
    mesh = Mesh(dp=dp)
    ours = minitp_parallelize(ref, mesh, zero_stage=3)
    yield "minitp ZeRO-3", ours, make_optimizer(ours, mesh, torch.optim.AdamW, lr=1e-3), \
        lambda m, b, o: minitp_step(m, b, mesh, o)
    for name, r in (("torch FSDP2", None), (f"torch HSDP {hsdp}x{dp // hsdp}", hsdp)):
        model = parallelize(ref, mesh, hsdp=r)
        yield name, model, torch.optim.AdamW(model.parameters(), lr=1e-3), train_step


def measure_here(cfg: GPTConfig, dp: int, hsdp: int = 2, batch: int = 8, steps: int = 2,
                 dtype=torch.float32) -> list[StepCost]:
    """Inside launched ranks (world = dp): the three sides trained on the same batches,
    the last step of each measured; this rank's `StepCost`s."""
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=generator)
            for _ in range(steps)]
    torch.manual_seed(0)
    ref = GPT(cfg).to(dtype=dtype, device=device())
    out = []
    for name, model, optimizer, step in _sides(ref, dp, hsdp):
        for k, tokens in enumerate(data):
            batch_k = (tokens[:, :-1].to(device()), tokens[:, 1:].to(device()))
            written, started = io_counters.written(), time.perf_counter()
            with comm.checks(k == 0):  # minitp's call check: first step only (not measured)
                loss, peak = peak_allocated(
                    lambda f=step, m=model, b=batch_k, o=optimizer: f(m, b, o))
            seconds = time.perf_counter() - started
            sent = None if written is None else io_counters.written() - written
        out.append(StepCost(name, sent, peak, kept_bytes(model, optimizer), seconds, loss))
    return out


def compare(cfg: GPTConfig, world_size: int = 4, hsdp: int = 2, batch: int = 8,
            steps: int = 2, dtype=torch.float32, timeout: float = 120.0) -> list[list[StepCost]]:
    """Train `cfg` for `steps` steps on `world_size` data-parallel ranks three ways — minitp's
    ZeRO-3, torch's FSDP2, torch's HSDP with `hsdp` replicas — in one launch; the last
    step measured. Returns, per rank, its three `StepCost`s."""
    run = launch(measure_here, world_size, cfg, world_size, hsdp, batch, steps, dtype,
                 timeout=timeout)
    return [run[r] for r in range(world_size)]
