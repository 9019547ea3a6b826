"""FP8's amax groups: over which mesh axes a tensor's amax is MAX-reduced, written once.

A scale is meant for one tensor. When the mesh splits that tensor over ranks, every rank
holds a piece, and a piece's own amax would give each rank a different scale: the ranks
would cast one tensor differently from one another and from one process (the trap behind
Megatron-LM PR #442's divergence at tp = 8, and TransformerEngine issue #656 under sequence
parallelism). So each rank's amax is all-reduced with MAX over exactly the axes that split
the tensor as the cast sees it; over an axis that holds copies the reduction would change
nothing, and over one that holds other tensors it would be wrong.

How each of a transformer block's linear layers meets its three casts (y = x Wᵀ):

================  ==========================  ========================================
layer, role       the tensor the cast sees    split over
================  ==========================  ========================================
column, input     x (B, T, C)                 dp (rows), cp (sequence);
                                              + tp (sequence) under SP: cast before
                                              SP's all-gather, so 8 bits could travel
column, weight    W_i (d_out/t, C)            tp (its output rows)
column, grad      ∂y_i (B, T, d_out/t)        dp, cp, tp (its features)
row, input        x_i (B, T, d_in/t)          dp, cp, tp (its features)
row, weight       W_i (C, d_in/t)             tp (its input columns: each row's end)
row, grad         ∂y (B, T, C)                dp, cp (whole on every tp rank: g's
                                              backward, or SP's all-gather, copies it)
================  ==========================  ========================================

``tensorwise`` and ``delayed`` (one scale a tensor) reduce over all of those axes.
``rowwise`` (torchao's recipe) gives a scale to each row of an operand *as its GEMM reads
it*, the amax along the GEMM's reduction dimension, so it reduces only over the axes that
split that dimension. Its forward casts and dgrad's output gradient are scaled along the
last dimension (tp where a row's features are split, nothing else); its three backward
re-casts (`RECASTS`) along the other one: the weight for dgrad (∂x = g W sums over W's
rows: tp for a column layer's), and the input and the output gradient for wgrad
(∂W = gᵀ x sums over the tokens: dp and cp, whose ranks hold other tokens; a column layer's
input is cast after SP's all-gather under rowwise, as torchtitan gathers it in high
precision, so tp holds copies there). ZeRO-3's gathered weight is the weight above
(gathered before the cast); pipeline stages split no tensor.
"""

from __future__ import annotations

from .heads import kv_layout

SCALINGS = ("tensorwise", "delayed", "rowwise", "mxfp8", "nvfp4")
# Blackwell's block-scaled recipes (`minitp.fp8.blocks`): a scale a block of values along the
# GEMM's reduction dimension, so, like rowwise, the backward casts again along the other axis
BLOCK_SCALINGS = {"mxfp8": 32, "nvfp4": 16}  # the values a scale covers
ROLES = ("input", "weight", "grad")  # grad: the output gradient
# rowwise's backward casts along the other axis (torchao's cast_config_weight_for_grad_input,
# _input_for_grad_weight, _grad_output_for_grad_weight)
RECASTS = ("weight_dgrad", "input_wgrad", "grad_wgrad")
LAYERS = ("column", "row")


def roles(scaling: str) -> tuple[str, ...]:
    """The casts a layer makes under `scaling`: three, or rowwise's six."""
    return ROLES + RECASTS if recasts(scaling) else ROLES


def recasts(scaling: str) -> bool:
    """Whether `scaling` scales along the reduction dimension, so the backward casts again."""
    return scaling == "rowwise" or scaling in BLOCK_SCALINGS


def check_fp8_scaling(scaling) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"fp8 must be one of {', '.join(SCALINGS)}, got {scaling!r}")


def check_fp8_blocks(cfg, scaling, tp: int = 1, cp: int = 1, tokens: int | None = None) -> None:
    """Block-scaled recipes: every block whole on one rank, as in one process. A block runs
    along a GEMM's reduction dimension, and each of a layer's dimensions is one (the
    forward's inputs, dgrad's outputs): so every width a rank holds, whole or its tp part
    (each of q, k and v apart), must be whole blocks, and under cp each of the 2·cp pieces of
    a sequence (wgrad sums over tokens), and `tokens`, a rank's microbatch (where known: the
    CLI; otherwise its cast refuses it). minitp refuses the rest rather than padding."""
    block = BLOCK_SCALINGS.get(scaling)
    if block is None:
        return
    widths = {"d_model": cfg.d_model, "the MLP's width": cfg.ffn_width,
              "the K/V width": cfg.kv_heads * cfg.head_dim}
    for name, width in widths.items():
        if width % (tp * block):
            raise ValueError(f"fp8 {scaling}: {name} {width} over tp={tp} is {width / tp:g} "
                             f"values a rank, not a whole number of blocks of {block} (a "
                             f"block would be cut; use widths that are multiples of tp·{block})")
    if cp > 1 and cfg.seq_len % (2 * cp * block):
        raise ValueError(f"fp8 {scaling}: cp={cp} cuts seq_len={cfg.seq_len} into {2 * cp} "
                         f"pieces that are not whole blocks of {block} tokens")
    if tokens is not None and tokens % block:
        raise ValueError(f"fp8 {scaling}: a rank's microbatch holds {tokens} tokens, not whole "
                         f"blocks of {block} (wgrad's reduction dimension)")


