"""FP8's bytes beside bf16's, scales included: a MODEL (arithmetic, not a measurement).

An FP8 value is one byte (e4m3 or e5m2: Micikevicius et al. 2022, "FP8 Formats for Deep
Learning", arXiv 2209.05433, §3), a bf16 value two. What FP8 adds is its scales, float32
(4 bytes) each, and how many there are depends on the scaling:

* ``"tensorwise"``: one scale for the whole tensor (its amax of this step);
* ``"delayed"``: one scale, and the amax history it is computed from, ``history`` float32
  values per tensor (TransformerEngine's ``DelayedScaling`` recipe keeps such a history;
  its length is the recipe's ``amax_history_len``);
* ``"rowwise"``: one scale per row (torchao's float8 "rowwise" recipe, which torchtitan
  runs with ``--float8.recipe_name rowwise``: torchtitan docs/float8.md);
* ``"blockwise"``: one scale per ``block`` × ``block`` tile of a weight (DeepSeek-V3,
  arXiv 2412.19437, §3.3: 128 × 128 weight blocks; its activations take one scale per
  1 × 128 tile, i.e. ``rowwise`` over rows of 128 values);
* ``"mxfp8"``: one 1-byte e8m0 scale a block of 32 values along each row (OCP MX v1.0 §5):
  8 + 8/32 bits a value;
* ``"nvfp4"``: 4-bit values, one 1-byte e4m3 scale a block of 16, and one float32 scale for
  the whole tensor (NVIDIA's two-level scaling, torchao's nvfp4_tensor.py): 4 + 8/16 bits a
  value, plus 4 bytes.

Three places a training step holds or moves FP8 tensors, each beside bf16:

* `fp8_tensor_bytes`: one tensor (a weight's FP8 copy, an activation kept for backward);
* `fp8_all_gather_bytes`: what one rank sends to all-gather a tensor sharded over n ranks
  in 8 bits (ZeRO-3/FSDP parameters, a sequence-parallel input), by the ring model
  (n−1)/n of the gathered bytes, plus the amax all-reduce a shared scale costs;
* `fp8_linear_inputs_bytes`: the inputs a transformer layer's four linear layers keep for
  their weight gradients, per tensor-parallel rank, with and without sequence parallelism.

The model leaves out what FP8 does not touch: master weights, gradients and optimizer
state (float32/bf16 as in lesson 21), norms, softmax, the embedding and the loss.
"""

from __future__ import annotations

from fractions import Fraction

from ...rules import ceil_div, ring_send_fraction
from .._util import number

FP8_BYTES, BF16_BYTES, SCALE_BYTES = 1, 2, 4
SCALINGS = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4")
BLOCK_FORMATS = {"mxfp8": (32, Fraction(1)), "nvfp4": (16, Fraction(1, 2))}  # (block, bytes
# a value); each block scale is one byte (e8m0, e4m3)


def _block_bytes(rows: int, cols: int, scaling: str) -> tuple[Fraction, int]:
    """(value bytes, block-scale bytes) of a block-scaled tensor, blocks along its rows."""
    block, per_value = BLOCK_FORMATS[scaling]
    if cols % block:
        raise ValueError(f"{scaling}: a row of {cols} is not whole blocks of {block}")
    return rows * cols * per_value, rows * cols // block


