"""Context parallelism's load-balanced split: the sequence cut into 2·cp chunks, rank r
holding chunks r and 2·cp − 1 − r, so every rank has the same share of the causal
mask's work; and each rank's global positions. One rule, used for tokens, positions
and the ring's blocks (see `minitp.context_parallel`)."""

from __future__ import annotations

import torch

from ..rules import SEQ_DIM, cp_chunks
from ..runtime import comm
from ..runtime.mesh import Axis


def chunk_order(cp: int) -> list[int]:
    """The sequence's 2·cp chunks in the order the cp ranks hold them, rank 0 first:
    cp=2 -> [0, 3, 1, 2]."""
    return [c for r in range(cp) for c in cp_chunks(r, cp)]


def split_sequence(t: torch.Tensor, cp: Axis, dim: int = SEQ_DIM) -> torch.Tensor:
    """This cp rank's two chunks of `t` along `dim`, early one first (no communication)."""
    if cp.size == 1:
        return t
    if t.shape[dim] % (2 * cp.size):
        raise ValueError(f"a sequence of {t.shape[dim]} tokens cannot be cut into 2*cp="
                         f"{2 * cp.size} equal chunks for context parallelism")
    chunks = t.chunk(2 * cp.size, dim=dim)
    return torch.cat([chunks[c] for c in cp_chunks(cp.rank, cp.size)], dim=dim)


def merge_sequence(parts: list[torch.Tensor], dim: int = SEQ_DIM) -> torch.Tensor:
    """The inverse of `split_sequence`: every cp rank's part (rank 0's first) back
    into the whole sequence."""
    cp = len(parts)
    if cp == 1:
        return parts[0]
    halves = [h for part in parts for h in part.chunk(2, dim=dim)]  # in chunk_order(cp)
    whole = [None] * (2 * cp)
    for chunk, half in zip(chunk_order(cp), halves, strict=True):
        whole[chunk] = half
    return torch.cat(whole, dim=dim)


def gather_sequence(t: torch.Tensor, cp: Axis, dim: int = SEQ_DIM) -> torch.Tensor:
    """The whole sequence on every cp rank, from each rank's `split_sequence` part
    (an all-gather over cp, then `merge_sequence`)."""
    if cp.size == 1:
        return t
    gathered = comm.all_gather(t.movedim(dim, 0), cp).movedim(0, dim)
    return merge_sequence(list(gathered.chunk(cp.size, dim=dim)), dim)


def global_positions(local: int, cp: Axis, device=None) -> torch.Tensor:
    """The positions in the whole sequence of this cp rank's `local` tokens."""
    c = local // 2
    return torch.cat([torch.arange(k * c, (k + 1) * c, device=device)
                      for k in cp_chunks(cp.rank, cp.size)])
