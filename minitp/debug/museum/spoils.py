"""The museum's bugs in one training step, put in on purpose: each `spoil(model)` breaks a
rank's parallel model after `mt.parallelize` (as the lessons' traps do), each `patch()`
swaps one library function for the buggy one while the step runs and puts it back after
(a context manager: the ranks run several bugs one after another in one process).

What each one leaves out is the bug's whole story; `minitp.debug.museum.catalog` cites
where it was met.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ...model.llama_layers import Rotary
from ...model.moe import moe_layers
from ...sharding.tags import tag


def _without_partial_sum(model, leave_out) -> None:
    """The step's sum of partial gradients over tp, without the parameters `leave_out`
    picks (name -> bool): those stay this rank's part of the sum."""
    left = {id(p) for name, p in model.named_parameters() if leave_out(name)}
    partial = model.partial_grad_parameters
    model.partial_grad_parameters = lambda: [p for p in partial() if id(p) not in left]


def kv_replicas_not_summed(model) -> None:
    """tp exceeds the K/V heads: the ranks holding copies of one K/V head never sum their
    copies' gradients, so each copy steps by its own part."""
    _without_partial_sum(model, lambda name: name.endswith("attn.kv.weight"))


def norms_not_summed(model) -> None:
    """Under sequence parallelism each rank's norm weights see only its tokens: their
    gradients left as this rank's part (the LayerNorm all-reduce forgotten)."""
    _without_partial_sum(model, lambda name: any(part.startswith(("ln", "norm"))
                                                 for part in name.split(".")))


def encoder_not_summed(model) -> None:
    """The replicated vision encoder's gradients left as this rank's part under SP."""
    _without_partial_sum(model, lambda name: name.startswith("vision."))


def rope_at_local_positions(model) -> None:
    """Each cp rank rotates its chunks as if they started the sequence: 0, 1, 2, ..."""
    for module in model.modules():
        if isinstance(module, Rotary):
            module.positions = lambda length, dev: torch.arange(length, device=dev)
            module._tables.clear()


def packed_positions_of_the_first_row(model) -> None:
    """Under CP every row of a packed batch turned by the first row's positions: its
    documents' restarts, not the row's own (a constant shift within a document would be
    harmless, RoPE being relative; other rows' documents start elsewhere)."""
    for module in model.modules():
        if isinstance(module, Rotary):
            right = module.local
            module.local = lambda p, right=right: right(p[:1].expand_as(p))


def aux_statistics_local(model) -> None:
    """The MoE aux loss's per-sequence statistics from this rank's tokens alone."""
    for layer in moe_layers(model):
        layer.sequence.sum = lambda per_sequence: per_sequence
        layer.sequence.seq_len = lambda local: local


def _fp8_scales(model):
    for module in model.modules():
        scales = getattr(module, "fp8", None)
        if scales is not None and hasattr(scales, "scales"):
            yield module, scales


def amax_without_tp(model) -> None:
    """Every FP8 amax reduced over dp but not over tp: the tp ranks scale their pieces of
    one tensor apart."""
    for _, scales in _fp8_scales(model):
        for scale in scales.scales.values():
            scale.axes = tuple(a for a in scale.axes if a is not model.mesh.tp)


def sp_input_amax_local(model) -> None:
    """Under SP a column layer casts its input before the all-gather: its amax kept to
    this rank's part of the sequence (not reduced over tp)."""
    for module, scales in _fp8_scales(model):
        if tag(module.weight, "tp_split_dim") == 0:  # column-parallel: its output rows split
            scales.input.axes = tuple(a for a in scales.input.axes if a is not model.mesh.tp)


@contextmanager
def _swapped(owner, name: str, value):
    kept = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, kept)


def mean_of_means():
    """Each dp rank's loss the mean over its own tokens, the ranks' gradients averaged:
    a rank with fewer real targets (packing's padding) weighs as much as a full one."""
    from ...step import train

    right = train._my_microbatches

    def wrong(x, y, positions, mesh, microbatches):
        pairs, weights = right(x, y, positions, mesh, microbatches)
        return pairs, [1.0 / (mesh.dp.size * len(pairs))] * len(pairs)
    return _swapped(train, "_my_microbatches", wrong)


def layout_unchecked():
    """The pipeline layout's check that every layer is placed once, switched off."""
    from ...rules import layouts

    return _swapped(layouts, "check_every_layer_once", lambda placed, n_layer: None)
