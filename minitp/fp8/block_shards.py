"""The shard boundary that splits a block: ZeRO-3's 8-bit all-gather under block scales.

Under ZeRO-3 (FSDP) each rank holds 1/n of a weight's flat vector and all-gathers the rest
before a forward. An all-gather in 8 bits (torchao's float8 all-gather for FSDP2, `minitp.
fp8.gather` for one scale a weight) casts each shard *before* it travels. Under a block
format each block's scale comes from its own 32 (MXFP8) or 16 (NVFP4) values, so a rank
can cast its shard with no other rank's help, but only if its shard is whole blocks: where
ZeRO's even split puts a boundary inside a block, each side computes that block's scale
from its part alone, and the gathered weight is not the one one device casts (Megatron-LM
issue #5615, "Support MXFP8 with MFSDP v2 block-atomic sharding"; its PR #7114 shards
MXFP8 weights ``BlockAtomic(32)``). The fix: every boundary rounded up to a whole block.

A weight (d_out, d_in) is flattened row by row, so with d_in whole blocks its flat vector's
blocks are its rows' blocks along d_in, the forward GEMM's reduction dimension (the one a
scale must be constant along). minitp's own ZeRO-3 gathers in the run's dtype and casts
after (`mt.parallelize(..., zero_stage=3, fp8="mxfp8")`: exact, whatever the boundaries);
this module shows the 8-bit gather's trap and fix on one weight, in one process
(`shard_errors`) and across real ranks with codes and scales on the wire (`gather_cast`).
"""

from __future__ import annotations

import torch

from ..rules import ceil_div
from ..runtime import comm
from .blocks import (
    BLOCKS,
    E2M1,
    ELEMENTS,
    block_quantize,
    decode,
    mx_encode,
    nvfp4_encode,
    nvfp4_tensor_scale,
)
from .formats import E4M3


def shard_bounds(numel: int, n: int, block: int = 1) -> list[tuple[int, int]]:
    """Each rank's [lo, hi) of a flat vector of `numel` values over `n` ranks: ZeRO-3's even
    split (ceil(numel/n) a rank, the last short), or with `block` > 1 block-atomic: each
    shard rounded up to whole blocks, so no block straddles two ranks."""
    if min(numel, n, block) < 1:
        raise ValueError(f"numel, n and block must be positive, got {numel}, {n}, {block}")
    size = ceil_div(ceil_div(numel, n), block) * block
    return [(min(r * size, numel), min((r + 1) * size, numel)) for r in range(n)]


def _encode(shard: torch.Tensor, recipe: str, tensor_amax: torch.Tensor | None):
    """(codes, scale codes, scales) of a flat shard cast alone: its blocks counted from its
    own first value, a last part-block padded with zeros (which change no amax)."""
    block = BLOCKS[recipe]
    padded = torch.nn.functional.pad(shard, (0, -shard.numel() % block)).reshape(1, -1)
    if recipe == "mxfp8":
        return mx_encode(padded, E4M3, block)
    return nvfp4_encode(padded, tensor_amax, block)


def cast_shard(shard: torch.Tensor, recipe: str, tensor_amax=None) -> torch.Tensor:
    """What a rank casting its flat `shard` alone reads back (NVFP4: under `tensor_amax`,
    the whole weight's, which an all-reduce gives every rank)."""
    codes, _, scale = _encode(shard, recipe, tensor_amax)
    fmt = ELEMENTS[recipe]
    return decode(codes, scale, fmt, BLOCKS[recipe], shard.dtype).reshape(-1)[:shard.numel()]


def shard_errors(weight: torch.Tensor, n: int, recipe: str, atomic: bool) -> list[dict]:
    """Per rank: how its shard, cast alone, differs from the whole weight cast on one
    device — ``{"differ": values that differ, "max_error": the largest |difference|}``."""
    flat, whole = weight.reshape(-1), block_quantize(weight, recipe).reshape(-1)
    amax = weight.abs().max()
    out = []
    for lo, hi in shard_bounds(flat.numel(), n, BLOCKS[recipe] if atomic else 1):
        diff = (cast_shard(flat[lo:hi], recipe, amax) - whole[lo:hi]).abs()
        out.append({"differ": int((diff > 0).sum()),
                    "max_error": float(diff.max()) if diff.numel() else 0.0})
    return out


