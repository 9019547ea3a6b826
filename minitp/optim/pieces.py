"""Which elements of which matrix this rank steps: the map from a parallel model (at any
ZeRO stage) to Muon's matrices.

A *matrix* is one linear weight of the plain model. Tensor parallelism gives each tp rank
a block of it (its `shape`, split along `split_dim`; `dense_shape` is the whole's). ZeRO
then flattens those blocks with the rest of a unit (stages 2-3) or of the stage (stage 1),
and dp rank r steps the r-th contiguous slice of the flat vector: the elements ``ranges[r]
= [a, b)`` of the row-major block, perhaps none. At stage 0 every dp rank holds every
element (``ranges`` None). Everything else in the flat vector (embeddings, norms, biases,
padding) is the *rest*, which AdamW steps elementwise, as ZeRO always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..rules import model_chunks
from ..runtime.mesh import Axis
from ..sharding.tags import tag
from .muon import is_hidden_matrix


@dataclass
class Piece:
    """This rank's part of one matrix: elements [lo, hi) of `store` (a parameter, or a
    ZeRO shard, viewed flat) are elements ``ranges[rank]`` of the tp block."""

    name: str
    shape: tuple[int, int]        # this tp rank's block
    dense_shape: tuple[int, int]  # the plain model's matrix
    split_dim: int | None         # the block's tp split (None: whole on every tp rank)
    ranges: list[tuple[int, int]] | None  # per dp rank; None: every rank holds it all
    store: torch.Tensor
    lo: int
    hi: int
    # per-head split: orthogonalised in blocks of this many rows, each a head's (whole on
    # its tp rank, so such a piece counts as unsplit: no tp rank needs another's)
    block_rows: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def held(self, rank: int) -> tuple[int, int]:
        return (0, self.numel) if self.ranges is None else self.ranges[rank]

    def values(self) -> torch.Tensor:
        return self.store.detach().view(-1)[self.lo:self.hi]

    def grad(self) -> torch.Tensor:
        return self.store.grad.view(-1)[self.lo:self.hi]


def _split(p, module, tp: Axis, rows: dict[int, int]):
    """(tp split dim, block rows): a per-head-split projection is treated as unsplit."""
    if id(module) in rows:
        return None, rows[id(module)]
    return (tag(p, "tp_split_dim") if tp.size > 1 else None), None


def _dense(shape, split_dim, tp: Axis) -> tuple[int, int]:
    dense = list(shape)
    if split_dim is not None:
        dense[split_dim] *= tp.size
    return tuple(dense)


def module_paths(model) -> dict[int, str]:
    """id(module) -> its path ("blocks.0.attn.qkv", prefixed "chunk<i>." past the first
    chunk): to name a matrix in a message, whatever ZeRO-3 left registered."""
    return {id(m): (f"chunk{i}." if i else "") + n for i, c in enumerate(model_chunks(model))
            for n, m in c.named_modules()}


def _owners(model) -> dict[int, tuple[nn.Module, str]]:
    """id(parameter) -> (the module that owns it, its attribute), for ZeRO-1's flat lists."""
    return {id(p): (m, a) for c in model_chunks(model) for m in c.modules()
            for a, p in m._parameters.items() if p is not None}


def whole_pieces(model, tp: Axis, rows: dict[int, int]) -> tuple[list[Piece],
                                                                  list[nn.Parameter]]:
    """ZeRO stage 0: each matrix whole on every dp rank; the rest, its parameters. rows:
    id(module) -> block rows for the projections split per head (`head_rows`)."""
    pieces, rest, seen = [], [], set()
    paths = module_paths(model)
    for chunk in model_chunks(model):
        for module in chunk.modules():
            for attr, p in module._parameters.items():
                if p is None or id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                if not is_hidden_matrix(module, attr, p.shape):
                    rest.append(p)
                    continue
                split, block = _split(p, module, tp, rows)
                pieces.append(Piece(f"{paths[id(module)]}.{attr}", tuple(p.shape),
                                    _dense(p.shape, split, tp), split, None, p, 0, p.numel(),
                                    block))
    return pieces, rest


def flat_pieces(shard: torch.Tensor, axis: Axis, layout, tp: Axis,
                paths: dict[int, str], rows: dict[int, int]) -> tuple[list[Piece], list]:
    """One ZeRO flat vector, sharded over `axis`: the matrices' pieces this rank steps, and
    the [lo, hi) runs of its shard that are the rest. layout: (module, attr, parameter,
    offset, shape) for each parameter of the vector; rows as `whole_pieces`'s."""
    size = shard.numel()
    pieces, covered = [], []
    for module, attr, p, offset, shape in layout:
        if not is_hidden_matrix(module, attr, shape):
            continue
        numel = math.prod(shape)
        ranges = [(min(max(offset, r * size) - offset, numel),
                   max(min(offset + numel, (r + 1) * size) - offset, 0))
                  for r in range(axis.size)]
        ranges = [(a, max(a, b)) for a, b in ranges]
        a, b = ranges[axis.rank]
        lo = offset + a - axis.rank * size if b > a else 0
        split, block = _split(p, module, tp, rows)
        pieces.append(Piece(f"{paths[id(module)]}.{attr}", tuple(shape), _dense(shape, split, tp),
                            split, ranges, shard, lo, lo + b - a, block))
        if b > a:
            covered.append((lo, lo + b - a))
    rest, at = [], 0
    for lo, hi in sorted(covered) + [(size, size)]:
        if lo > at:
            rest.append((at, lo))
        at = max(at, hi)
    return pieces, rest


def zero_flats(model, optimizer) -> list[tuple[torch.Tensor, Axis, list]]:
    """(shard, axis, layout) for each flat vector a ZeRO optimizer (stages 1-3) steps a
    slice of, the layout in `flat_pieces`'s form."""
    if hasattr(optimizer, "flats"):  # stage 1: the flat lists know parameters only
        owners, out = _owners(model), []
        for flat in optimizer.flats:
            layout, offset = [], 0
            for p in flat.params:
                module, attr = owners[id(p)]
                layout.append((module, attr, p, offset, tuple(p.shape)))
                offset += p.numel()
            out.append((flat.shard, flat.axis, layout))
        return out
    return [(u.shard, u.dp, [(m, a, p, o, tuple(s)) for (m, a, p, o), s
                             in zip(u.layout, u.shapes, strict=True)]) for u in optimizer.units]
