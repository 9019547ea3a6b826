"""Lab: blocks of scales — MXFP8 and NVFP4 across ranks (lesson 24).

* `formats`: the two block formats' bits a value, from `calc.fp8_tensor_bytes` (a MODEL);
* `draw_blocks`: one token's features and the largest magnitude each format's scales let
  them reach: one ceiling a tensor (tensorwise), one a block of 32 (MXFP8, a power of two
  times 448), one a block of 16 (NVFP4, 6 times an e4m3 block scale times the tensor scale);
* `cast_errors` / `draw_cast_errors`: one layer input with an outlier feature, cast
  tensorwise (one e4m3 scale), MXFP8 and NVFP4; each block's relative error, MEASURED
  against the float64 tensor;
* `scales_on_ranks`: one launch of 2 ranks, a row-parallel weight split over tp along its
  reduction dimension: each rank's block cast against one device's slice, with and without
  an amax all-reduce (NVFP4's tensor scale), and the collectives each cast ran;
* `zero3_trap`: one launch of 3 ranks, ZeRO-3's 8-bit all-gather of one weight
  (`fp8.block_shards.gather_cast`) with ZeRO's even split and with block-atomic shards:
  per rank, the values of its shard that differ from one device's cast, MEASURED;
* `gather_bytes`: one launch of 4 ranks, the same gather (block-atomic) of a float32 weight
  in each format: the trace's bytes per collective (its ring model of what ran) and the
  kernel's count, beside `calc.fp8_all_gather_bytes` (a MODEL);
* `scale_tiles`: the scale tiles a GPU's block-scaled GEMM reads (torchao's ``to_blocked``,
  after cuBLAS's block-scaling-factors layout), for one weight: its scales padded to whole
  128 × 4 tiles.
"""

from __future__ import annotations

import torch

from ... import fp8
from ...calc.footprint.fp8 import fp8_tensor_bytes
from ...fp8 import block_shards
from ...fp8.blocks import BLOCKS
from ...model import GPT, GPTConfig
from ...rules import ceil_div
from ...runtime import comm, trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh

CFG = dict(vocab_size=16, seq_len=32, n_layer=1, n_head=2, d_model=64)  # the tiny GPT
RECIPES = ("mxfp8", "nvfp4")


def formats() -> list[dict]:
    """Per recipe: its block, and the bits a value (values + block scales; NVFP4's float32
    tensor scale apart), from the calculator's bytes of a 128 × 128 tensor."""
    rows = []
    for recipe in RECIPES:
        got = fp8_tensor_bytes(128, 128, recipe)
        tensor_scale = 4 if recipe == "nvfp4" else 0
        rows.append({"recipe": recipe, "block": BLOCKS[recipe],
                     "bits": (got["fp8"] - tensor_scale) * 8 / 128 ** 2,
                     "tensor scale bits": tensor_scale * 8})
    return rows


