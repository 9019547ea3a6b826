"""Muon over a parallel model: the optimizer `mt.make_optimizer(model, mesh, "muon",
strategy=...)` returns, at every ZeRO stage.

What stays elementwise stays on the shard, as ZeRO always did: the momentum (one buffer,
this rank's elements of each matrix only), the weight decay, the update's application, and
AdamW for the rest. Only Newton–Schulz needs the whole matrix, and a strategy
(`minitp.optim.strategies`) brings it there and back. At stages 1-3 this is the *inner*
optimizer of minitp's ZeRO optimizers (which reduce-scatter the gradients before, and
gather the parameters after, as for Adam); at stage 0 it steps the model's parameters.
"""

from __future__ import annotations

from collections import ChainMap

import torch

from ..calc.footprint.muon import ns_flops
from ..mixed_precision import is_mixed
from ..rules import model_chunks
from ..runtime.mesh import Axis, Mesh
from .muon import (
    MUON_DEFAULTS,
    apply_update,
    check_muon_options,
    check_qkv_split,
    head_rows,
    lr_shape,
    momentum_input,
    split_options,
)
from .newton_schulz import newton_schulz_blocks, newton_schulz_tp
from .pieces import flat_pieces, module_paths, whole_pieces, zero_flats
from .strategies import ORTHOGONALISE, STRATEGIES


