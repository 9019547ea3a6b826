"""Newton–Schulz orthogonalisation, Muon's core (Jordan et al. 2024), on one device and
tensor-parallel.

`newton_schulz` is torch's ``torch.optim._muon._zeropower_via_newtonschulz`` (PyTorch 2.13)
op for op, except the dtype: torch casts to bfloat16, minitp computes in the input's
dtype unless asked (``dtype=torch.bfloat16`` reproduces torch bit for bit), so float64
runs are exact references. The quintic ``X <- aX + (bG + cG²)X`` with ``G = XXᵀ`` needs
the WHOLE matrix: ``G`` sums over every column, and the Frobenius norm it starts from
over every element. That is why ZeRO's flat shard, or a tensor-parallel row shard,
cannot run it alone (`minitp.optim.traps`).

`newton_schulz_tp` runs it on a matrix split over a tensor-parallel axis. Oriented so the
split runs along the columns, each rank's ``X_i Xᵢᵀ`` is one term of ``G`` (``G = Σ X_i
X_iᵀ``): one all-reduce of the Gram matrix per iteration, and ``X_i <- aX_i + (bG+cG²)X_i``
is then local. The Gram matrix is (unsplit dim)²: small when tp splits the long side (the
GPT's qkv, fc and both projections: d×d), large when it splits the short one.
"""

from __future__ import annotations

import math

import torch

from ..runtime import comm, trace
from ..runtime.mesh import Axis

# Keller Jordan's coefficients, as torch.optim.Muon (torch/optim/_muon.py, DEFAULT_A/B/C)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def _check(shape, coefficients, steps) -> None:
    if len(shape) != 2:
        raise ValueError(f"Newton-Schulz needs a 2-D matrix, got shape {tuple(shape)}")
    if len(coefficients) != 3 or not 0 < steps < 100:
        raise ValueError(f"Newton-Schulz: 3 coefficients and 1-99 steps, got "
                         f"{coefficients} and {steps}")


def _iterate(x: torch.Tensor, gram, coefficients, steps: int) -> torch.Tensor:
    a, b, c = coefficients
    for _ in range(steps):
        g = gram(x)
        update = torch.addmm(g, g, g, beta=b, alpha=c)  # bG + cG², as torch writes it
        x = torch.addmm(x, update, x, beta=a)
    return x


def newton_schulz(g: torch.Tensor, coefficients=NS_COEFFICIENTS, steps: int = NS_STEPS,
                  eps: float = NS_EPS, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The orthogonalised `g` (≈ UVᵀ of its SVD), in `dtype` (default: `g`'s)."""
    _check(g.shape, coefficients, steps)
    x = g.to(dtype or g.dtype)
    tall = g.size(0) > g.size(1)
    if tall:  # the Gram matrix of the short side: the cheap one
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    x = _iterate(x, lambda y: y @ y.T, coefficients, steps)
    return x.T if tall else x


def newton_schulz_blocks(g: torch.Tensor, block_rows: int | None, coefficients=NS_COEFFICIENTS,
                         steps: int = NS_STEPS, eps: float = NS_EPS,
                         dtype: torch.dtype | None = None) -> torch.Tensor:
    """`newton_schulz` of each block of `block_rows` rows alone (None: the whole `g`): the
    per-head split of an attention projection whose rows run head by head ("Muon Split")."""
    rows = block_rows or g.shape[0]
    if g.shape[0] % rows:
        raise ValueError(f"per-head split: {g.shape[0]} rows are not blocks of {rows}")
    return torch.cat([newton_schulz(b, coefficients, steps, eps, dtype) for b in g.split(rows)])


def newton_schulz_tp(local: torch.Tensor, split_dim: int, axis: Axis,
                     coefficients=NS_COEFFICIENTS, steps: int = NS_STEPS,
                     eps: float = NS_EPS) -> torch.Tensor:
    """This rank's part of the orthogonalised whole, from its part `local` of a matrix
    split along `split_dim` over `axis`: the Gram matrix over the unsplit side, summed over
    `axis` (one all-reduce per iteration, and one of the squared norm)."""
    _check(local.shape, coefficients, steps)
    x = local.T if split_dim == 0 else local  # the split now runs along the columns
    with trace.label("muon tp norm"):
        square = comm.all_reduce(x.square().sum().reshape(1), axis)
    x = x / square.sqrt().clamp(min=eps)

    def gram(y):
        with trace.label("muon tp gram"):
            return comm.all_reduce(y @ y.T, axis)

    x = _iterate(x, gram, coefficients, steps)
    return x.T if split_dim == 0 else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape) -> float:
    """torch's ``_adjust_lr``: "original" (None) scales by √max(1, A/B), Keller Jordan's;
    "match_rms_adamw" by 0.2·√max(A, B), Moonlight's (Liu et al. 2025, arXiv 2502.16982)
    so AdamW's lr and weight decay carry over. Always of the WHOLE matrix's shape."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', "
                     f"got {adjust_lr_fn!r}")