def weight(dtype=torch.float64) -> torch.Tensor:
    """The tiny GPT's first MLP weight, (4d, d): a real layer's values."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**CFG)).to(device())
    return model.blocks[0].mlp.fc.weight.detach().to(dtype)


def draw_blocks(ax, x: torch.Tensor, token: int = 0):
    """|x[token]| and each format's ceiling per block, the magnitude its scale maps to the
    format's largest value (tensorwise and NVFP4's tensor scale from the whole of x)."""
    row, amax = x[token:token + 1].cpu(), x.abs().max().cpu()
    _, _, mx = fp8.blocks.mx_encode(row, fp8.E4M3, BLOCKS["mxfp8"])
    _, _, nv = fp8.blocks.nvfp4_encode(row, amax, BLOCKS["nvfp4"])
    at = torch.arange(row.shape[1])
    ax.plot(at, row[0].abs(), ".", color="#777777", label="|value|")
    ceilings = {"tensorwise: the amax, at 448": amax.expand(len(at)),
                "MXFP8: 448 × 2^k a block of 32": (448 * mx[0]).repeat_interleave(32),
                "NVFP4: 6 × e4m3 × s_t a block of 16": (6 * nv[0]).repeat_interleave(16)}
    for (label, ceiling), color in zip(ceilings.items(), ("#0072B2", "#D55E00", "#009E73"),
                                       strict=True):
        ax.step(at, ceiling, where="post", color=color, label=label)
    ax.set(yscale="log", xlabel="feature (blocks counted from 0)", ylabel="magnitude",
           title=f"token {token}: each format's ceiling, block by block")
    ax.legend(fontsize=7)


def layer_input(outlier: float = 1e5) -> torch.Tensor:
    """32 tokens × 64 features, feature 0 `outlier` times the rest: a massive activation."""
    x = torch.randn(32, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x[:, 0] *= outlier
    return x.to(device())


def cast_errors(x: torch.Tensor) -> dict:
    """Per recipe, each block of 16 values' relative error (‖cast − x‖ / ‖x‖), in rows of
    blocks along the features: tensorwise (one e4m3 scale, its amax the whole tensor's),
    MXFP8 and NVFP4."""
    tensorwise = fp8.quantize(x, fp8.scale_from_amax(x.abs().max(), fp8.E4M3), fp8.E4M3)
    casts = {"tensorwise": tensorwise, **{r: fp8.block_quantize(x, r) for r in RECIPES}}
    blocks = x.reshape(x.shape[0], -1, 16)
    return {name: ((cast.reshape(blocks.shape) - blocks).norm(dim=-1)
                   / blocks.norm(dim=-1)).cpu() for name, cast in casts.items()}


def draw_cast_errors(errors: dict, ax):
    for name, style in zip(errors, ("o", "s", "^"), strict=True):
        per_block = errors[name].mean(0)  # over the tokens
        ax.plot(range(len(per_block)), per_block, style + "-", label=name)
    ax.set(yscale="log", xlabel="block of 16 features (block 0 holds the outlier feature)",
           ylabel="relative error of the cast (mean over tokens)",
           title="one scale a tensor against one a block")
    ax.legend(fontsize=8)


def _cast_shard():
    """On each of 2 ranks: this rank's columns of the weight (tp's row-parallel split), cast.
    Every rank makes the weight itself (the same seed): nothing crosses from the parent."""
    mesh, w = Mesh(tp=2), weight()
    width = w.shape[1] // 2
    mine = w[:, mesh.tp.rank * width:(mesh.tp.rank + 1) * width]
    out = {}
    for recipe in RECIPES:
        whole = fp8.block_quantize(w, recipe)[:, mesh.tp.rank * width:(mesh.tp.rank + 1) * width]
        before = len(trace.events())
        local = fp8.block_quantize(mine, recipe)  # NVFP4: its tensor scale from this rank's amax
        out[recipe, "local"] = ((local != whole).sum().item(), len(trace.events()) - before)
        if recipe == "nvfp4":
            before = len(trace.events())
            amax = comm.all_reduce(mine.abs().max(), mesh.tp, op="max")
            shared = fp8.block_quantize(mine, recipe, tensor_amax=amax)
            out[recipe, "shared"] = ((shared != whole).sum().item(),
                                     len(trace.events()) - before)
    return out


def scales_on_ranks() -> list[dict]:
    """Per rank: (recipe, "local" | "shared") -> (values that differ from one device's
    slice, collectives the cast ran)."""
    return list(launch(_cast_shard, 2, timeout=60))


def _trap():
    axis, w = Mesh(dp=3).dp, weight()
    return {(recipe, atomic): block_shards.gather_cast(w, axis, recipe, atomic)
            for recipe in RECIPES for atomic in (False, True)}


def zero3_trap() -> list[dict]:
    """Per rank of 3: (recipe, atomic) -> gather_cast's {"differ", "max_error", ...}."""
    return list(launch(_trap, 3, timeout=60))


def _gather():
    axis, w = Mesh(dp=4).dp, weight(torch.float32)
    out = {}
    for recipe in RECIPES:
        before = len(trace.events())
        block_shards.gather_cast(w, axis, recipe, atomic=True)
        out[recipe] = [(e.op, str(e.dtype).removeprefix("torch."), e.model_bytes, e.sent_bytes)
                       for e in trace.events()[before:]]
    return out


def gather_bytes() -> dict:
    """Rank 0's collectives of the block-atomic 8-bit gather of the weight in float32 (its
    amax a float32, as production's), per recipe: [(op, dtype, ring model, kernel's count)]."""
    return launch(_gather, 4, timeout=60)[0]


def scale_tiles(rows: int, cols: int, recipe: str) -> dict:
    """The scales of a ``rows`` × ``cols`` operand (blocks along its `cols`, the GEMM's K)
    as a block-scaled GEMM reads them: a (rows, cols/block) matrix padded with zeros to whole
    128 × 4 tiles (torchao/prototype/mx_formats/utils.py, ``to_blocked``)."""
    scales = (rows, cols // BLOCKS[recipe])
    padded = (ceil_div(rows, 128) * 128, ceil_div(scales[1], 4) * 4)
    return {"scales": scales, "padded": padded,
            "padding": 1 - scales[0] * scales[1] / (padded[0] * padded[1])}