def fp8_scale_count(rows: int, cols: int, scaling: str = "tensorwise", block: int = 128) -> int:
    """How many float32 scales a ``rows`` × ``cols`` tensor carries under `scaling`."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if min(rows, cols, block) < 1:
        raise ValueError(f"rows, cols and block must be positive, got {rows}, {cols}, {block}")
    if scaling == "rowwise":
        return rows
    if scaling == "blockwise":
        return ceil_div(rows, block) * ceil_div(cols, block)
    if scaling in BLOCK_FORMATS:
        raise ValueError(f"{scaling}'s block scales are one byte, not float32: see "
                         "fp8_tensor_bytes")
    return 1


def fp8_tensor_bytes(rows: int, cols: int, scaling: str = "tensorwise", history: int = 1,
                     block: int = 128) -> dict:
    """MODEL: bytes of one ``rows`` × ``cols`` tensor held in FP8 with its scales (and, for
    "delayed", its amax history of `history` values), beside the same tensor in bf16:
    ``{"values", "scales", "fp8", "bf16", "ratio"}`` (ratio = fp8 / bf16)."""
    if scaling in BLOCK_FORMATS:
        values, scales = _block_bytes(rows, cols, scaling)
        scales += SCALE_BYTES if scaling == "nvfp4" else 0  # NVFP4's tensor scale
        bf16 = rows * cols * BF16_BYTES
        return {"values": number(values), "scales": scales, "fp8": number(values + scales),
                "bf16": bf16, "ratio": float((values + scales) / bf16)}
    values = rows * cols * FP8_BYTES
    scales = fp8_scale_count(rows, cols, scaling, block) * SCALE_BYTES
    if scaling == "delayed":
        scales += history * SCALE_BYTES
    bf16 = rows * cols * BF16_BYTES
    return {"values": values, "scales": scales, "fp8": values + scales, "bf16": bf16,
            "ratio": (values + scales) / bf16}


def fp8_all_gather_bytes(rows: int, cols: int, n: int, scaling: str = "tensorwise",
                         block: int = 128) -> dict:
    """MODEL: bytes one rank sends to all-gather a ``rows`` × ``cols`` tensor whose rows are
    split over `n` ranks, in FP8 and in bf16 (ring model: (n−1)/n of the gathered bytes).

    Tensorwise (and delayed) scaling: every rank casts its shard with one shared scale, so
    no scale travels with the gather; the shared amax costs one float32 all-reduce first,
    2(n−1)/n · 4 bytes (torchao's FSDP float8 all-gather does the same, one all-reduce for
    all parameters: torchtitan docs/float8.md). Rowwise and blockwise: each shard carries
    its own scales, gathered beside the values, and no all-reduce (blockwise assumes shards
    of whole blocks). MXFP8 and NVFP4: each shard's one-byte block scales travel with it
    (shards of whole blocks: `minitp.fp8.block_shards`), and NVFP4's tensor scale costs
    the float32 amax all-reduce. ``{"values", "scales", "amax", "fp8", "bf16", "ratio"}``."""
    if n < 1 or rows % n:
        raise ValueError(f"{rows} rows do not split over n={n} ranks")
    gather = ring_send_fraction("all_gather", n)
    shared = scaling in ("tensorwise", "delayed", "nvfp4")
    if scaling in BLOCK_FORMATS:
        values, scales = (gather * b for b in _block_bytes(rows, cols, scaling))
    else:
        values = gather * rows * cols * FP8_BYTES
        scales = 0 if shared else gather * fp8_scale_count(rows, cols, scaling,
                                                           block) * SCALE_BYTES
    amax = ring_send_fraction("all_reduce", n) * SCALE_BYTES if shared and n > 1 else 0
    fp8 = values + scales + amax
    bf16 = gather * rows * cols * BF16_BYTES
    return {"values": number(values), "scales": number(scales), "amax": number(amax),
            "fp8": number(fp8), "bf16": number(bf16),
            "ratio": float(Fraction(fp8) / bf16) if bf16 else 0.0}


def fp8_linear_inputs_bytes(cfg, micro_batch: int, tp: int = 1, sp: bool = False,
                            scaling: str = "tensorwise") -> dict:
    """MODEL: bytes one tensor-parallel rank keeps of the inputs of one layer's four linear
    layers (for their weight gradients), in FP8 with scales and in bf16.

    Per layer, with b·s tokens and width h (a 4h MLP): QKV's input bsh, the attention
    projection's bsh, the MLP's first layer's bsh, its second's 4bsh. Without sequence
    parallelism the column-parallel inputs (QKV, first MLP layer) are whole on every rank
    and the row-parallel ones split: 2bsh + 5bsh/t values; with it, 7bsh/t (the FP8 shard is
    kept, as Korthikanti et al. 2022 §4.2.2 keep the bf16 one). Scales: per kept tensor,
    from `fp8_tensor_bytes` on its (tokens, width) shape. Rowwise keeps no 8-bit input: its
    weight gradient casts x again, scaled along the axis that GEMM keeps, from the kept
    high-precision x, so its "fp8" is the bf16 bytes (ratio 1). MXFP8 and NVFP4: the
    columnwise-quantized copy wgrad reads, as TransformerEngine keeps it (minitp's emulation
    keeps x in high precision and casts again, as for rowwise). ``{"fp8", "bf16", "ratio"}``."""
    b, s, h = micro_batch, cfg.seq_len, cfg.d_model
    if h % tp or (sp and s % tp):
        raise ValueError(f"tp={tp} must divide d_model={h}" + (f" and seq_len={s}" if sp else ""))
    tokens = b * s
    shapes = [(tokens, h), (tokens, h // tp), (tokens, h), (tokens, 4 * h // tp)]
    if sp:  # the column-parallel inputs are kept as this rank's 1/t of the tokens
        shapes[0] = shapes[2] = (tokens // tp, h)
    kept = [fp8_tensor_bytes(r, c, scaling) for r, c in shapes]
    if scaling == "rowwise":  # the weight gradient re-casts x along the other axis: x is
        # kept in high precision (torchao's matmul_with_hp_or_float8_args, minitp.fp8.casts)
        return {"fp8": sum(k["bf16"] for k in kept), "bf16": sum(k["bf16"] for k in kept),
                "ratio": 1.0}
    fp8 = sum(k["fp8"] for k in kept)
    bf16 = sum(k["bf16"] for k in kept)
    return {"fp8": fp8, "bf16": bf16, "ratio": fp8 / bf16}
