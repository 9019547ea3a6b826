"""Packed documents under context parallelism: the split's work counted per document, and
packing's two traps, each run on one device where a lesson can see it wrong, then right.

Work. Under the causal mask within documents, a query at position p of its document sees
p + 1 keys (itself and the p before it), so a cp rank's attention work is Σ (p + 1) over
the tokens it holds (`causal_work`). Unpacked, the load-balanced split (`cp_chunks`) gives
every rank the same sum; packed, the documents decide, and the ranks differ.

The traps (positions are where packing under cp goes wrong in practice: Megatron-LM pull
request #5243, "Fix packed THD RoPE under CP", merged in 2026, fixed cp ranks of a packed
batch turning later documents' tokens by the first document's positions):
* `positions_trap`: a packed row scored with positions 0..T−1 — as one long document,
  every token seeing the documents before its own, and numbered past its document's start
  — against the same row with positions restarting at each document, and against each
  document run alone;
* `unweighted_loss_trap`: each rank's mean loss averaged over the ranks, against each
  rank's sum and count added up (the token-weighted mean `ContextParallelLoss` and
  `train_step` compute), against the one-device mean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..rules import IGNORE_INDEX, cp_chunks


def rank_tokens(length: int, cp: int, rank: int) -> torch.Tensor:
    """The global indices of the tokens cp rank `rank` holds in a row of `length`: its two
    chunks of the load-balanced split."""
    c = length // (2 * cp)
    return torch.cat([torch.arange(k * c, (k + 1) * c) for k in cp_chunks(rank, cp)])


def causal_work(positions: torch.Tensor, cp: int) -> list[int]:
    """The (query, key) pairs each cp rank's queries attend to over a batch, rank 0 first:
    Σ (p + 1) over the positions p of the tokens it holds. `positions` (B, T): a packed
    batch's; an unpacked row's are 0..T−1 (``torch.arange(T)[None]``)."""
    return [int((positions[:, rank_tokens(positions.shape[1], cp, r)] + 1).sum())
            for r in range(cp)]


def positions_trap(model, x, y, positions) -> dict[str, float]:
    """The loss of a packed batch three ways (float): "positions 0..T-1" (the trap: the row
    as one document), "restarting" (the fix) and "one by one" (each document of each row
    alone, its targets' losses summed and divided by the batch's count: what the fix must
    equal)."""
    T = x.shape[1]
    with torch.no_grad():
        wrong = model(x, y, positions=torch.arange(T, device=x.device).expand_as(x))[1]
        right = model(x, y, positions=positions)[1]
        total, count = 0.0, int((y != IGNORE_INDEX).sum())
        for row in range(x.shape[0]):
            starts = [*torch.nonzero(positions[row] == 0).flatten().tolist(), T]
            if starts[0] != 0:  # a row that opens inside a document: that piece too
                starts.insert(0, 0)
            for a, b in zip(starts, starts[1:], strict=False):
                xs, ys = x[row:row + 1, a:b], y[row:row + 1, a:b]
                n = int((ys != IGNORE_INDEX).sum())
                if n:
                    total += float(model(xs, ys)[1]) * n
    return {"positions 0..T-1": float(wrong), "restarting": float(right),
            "one by one": total / count}


def unweighted_loss_trap(model, x, y, positions, ranks: int, axis: str = "cp") -> dict:
    """A packed batch's loss split over `ranks` ranks of `axis` ("cp": each row's tokens by
    the load-balanced split; "dp": the rows), on one device: "mean of means" (the trap:
    each rank's mean over its own targets, averaged over the ranks — a rank with none
    counts 0), "token-weighted" (the fix: the ranks' sums over their summed counts) and
    "one device" (the model's own loss). Also each rank's target count."""
    with torch.no_grad():
        logits, loss = model(x, y, positions=positions)
        each = F.cross_entropy(logits.flatten(0, 1).double(), y.flatten(),
                               ignore_index=IGNORE_INDEX, reduction="none").view_as(y)
    counted = y != IGNORE_INDEX
    if axis == "cp":
        parts = [(slice(None), rank_tokens(y.shape[1], ranks, r)) for r in range(ranks)]
    else:
        rows = y.shape[0] // ranks
        parts = [(slice(r * rows, (r + 1) * rows), slice(None)) for r in range(ranks)]
    sums = [float(each[rows, cols].sum()) for rows, cols in parts]
    counts = [int(counted[rows, cols].sum()) for rows, cols in parts]
    means = [s / n if n else 0.0 for s, n in zip(sums, counts, strict=True)]
    return {"mean of means": sum(means) / ranks, "token-weighted": sum(sums) / sum(counts),
            "one device": float(loss), "counts": counts}
