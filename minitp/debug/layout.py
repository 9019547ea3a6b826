"""Which part of one device's tensor a rank holds: the rules `first_divergence` compares by.

A rank's module sees its part of the step, and its output is one of these (the rules the
library already has: `minitp.step.train_step`'s batch split, `minitp.context_parallel`'s
load-balanced chunks, sequence parallelism's contiguous shards, `minitp.sharding.dense`'s
tp split dims):

* rows: data-parallel rank d holds rows [d·B/dp, (d+1)·B/dp) of the global batch, its
  microbatches one after another (the calls are joined in order);
* the sequence (a dimension of size T that is neither the first nor the last): cp rank i
  holds chunks i and 2cp−1−i, and under sequence parallelism tp rank j the j-th contiguous
  piece of those; a tensor of tokens flattened into rows, (B·T, …), is read as (B, T, …);
* any other dimension that differs: tp rank j's contiguous j-th slice — a column-parallel
  layer's output features, a head split, the vocabulary (padded: the padding is dropped).

What is not compared, because no slice of one device's tensor is it: a rank's replicated
K/V head where tp exceeds the K/V heads (its copy is not the j-th slice), a column-parallel
layer's input gradient where its input was mapped once for two layers (`ParallelInput`:
that gradient is this rank's partial sum, completed only in the mapping's all-reduce), the
experts' rows (grouped by expert), Ulysses' heads split over cp, and a scalar (the loss)
where the rank holds only some rows. Those are still covered: the first tensor that
depends on them and is comparable departs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..context_parallel.packed import rank_tokens
from ..sharding.tags import tag


@dataclass(frozen=True)
class Place:
    """Where a rank sits and what the global step is: B rows of T tokens, V the vocabulary."""

    rows: int
    seq_len: int
    vocab: int
    dp: int = 1
    dp_rank: int = 0
    cp: int = 1
    cp_rank: int = 0
    tp: int = 1
    tp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0
    microbatches: int = 1

    @property
    def whole_batch(self) -> bool:
        """This rank's loss is the batch's: it holds every row, in one call."""
        return self.dp == 1 and self.microbatches == 1

    def tokens(self) -> torch.Tensor:
        """The positions of the sequence this rank's cp rank holds."""
        if self.cp == 1:
            return torch.arange(self.seq_len)
        return rank_tokens(self.seq_len, self.cp, self.cp_rank)


def in_row_order(calls: list[torch.Tensor], order: torch.Tensor | None, place: Place):
    """One device's calls joined along rows; `order` (the global row of each joined row)
    puts microbatches run out of row order (the one-process FP8 step's) back in order."""
    joined = torch.cat(calls) if len(calls) > 1 else calls[0]
    if order is None or joined.dim() == 0:
        return joined
    back = torch.argsort(order)
    if joined.shape[0] == place.rows:
        return joined.index_select(0, back)
    if joined.shape[0] == place.rows * place.seq_len:
        return joined.unflatten(0, (place.rows, -1)).index_select(0, back).flatten(0, 1)
    return joined


def local_part(ref: torch.Tensor, local: torch.Tensor, place: Place):
    """(one device's part this rank holds, the rank's own) of the same shape, or None where
    the rank's tensor is no slice of one device's (see the module)."""
    if ref.dim() == 0 or local.dim() == 0:
        return (ref, local) if ref.shape == local.shape and place.whole_batch else None
    B, T = place.rows, place.seq_len
    mine = B // place.dp
    if ref.shape[0] == B:
        pass
    elif T > 1 and ref.shape[0] == B * T and local.shape[0] % mine == 0:  # tokens as rows
        ref, local = ref.unflatten(0, (B, T)), local.unflatten(0, (mine, -1))
    else:  # no rows of the batch: comparable only where the rank runs all of it
        whole = place.whole_batch and place.cp == 1
        return (ref, local) if whole and ref.shape == local.shape else None
    if local.shape[0] != mine:
        return None
    ref = ref.narrow(0, place.dp_rank * mine, mine)
    for d in range(1, ref.dim()):
        n, full = local.shape[d], ref.shape[d]
        if n == full:
            continue
        if d < ref.dim() - 1 and full == T:  # the sequence
            held = place.tokens()
            if n * place.tp == len(held):  # sequence parallelism: this tp rank's piece
                held = held[place.tp_rank * n:(place.tp_rank + 1) * n]
            if n != len(held):
                return None
            ref = ref.index_select(d, held.to(ref.device))
        elif d == ref.dim() - 1 and full == place.vocab and n == -(-full // place.tp):
            start = place.tp_rank * n  # the padded vocabulary: the padding is not compared
            keep = max(0, min(n, full - start))
            ref, local = ref.narrow(d, min(start, full), keep), local.narrow(d, 0, keep)
        elif n * place.tp == full:  # features or heads split over tp
            ref = ref.narrow(d, place.tp_rank * n, n)
        else:
            return None
    return (ref, local) if ref.shape == local.shape else None


def param_part(ref_grad: torch.Tensor, param, place: Place) -> torch.Tensor:
    """The part of one device's gradient that this rank's parameter holds (its tags)."""
    dim = tag(param, "ep_split_dim")
    if dim is not None:
        n = param.shape[dim]
        ref_grad = ref_grad.narrow(dim, place.ep_rank * n, n)
    dim = tag(param, "tp_split_dim")
    if dim is not None:
        n = param.shape[dim]
        start = min(place.tp_rank * n, ref_grad.shape[dim])
        ref_grad = ref_grad.narrow(dim, start, max(0, min(n, ref_grad.shape[dim] - start)))
    return ref_grad