def tp_errors(weight: torch.Tensor, tp: int, recipe: str) -> list[dict]:
    """The tp case: a row-parallel weight (d_out, d_in) split over `tp` ranks along d_in, its
    forward's reduction dimension, each rank blocking its own d_in/tp columns from their
    first. Per rank, ``{"differ", "max_error"}`` against its slice of one device's cast:
    zero where d_in/tp is whole blocks, not where a block straddles two ranks (which
    `minitp.rules.fp8_groups.check_fp8_blocks` therefore refuses)."""
    d_in = weight.shape[-1]
    if d_in % tp:
        raise ValueError(f"d_in={d_in} does not split over tp={tp}")
    whole, width = block_quantize(weight, recipe), d_in // tp
    amax = weight.abs().max()
    out = []
    for r in range(tp):
        local = weight[:, r * width:(r + 1) * width]
        cast = torch.stack([cast_shard(row, recipe, amax) for row in local])
        diff = (cast - whole[:, r * width:(r + 1) * width]).abs()
        out.append({"differ": int((diff > 0).sum()), "max_error": float(diff.max())})
    return out


def gather_cast(weight: torch.Tensor, axis, recipe: str, atomic: bool) -> dict:
    """Across the ranks of `axis` (each holding the same `weight`): each casts its ZeRO-3
    shard, the codes and block scales are all-gathered as bytes (NVFP4 packs two codes a
    byte; its tensor scale comes from an amax all-reduce), and the weight is rebuilt.
    Returns this rank's ``{"differ", "max_error"}`` against one device's cast (over the
    values of this rank's shard) and ``{"gathered_bytes"}``, the all-gathered bytes."""
    flat, block, fmt = weight.reshape(-1), BLOCKS[recipe], ELEMENTS[recipe]
    bounds = shard_bounds(flat.numel(), axis.size, block if atomic else 1)
    size = bounds[0][1] - bounds[0][0]
    lo, hi = bounds[axis.rank]
    shard = torch.nn.functional.pad(flat[lo:hi], (0, size - (hi - lo)))  # equal sizes
    amax = None if recipe == "mxfp8" else comm.all_reduce(flat[lo:hi].abs().max(), axis, op="max")
    codes, scale_codes, _ = _encode(shard, recipe, amax)
    if fmt is E2M1:
        codes = codes.reshape(-1, 2)
        codes = codes[:, 0] | (codes[:, 1] << 4)
    all_codes = comm.all_gather(codes.reshape(-1), axis)
    all_scales = comm.all_gather(scale_codes.reshape(-1), axis)
    gathered = all_codes.numel() + all_scales.numel()  # bytes: both are uint8
    if fmt is E2M1:
        all_codes = torch.stack([all_codes & 15, all_codes >> 4], -1).reshape(-1)
        scales = all_scales.view(E4M3.dtype).to(flat.dtype) * nvfp4_tensor_scale(amax)
    else:
        scales = torch.ldexp(torch.ones_like(all_scales, dtype=flat.dtype),
                             all_scales.long() - 127)
    per_rank = all_codes.numel() // axis.size
    rebuilt = torch.cat([decode(all_codes[r * per_rank:(r + 1) * per_rank].reshape(1, -1),
                                scales.reshape(axis.size, -1)[r:r + 1], fmt, block,
                                flat.dtype).reshape(-1)[:b - a]
                         for r, (a, b) in enumerate(bounds)])
    diff = (rebuilt - block_quantize(weight, recipe).reshape(-1))[lo:hi].abs()
    return {"differ": int((diff > 0).sum()), "max_error": float(diff.max()),
            "gathered_bytes": gathered}
