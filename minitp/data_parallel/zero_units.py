"""ZeRO's units: a pipeline stage cut into pieces (the token embedding alone, the
positions, each transformer layer, the final LayerNorm), each piece's parameters
flattened into one vector padded to a multiple of the dp size, of which dp rank d
owns the d-th slice, its shard; and the bound on gradient reductions in flight.
The whole mechanism, stage by stage: `minitp.data_parallel.zero`.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn as nn

from ..rules import round_up
from ..runtime import comm, trace
from ..runtime.mesh import Axis
from ..sharding.tags import is_expert_shard, tag

IN_FLIGHT = 2  # gradient reduce-scatters posted and not yet waited, at most


class InFlight:
    """The gradient reduce-scatters a rank has posted and not yet waited, oldest
    first (one queue per rank, shared by its units: the bound is on memory)."""

    def __init__(self, limit: int = IN_FLIGHT):
        self.limit, self.queue = limit, deque()

    def add(self, unit: Unit, pending: comm.Pending) -> None:
        self.queue.append((unit, pending))
        while len(self.queue) > self.limit:
            self._wait_oldest()

    def drain(self) -> None:
        while self.queue:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        unit, pending = self.queue.popleft()
        unit.accumulate(pending.wait())


class Unit:
    """A group of parameters flattened, padded to a multiple of dp, and sharded.

    layout: (owning module, attribute, parameter, offset) per parameter; the
    parameter objects are kept (with their tags) even when stage 3 frees them."""

    def __init__(self, name: str, params: list[tuple[nn.Module, str, nn.Parameter]], dp: Axis,
                 tied: bool = False, inflight: InFlight | None = None,
                 master_dtype: torch.dtype | None = None):
        self.name, self.dp, self.tied = name, dp, tied
        self.inflight = InFlight() if inflight is None else inflight
        self.layout, self.shapes, offset = [], [], 0
        for module, attr, p in params:
            self.layout.append((module, attr, p, offset))
            self.shapes.append(p.shape)  # kept: stage 3 empties the parameters
            offset += p.numel()
        self.numel = offset
        self.padded = round_up(offset, dp.size)
        self.shard_size = self.padded // dp.size
        lo = dp.rank * self.shard_size
        flat = self.flatten([p.detach() for _, _, p, _ in self.layout])
        # Mixed precision: the parameters' dtype (bf16) is what is gathered and computed
        # with; the shard, the gradients reduced into it and its optimizer state are
        # `master_dtype` (float32): the shard is the master weights.
        self.param_dtype = flat.dtype
        shard = flat[lo:lo + self.shard_size]
        self.shard = nn.Parameter(shard.to(master_dtype) if master_dtype else shard.clone())
        # which shard elements hold a sequence-parallel partial gradient (summed over tp)
        mask = self.flatten([torch.full_like(p, bool(tag(p, "grad_partial_over_tp")),
                                             dtype=torch.bool) for _, _, p, _ in self.layout])
        self.partial = mask[lo:lo + self.shard_size].clone() if mask.any() else None
        self.prefetched: comm.Pending | None = None  # stage 3: a gather posted ahead
        self.triggers: list[nn.Module] = []
        self.recomputed = False
        self.fp8_gather = None  # the gather in 8 bits (`minitp.fp8.gather`), if asked

    def flatten(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))

    def gather(self) -> torch.Tensor:
        """The whole padded vector, all-gathered from every dp rank's shard."""
        if self.fp8_gather is not None:  # the values themselves (to read), not their casts
            return comm.all_gather(self.shard.detach().to(self.param_dtype), self.dp)
        return self.post_gather().wait()

    def post_gather(self) -> comm.Pending:
        """Start gathering the whole vector (once: a gather already posted is kept).
        Labelled by the unit, not by the module whose hook posted it ahead."""
        if self.prefetched is None and self.fp8_gather is not None:  # `minitp.fp8.gather`
            with trace.relabel(f"zero params {self.name}"):
                self.prefetched = self.fp8_gather.post(self.shard.detach())
        if self.prefetched is None:
            with trace.relabel(f"zero params {self.name}"):
                self.prefetched = comm.all_gather_start(
                    self.shard.detach().to(self.param_dtype), self.dp)
        return self.prefetched

    def take_gathered(self, then_post: Unit | None = None) -> torch.Tensor:
        """The whole vector: the gather posted ahead, or one posted now. `then_post`:
        the unit to prefetch, posted before this one's wait, so it travels while
        this unit computes."""
        pending = self.post_gather()
        if then_post is not None and then_post is not self:
            then_post.post_gather()
        self.prefetched = None
        return pending.wait()

    def drop_prefetched(self) -> None:
        """Wait and discard a gather posted ahead and never used (every rank posted
        it, so every rank must finish it); its values would be stale after a step."""
        if self.prefetched is not None:
            self.prefetched, pending = None, self.prefetched
            pending.wait()

    def views(self, full: torch.Tensor):
        for (module, attr, p, offset), shape in zip(self.layout, self.shapes, strict=True):
            yield module, attr, p, full[offset:offset + shape.numel()].view(shape)

    # -- gradients ----------------------------------------------------------------------
    def start_reduce(self, flat_grad: torch.Tensor) -> None:
        """Start summing this unit's whole gradient over dp (this rank keeps its
        slice); backward goes on meanwhile."""
        flat_grad = flat_grad.to(self.shard.dtype)  # mixed precision: summed in float32
        with trace.label(f"zero grads {self.name}"), trace.phase("bwd"):
            self.inflight.add(self, comm.reduce_scatter_start(flat_grad, self.dp))

    def accumulate(self, part: torch.Tensor) -> None:
        self.shard.grad = part if self.shard.grad is None else self.shard.grad + part

    def finish_reduce(self) -> None:
        """Wait every reduction still in flight; each reduced slice (one per
        microbatch) is then in its shard's gradient."""
        self.inflight.drain()
        self.drop_prefetched()
        if self.shard.grad is None:  # a unit no microbatch reached: still take part below
            self.shard.grad = torch.zeros_like(self.shard)


def _piece_of(name: str, p: nn.Parameter) -> str:
    """The unit a stage's parameter belongs to: "wte", "wpe", "ln_f", "blocks.<i>", or,
    for a run of experts (expert parallelism), the experts module's own path."""
    if is_expert_shard(p):
        return name.rpartition(".")[0]
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def make_units(stage: nn.Module, dp: Axis, inflight: InFlight | None = None,
               master_dtype: torch.dtype | None = None,
               expert_dp: Axis | None = None) -> list[Unit]:
    """One `Unit` per piece of a pipeline stage (a `ParallelGPT`), in forward order. A
    layer's experts under expert parallelism are a unit of their own, sharded over
    `expert_dp` (the ranks holding the same experts), after their layer's unit."""
    groups: dict[str, list] = {}
    for name, p in stage.named_parameters():
        owner, _, attr = name.rpartition(".")
        groups.setdefault(_piece_of(name, p), []).append((stage.get_submodule(owner), attr, p))
    inflight = InFlight() if inflight is None else inflight
    return [Unit(piece, params, expert_dp if is_expert_shard(params[0][2]) else dp,
                 tied=piece == "wte", inflight=inflight, master_dtype=master_dtype)
            for piece, params in groups.items()]


def _piece_module(stage: nn.Module, piece: str) -> nn.Module:
    return stage.get_submodule(piece)