def check_fp8_model(cfg, tp: int = 1) -> None:
    """FP8 covers a dense model's blocks, every tensor cast whole: refuse what it does not."""
    if cfg.n_experts:
        raise ValueError("fp8 does not cover a mixture of experts (its expert GEMMs): "
                         "use a dense model")
    if cfg.vision_patches:
        raise ValueError("fp8 does not cover a vision-language model: use a text-only model")
    if cfg.n_kv_head is not None and kv_layout(cfg, tp) == "replicated":
        raise ValueError(f"fp8 with K/V heads replicated over tp={tp} (n_kv_head="
                         f"{cfg.n_kv_head}): each rank holds only part of a K/V projection's "
                         "output gradient (the replicas sum it later), so no rank can cast "
                         "it whole; use tp ≤ n_kv_head")


def split_axes(layer: str, role: str, sequence_parallel: bool) -> tuple[tuple, tuple]:
    """(axes splitting the tensor's leading dims, axes splitting its last dim) for the
    tensor `role` of a `layer` ("column" or "row") as its cast sees it (table above)."""
    if layer not in LAYERS or role not in ROLES:
        raise ValueError(f"layer must be one of {LAYERS} and role one of {ROLES}, "
                         f"got {layer!r}, {role!r}")
    if role == "weight":  # (d_out, d_in): column splits d_out (rows), row splits d_in (last)
        return (("tp",), ()) if layer == "column" else ((), ("tp",))
    batch = ("dp", "cp")  # activations and gradients: rows over dp, the sequence over cp
    if layer == "column" and role == "input":
        return (batch + ("tp",) if sequence_parallel else batch), ()
    if layer == "row" and role == "grad":
        return batch, ()
    return batch, ("tp",)  # column grad, row input: features split over tp


def amax_axes(layer: str, role: str, scaling: str, sequence_parallel: bool = False,
              local_scales: bool = False) -> tuple[str, ...]:
    """The mesh axes ("dp", "cp", "tp") the amax of this tensor is MAX-reduced over.

    >>> amax_axes("row", "input", "tensorwise")
    ('dp', 'cp', 'tp')
    >>> amax_axes("column", "input", "tensorwise", sequence_parallel=True)
    ('dp', 'cp', 'tp')
    >>> amax_axes("column", "input", "rowwise", sequence_parallel=True)
    ()

    >>> amax_axes("row", "input_wgrad", "rowwise")
    ('dp', 'cp')

    MXFP8 reduces nothing (every scale is one block's); NVFP4 only its tensor scale, over
    the axes that split the tensor as its cast sees it (a column layer's input cast after
    SP's all-gather, as rowwise; a re-cast is of the forward's tensor):

    >>> amax_axes("row", "input_wgrad", "nvfp4", sequence_parallel=True)
    ('dp', 'cp', 'tp')

    local_scales: the trap, each rank its own amax — nothing reduced."""
    check_fp8_scaling(scaling)
    if scaling in BLOCK_SCALINGS:
        if scaling == "mxfp8" or local_scales:
            return ()
        base = {"weight_dgrad": "weight", "input_wgrad": "input",
                "grad_wgrad": "grad"}.get(role, role)
        return sum(split_axes(layer, base, False), ())
    if role in RECASTS and scaling == "rowwise":
        # weight_dgrad: one scale a column of W, its amax over W's rows (split over tp in a
        # column layer); input_wgrad, grad_wgrad: one a feature, over the tokens (dp, cp)
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS}, got {layer!r}")
        axes = split_axes(layer, "weight", False)[0] if role == "weight_dgrad" else ("dp", "cp")
        return () if local_scales else axes
    leading, last = split_axes(layer, role, sequence_parallel)
    if local_scales:
        return ()
    return last if scaling == "rowwise" else leading + last


def amax_table(scaling: str, sequence_parallel: bool = False,
               local_scales: bool = False) -> list[tuple[str, str, tuple[str, ...]]]:
    """Every (layer, role, axes) of a block's linear layers: the rule, to print."""
    return [(layer, role, amax_axes(layer, role, scaling, sequence_parallel, local_scales))
            for layer in LAYERS for role in roles(scaling)]


def check_fp8_config(scaling, local_scales: bool = False, param_dtype: str | None = None,
                     tp_overlap: bool = False, recompute=None, all_gather: bool = False,
                     zero_stage: int = 0) -> None:
    """What FP8 (emulated) composes with, refused in one line before anything is built."""
    if all_gather and (scaling != "tensorwise" or zero_stage != 3):
        raise ValueError("fp8 all-gather sends ZeRO-3's weight shards in 8 bits with one scale "
                         "a weight: it needs fp8 tensorwise and zero_stage 3")
    if scaling is None:
        if local_scales:
            raise ValueError("fp8 local scales need an fp8 scaling (tensorwise, delayed or "
                             "rowwise)")
        return
    check_fp8_scaling(scaling)
    if param_dtype not in (None, "float32", "float64"):
        raise ValueError(f"fp8 emulation reads its casts back in the run's dtype, and "
                         f"{param_dtype} cannot hold them exactly: use float32 or float64")
    if tp_overlap:
        raise ValueError("fp8 does not compose with tp_overlap (its chunked GEMMs are not "
                         "cast)")
    if scaling == "delayed" and recompute == "full":
        raise ValueError("fp8 delayed scaling with full recomputation would record each "
                         "forward's amax twice: use tensorwise or rowwise, or recompute "
                         "selective")