class DistributedMuon:
    """Muon over `pieces` (this rank's elements of each matrix), AdamW over `rest` (whole
    parameters at stage 0; at stages 1-3, runs of the shards: (shard, lo, hi)).

    ``ns_flops``: the Newton–Schulz FLOPs this rank computed in its last step (counted as
    they run, not modelled: duplicated under gather, spread under owner)."""

    is_muon = True  # `minitp.checkpoint` writes its state by `minitp.optim.state`

    def __init__(self, pieces, rest, dp: Axis, tp: Axis, strategy: str, **options):
        muon_options, adamw_options = split_options(options)
        self.group = check_muon_options(muon_options)
        self.group["params"] = []  # the pieces are no parameters of their own
        self.pieces, self.dp, self.tp, self.strategy = pieces, dp, tp, strategy
        self.runs = [r for r in rest if isinstance(r, tuple)]
        params = [r for r in rest if not isinstance(r, tuple)]
        self.views = [shard.detach()[lo:hi] for shard, lo, hi in self.runs]
        adamw_options.setdefault("lr", self.group["lr"])
        self.adamw = (torch.optim.AdamW(params + self.views, **adamw_options)
                      if params or self.views else None)
        self.momentum = [torch.zeros_like(p.values()) for p in pieces]
        self.ns_flops = 0
        self.param_groups = [self.group] + (self.adamw.param_groups if self.adamw else [])
        # every state tensor, live (`state_numel`, the memory ledger): one momentum per
        # matrix element held, AdamW's two per other element
        self.state = ChainMap({("muon", p.name): {"momentum_buffer": m}
                               for p, m in zip(pieces, self.momentum, strict=True)},
                              self.adamw.state if self.adamw else {})

    def state_dict(self) -> dict:
        return {"momentum": [m.clone() for m in self.momentum],
                "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state: dict) -> None:
        """This rank's state back, as `state_dict` gave it (the same mesh and ZeRO stage)."""
        for m, saved in zip(self.momentum, state["momentum"], strict=True):
            m.copy_(saved)
        if self.adamw is not None:
            self.adamw.load_state_dict(state["adamw"])

    def ns(self, piece, dense: torch.Tensor) -> torch.Tensor:
        g, rows = self.group, piece.block_rows or dense.shape[0]
        self.ns_flops += ns_flops(rows, dense.shape[1], g["ns_steps"]) * (dense.shape[0] // rows)
        return newton_schulz_blocks(dense, piece.block_rows, g["ns_coefficients"], g["ns_steps"],
                                    g["eps"], g["ns_dtype"])

    def ns_tp(self, piece, block: torch.Tensor) -> torch.Tensor:
        g = self.group
        self.ns_flops += ns_flops(*piece.dense_shape, steps=g["ns_steps"], split=self.tp.size,
                                  split_dim=piece.split_dim)
        return newton_schulz_tp(block, piece.split_dim, self.tp, g["ns_coefficients"],
                                g["ns_steps"], g["eps"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.adamw is not None:
            self.adamw.zero_grad(set_to_none=set_to_none)
        for piece in self.pieces:
            piece.store.grad = None

    @torch.no_grad()
    def step(self) -> None:
        g = self.group
        inputs = [momentum_input(p.grad(), m, g["momentum"], g["nesterov"])
                  for p, m in zip(self.pieces, self.momentum, strict=True)]
        self.ns_flops = 0
        updates = ORTHOGONALISE[self.strategy](self, inputs)
        for piece, update in zip(self.pieces, updates, strict=True):
            apply_update(piece.values(), update, g, lr_shape(piece.dense_shape, piece.block_rows))
        for view, (shard, lo, hi) in zip(self.views, self.runs, strict=True):
            view.grad = shard.grad[lo:hi]
        if self.adamw is not None:
            self.adamw.step()


def check_muon(model, mesh: Mesh, strategy: str) -> None:
    """Refuse, in one line, what Muon cannot do here (before anything is built)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"muon strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "tp" and mesh.tp.size == 1:
        raise ValueError("muon strategy 'tp' orthogonalises tp-split matrices: it needs tp > 1 "
                         "(use 'gather' or 'owner')")
    if is_mixed(model):
        raise TypeError("muon: a mixed-precision (bfloat16) model is not supported yet; "
                        "build it in float32 or float64")


def make_muon(model, mesh: Mesh, zero_optimizer=None, strategy: str = "gather",
              qkv_split: str | None = None, **options):
    """Muon (hidden matrices) and AdamW (the rest) for a model from ``mt.parallelize``: a
    `DistributedMuon` over the parameters (ZeRO stage 0, `zero_optimizer` None), or put
    inside `zero_optimizer`, the ZeRO optimizer of the model's stage (1-3), in place of its
    inner optimizer. Options: Muon's (`MUON_DEFAULTS`) and AdamW's prefixed ``adamw_``;
    ``qkv_split="heads"``: the attention projections orthogonalised head by head.
    Called by ``mt.make_optimizer(model, mesh, "muon", strategy=..., **options)``."""
    check_muon(model, mesh, strategy)
    check_qkv_split(qkv_split)
    rows = {k: v for c in model_chunks(model) for k, v in head_rows(c).items()} if qkv_split else {}
    if zero_optimizer is None:
        pieces, rest = whole_pieces(model, mesh.tp, rows)
        # the dp ranks all hold every matrix: gather has nothing to gather over dp, owner
        # still spreads the Newton–Schulz work over them
        return DistributedMuon(pieces, rest, mesh.dp_cp, mesh.tp, strategy, **options)
    paths, pieces, rest, axes = module_paths(model), [], [], {}
    for shard, axis, layout in zero_flats(model, zero_optimizer):
        found, runs = flat_pieces(shard, axis, layout, mesh.tp, paths, rows)
        pieces += found
        rest += [(shard, lo, hi) for lo, hi in runs]
        axes.update({axis.ranks: axis} if found else {})
    if len(axes) > 1:
        raise ValueError("muon: matrices sharded over two different groups (expert matrices "
                         "under ZeRO) are not supported yet")
    dp = next(iter(axes.values()), mesh.dp_cp)
    outer = zero_optimizer
    outer.inner = DistributedMuon(pieces, rest, dp, mesh.tp, strategy, **options)
    outer.param_groups, outer.state = outer.inner.param_groups, outer.inner.state
    return outer


__all__ = ["MUON_DEFAULTS", "DistributedMuon", "check_muon", "make_muon"]
