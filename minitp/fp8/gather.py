"""ZeRO-3's parameter all-gather in 8 bits: each FP8 weight's shard sent as e4m3 codes.

Under ZeRO-3 (`minitp.data_parallel.zero_stage3`) a unit's parameters are all-gathered over
dp before every forward and backward. The layer then casts each weight to e4m3 anyway
(`minitp.fp8.casts`), so the gather can send the cast instead: one byte an element, not the
run's two (bf16) or four, as torchao's float8 all-gather for FSDP2 does
(``enable_fsdp_float8_all_gather``). Per unit:

1. the scale of each FP8 weight: its amax over this rank's elements, MAX-reduced over dp
   (the ranks hold pieces of one flat vector) and over the weight's own amax axes
   (`minitp.rules.fp8_groups`: tp for a tensor-parallel weight) — the scale the layer's own
   cast will compute, so casting the gathered weight again changes nothing (a cast is
   idempotent);
2. one all-gather of the shard as 8-bit codes (every element one byte), and one of the
   elements that are not FP8 weights (biases, norms, padding) in the run's dtype, padded to
   the longest rank's count;
3. the whole vector rebuilt: codes/scale where a weight is, the rest as sent.

Tensorwise scaling only (one scale a weight; rowwise would send a scale a row, delayed a
history's scale).
"""

from __future__ import annotations

import torch

from ..runtime import comm
from .formats import E4M3, from_fp8, scale_from_amax, to_fp8


class _Gathered:
    """What `Unit.post_gather` returns: ``wait()`` gives the whole vector (gathered now)."""

    def __init__(self, full: torch.Tensor):
        self.full = full

    def wait(self) -> torch.Tensor:
        return self.full


class Fp8Gather:
    """A ZeRO-3 unit's gather in 8 bits (`Unit.fp8_gather`)."""

    def __init__(self, unit):
        self.unit = unit
        segments = [(offset, shape.numel(), module.fp8.weight)  # shapes: stage 3 empties p
                    for (module, attr, _, offset), shape in zip(unit.layout, unit.shapes,
                                                                strict=True)
                    if attr == "weight" and getattr(module, "fp8", None)]
        self.weight_axes = segments[0][2].axes if segments else ()
        self.ids = torch.full((unit.padded,), -1, dtype=torch.long)
        for k, (offset, numel, scale) in enumerate(segments):
            if scale.axes != self.weight_axes:
                raise ValueError("fp8 all-gather: a unit's weights reduce their amax over "
                                 "different axes")
            self.ids[offset:offset + numel] = k
        self.weights = len(segments)
        self.is_fp8 = self.ids >= 0
        size = unit.shard_size
        counts = [int((~self.is_fp8[r * size:(r + 1) * size]).sum()) for r in range(unit.dp.size)]
        self.rest_len = max(counts)  # every rank sends this many: equal sizes to gather
        self.rest_index = torch.cat([r * self.rest_len + torch.arange(n)
                                     for r, n in enumerate(counts)])
        lo = unit.dp.rank * size
        self.mine = slice(lo, lo + size)

    def scales(self, shard: torch.Tensor) -> torch.Tensor:
        """Each FP8 weight's scale, from the whole weight's amax."""
        ids, values = self.ids[self.mine], shard.abs()
        amax = torch.zeros(self.weights + 1, dtype=shard.dtype, device=shard.device)
        amax.scatter_reduce_(0, (ids + 1).to(shard.device), values, "amax")  # slot 0: the rest
        amax = amax[1:]
        for axis in (self.unit.dp, *self.weight_axes):
            amax = comm.all_reduce(amax, axis, op="max")
        return scale_from_amax(amax, E4M3)

    def post(self, shard: torch.Tensor) -> _Gathered:
        """Gather the unit's whole vector from every rank's `shard` (in the run's dtype)."""
        device, is_mine = shard.device, self.is_fp8[self.mine].to(shard.device)
        scale = self.scales(shard)
        codes = torch.zeros(shard.numel(), dtype=torch.uint8, device=device)
        mine_scale = scale[self.ids[self.mine][self.is_fp8[self.mine]].to(device)]
        codes[is_mine] = to_fp8(shard[is_mine], mine_scale, E4M3).view(torch.uint8)
        rest = torch.zeros(self.rest_len, dtype=shard.dtype, device=device)
        rest[:int((~is_mine).sum())] = shard[~is_mine]
        all_codes = comm.all_gather(codes, self.unit.dp)  # (padded,) one byte an element
        all_rest = comm.all_gather(rest, self.unit.dp)
        full = torch.empty(self.unit.padded, dtype=shard.dtype, device=device)
        where = self.is_fp8.to(device)
        full[where] = from_fp8(all_codes[where].view(E4M3.dtype),
                               scale[self.ids[self.is_fp8].to(device)], shard.dtype)
        full[~where] = all_rest[self.rest_index.to(device)]
        return _Gathered(full)


def attach_fp8_gather(stages) -> None:
    """Every ZeRO-3 unit of `stages` that holds FP8 weights gathers them in 8 bits (the
    others — embeddings, the final norm — as before)."""
    for stage in stages:
        for unit in stage.zero_units:
            gather = Fp8Gather(unit)
            unit.fp8_gather = gather if gather.weights else None
