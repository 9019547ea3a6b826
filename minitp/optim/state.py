"""Muon's state in the form `minitp.checkpoint` writes and reshards: per stepped tensor.

A dense checkpoint holds, for each of the plain model's parameters, tensors shaped like it
(Adam's ``exp_avg`` and ``exp_avg_sq``). Muon's state is elementwise too — one momentum per
element of a matrix, AdamW's two per element of the rest — but it lives in pieces: a
momentum per `Piece` (its elements [lo, hi) of a parameter or a ZeRO shard), AdamW's state
per whole parameter (stage 0) or per run of a shard (stages 1-3). `by_tensor` lays it out
over the tensors an Adam optimizer of the same model would step (the parameters, or ZeRO's
flat shards), each key shaped like its tensor and zero where another optimizer steps the
element: ``momentum_buffer`` on the matrices, ``exp_avg``/``exp_avg_sq`` on the rest. The
checkpoint then gathers and cuts it exactly as it does Adam's; `load_tensors` puts a rank's
cut back, and `load_one_process` puts the dense form into `muon_with_adamw`'s optimizers.
"""

from __future__ import annotations

import torch

from .muon import Combined, Muon

MOMENTUM = "momentum_buffer"
KEYS = (MOMENTUM, "exp_avg", "exp_avg_sq")


def stores(model, optimizer) -> list[torch.Tensor]:
    """The tensors Muon's pieces and AdamW's runs live in, in the order an Adam optimizer
    made by `mt.make_optimizer` for the same model steps its own (`zero.stepped_tensors`)."""
    from ..data_parallel.zero import ZeroOptimizerBase
    from .pieces import zero_flats

    if not isinstance(optimizer, ZeroOptimizerBase):
        return list(model.parameters())
    return [shard for shard, _, _ in zero_flats(model, optimizer)]


def _adamw_tensors(muon):
    """(AdamW's tensor, the store it is part of, lo, hi): whole parameters (stage 0) and
    runs of the shards (stages 1-3)."""
    runs = list(zip(muon.views, muon.runs, strict=True))
    whole = [p for g in (muon.adamw.param_groups if muon.adamw else []) for p in g["params"]
             if all(p is not view for view, _ in runs)]
    return ([(p, p, 0, p.numel()) for p in whole]
            + [(view, shard, lo, hi) for view, (shard, lo, hi) in runs])


def by_tensor(model, optimizer) -> dict[torch.Tensor, dict]:
    """{store: {"step": AdamW's step, key: tensor shaped like the store}} for every key of
    `KEYS` (the state `zero.per_parameter_state` gathers into the dense form)."""
    muon = getattr(optimizer, "inner", optimizer)
    tensors = _adamw_tensors(muon)
    adamw = [muon.adamw.state.get(t, {}) for t, *_ in tensors]
    if any("exp_avg" not in s for s in adamw):
        raise ValueError("checkpoint: AdamW has no state yet: take a step before saving")
    step = adamw[0]["step"] if adamw else torch.tensor(0.0)
    out = {id(s): {"step": step, **{k: torch.zeros_like(s.detach()) for k in KEYS}}
           for s in stores(model, optimizer)}
    for piece, m in zip(muon.pieces, muon.momentum, strict=True):
        out[id(piece.store)][MOMENTUM].view(-1)[piece.lo:piece.hi] = m
    for (_, store, lo, hi), s in zip(tensors, adamw, strict=True):
        for k in KEYS[1:]:
            out[id(store)][k].view(-1)[lo:hi] = s[k].reshape(-1)
    return {s: out[id(s)] for s in stores(model, optimizer)}


def load_tensors(model, optimizer, values: dict[str, list[torch.Tensor]],
                 step: torch.Tensor) -> None:
    """This rank's state back from `values` (key -> one tensor per store, in `stores`'
    order: what `minitp.checkpoint` cuts from the dense form)."""
    muon = getattr(optimizer, "inner", optimizer)
    index = {id(s): i for i, s in enumerate(stores(model, optimizer))}
    for piece, m in zip(muon.pieces, muon.momentum, strict=True):
        m.copy_(values[MOMENTUM][index[id(piece.store)]].view(-1)[piece.lo:piece.hi])
    for t, store, lo, hi in _adamw_tensors(muon):
        muon.adamw.state[t] = {"step": step.clone(), **{
            k: values[k][index[id(store)]].reshape(-1)[lo:hi].reshape(t.shape).clone()
            for k in KEYS[1:]}}


def load_one_process(ref, optimizer: Combined, dense: dict) -> None:
    """The dense state into `muon_with_adamw(ref)`'s two optimizers, by parameter name."""
    muon_params = {id(p) for o in optimizer.optimizers if isinstance(o, Muon)
                   for g in o.param_groups for p in g["params"]}
    for o in optimizer.optimizers:
        for name, p in ref.named_parameters():
            if any(p is q for g in o.param_groups for q in g["params"]):
                o.state[p] = ({MOMENTUM: dense[MOMENTUM][name].clone().to(p)}
                              if id(p) in muon_params else
                              {"step": dense["step"].clone(),
                               **{k: dense[k][name].clone().to(p) for k in KEYS[1:]}})
