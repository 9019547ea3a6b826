"""The two known ways distributed Muon goes wrong, run on purpose, in one process (the ranks
are entries of a list: what goes wrong is arithmetic, not communication). Each returns how
far from the whole matrix's result it lands, beside its fix's distance (0 up to rounding).

* `partly_reduced` (DeepSpeed PR #8090, issue #7807): ZeRO-1/2 reduce-scatter the
  gradients, so a rank holds the summed gradient only on its own slice of the flat vector;
  the rest of a matrix that crosses a slice boundary is still its own, unreduced. Each rank
  orthogonalises a different matrix, keeps its slice of a different result, and no rank's
  equals the true one. The fix (`gather`): all-gather the reduced slices first.
* `row_shard` (Megatron-LM issue #5961): Newton–Schulz run on each tensor-parallel shard
  alone. Orthogonalising the blocks of a matrix is not orthogonalising the matrix: the
  Gram matrix lacks the other shards' terms and each block is normalised by its own norm.
  The fix (`newton_schulz_tp`): sum the Gram matrix over tp.
"""

from __future__ import annotations

import torch

from .newton_schulz import newton_schulz


def partly_reduced_matrices(local_grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """What each of the n ranks holds after a reduce-scatter of the flattened gradients
    (rank r's local gradient is ``local_grads[r]``): the sum on its r-th of n slices of the
    flat matrix, its own gradient everywhere else."""
    n, total = len(local_grads), torch.stack(local_grads).sum(0).reshape(-1)
    size = -(-total.numel() // n)
    out = []
    for r, g in enumerate(local_grads):
        m = g.reshape(-1).clone()
        m[r * size:(r + 1) * size] = total[r * size:(r + 1) * size]
        out.append(m.view_as(g))
    return out


def partly_reduced(local_grads: list[torch.Tensor], **ns) -> dict:
    """DeepSpeed #8090 measured: ``per_rank`` (each rank's Newton–Schulz result, max abs
    distance from the true one's), ``spread`` (the largest distance between two ranks'
    results), ``patchwork`` (the matrix ZeRO assembles, each rank's slice of its own
    result, against the true one), ``fixed`` (Newton–Schulz of the all-gathered reduced
    slices: the true matrix, the `gather` strategy)."""
    n = len(local_grads)
    true = newton_schulz(torch.stack(local_grads).sum(0), **ns)
    mine = [newton_schulz(m, **ns) for m in partly_reduced_matrices(local_grads)]
    size = -(-true.numel() // n)
    patch = torch.cat([o.reshape(-1)[r * size:(r + 1) * size] for r, o in enumerate(mine)])
    gathered = torch.cat([m.reshape(-1)[r * size:(r + 1) * size]
                          for r, m in enumerate(partly_reduced_matrices(local_grads))])
    return {"per_rank": [(o - true).abs().max().item() for o in mine],
            "spread": max((a - b).abs().max().item() for a in mine for b in mine),
            "patchwork": (patch.view_as(true) - true).abs().max().item(),
            "fixed": (newton_schulz(gathered.view_as(true), **ns) - true).abs().max().item()}


def row_shard(matrix: torch.Tensor, parts: int, dim: int = 0, **ns) -> dict:
    """Megatron #5961 measured: ``per_shard`` (each of `parts` blocks along `dim`,
    orthogonalised alone, against its block of the whole's result) and ``worst``."""
    true = newton_schulz(matrix, **ns)
    errors = [(newton_schulz(block, **ns) - part).abs().max().item()
              for block, part in zip(matrix.chunk(parts, dim), true.chunk(parts, dim),
                                     strict=True)]
    return {"per_shard": errors, "worst": max(errors)}


def drift(local_grad_fn, weight: torch.Tensor, ranks: int, steps: int = 3, lr: float = 0.02,
          **ns) -> list[list[float]]:
    """The copies drifting: `ranks` copies of `weight` (as replicas keep them), each rank's
    local gradient taken at its own copy, reduce-scattered, and each copy stepped by plain
    Muon (no momentum) with its rank's partly reduced matrix; one more copy stepped with the
    whole sum. ``local_grad_fn(w, r)``: rank r's local gradient at w. Returns per step, per
    rank, max |copy − correct|."""
    copies, correct, out = [weight.clone() for _ in range(ranks)], weight.clone(), []
    for _ in range(steps):
        held = partly_reduced_matrices([local_grad_fn(w, r) for r, w in enumerate(copies)])
        copies = [w - lr * newton_schulz(m, **ns) for w, m in zip(copies, held, strict=True)]
        whole = torch.stack([local_grad_fn(correct, r) for r in range(ranks)]).sum(0)
        correct = correct - lr * newton_schulz(whole, **ns)
        out.append([(w - correct).abs().max().item() for w in copies])
    return out
