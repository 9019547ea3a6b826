"""The one-process FP8 model: a plain GPT whose blocks' linear layers compute in FP8.

`convert(gpt, "tensorwise")` turns every ``nn.Linear`` inside the transformer blocks
(attention's qkv and proj, the MLP's fc and proj: the GEMMs that hold nearly all the
FLOPs) into an `Fp8Linear`, in place: the same parameters, the same names, its three casts
added (`minitp.fp8.casts`). The model itself holds no parallel code and no FP8 code:
this module only changes the class of those layers.

What stays in the run's dtype, by design (and checked by tests/fp8/test_high_precision.py):

* the token and position embeddings, the tied output layer and the loss (the logits' last
  GEMM is the most sensitive one: TransformerEngine and torchtitan keep it out of FP8 too);
* the LayerNorms, the attention core (scores, softmax, ·V), GELU, dropout, the residual sums;
* the parameters themselves — the master weights the optimizer steps — and the optimizer's
  state: only the *copies* a GEMM reads are cast, every step, from the masters.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from ..rules import layer_label
from ..rules.fp8_groups import check_fp8_blocks, check_fp8_model, check_fp8_scaling
from .casts import LayerScales
from .scaling import DEFAULT_HISTORY


def _gemm(x, weight, bias):
    return F.linear(x, weight, bias)


class Fp8Linear(nn.Linear):
    """``nn.Linear`` whose GEMMs read FP8 operands: x and W in e4m3 forward, the output
    gradient in e5m2 backward, or e4m3 under rowwise (``self.fp8``: its `LayerScales`, no
    axes: one process)."""

    fp8: LayerScales

    def forward(self, x):
        return self.fp8.linear(self.fp8.cast_input(x), self.weight, self.bias, _gemm)


def block_linears(model: nn.Module):
    """(layer index, name inside the block, module) of every linear layer in the blocks."""
    for index, block in enumerate(model.blocks):
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) or hasattr(module, "fp8"):
                yield index, name, module


def convert(model: nn.Module, scaling: str, history_len: int = DEFAULT_HISTORY) -> nn.Module:
    """Make every block's linear layer of the plain GPT `model` an `Fp8Linear` with
    `scaling` ("tensorwise", "delayed", "rowwise", "mxfp8" or "nvfp4"), in place; returns
    `model`."""
    check_fp8_scaling(scaling)
    check_fp8_model(model.cfg)
    check_fp8_blocks(model.cfg, scaling)
    for index, name, module in block_linears(model):
        module.__class__ = Fp8Linear
        module.fp8 = LayerScales(scaling, None, history_len, f"{layer_label(index)}.{name}")
    return model


def fp8_layers(model: nn.Module) -> dict[str, LayerScales]:
    """Every module of `model` that computes in FP8, by name, with its scales."""
    return {name: m.fp8 for name, m in model.named_modules() if getattr(m, "fp8", None)}
