"""Checks for ex06: SUMMA's backward, the gradients of a 2D tensor-parallel linear layer.

On q × q grids of real processes (q = 2 and 3), in float64: every rank gets its block
of a random output gradient dY and what the forward saved (X_i· gathered along its
grid row, W_·jᵀ along its grid column), calls the learner's ``summa_backward``, and
its three blocks are compared with the dense layer's gradients from autograd:

* dX_ij, (T/q, d_in/q); dW_ijᵀ, (d_out/q, d_in/q), nn.Linear's layout; db_j;
* the collectives it made, from the trace: a reduce-scatter along the row, one along
  the column, an all-reduce along the column, and nothing else.

A wrong block is matched against the usual mistakes, each computed densely (no
collective needed): the sum taken along the other grid axis, no sum at all (this
rank's own term), the whole row's block kept (an all-reduce where a reduce-scatter
belongs), the weight's gradient in X·dY's layout (not transposed back).
"""

from __future__ import annotations

import torch

from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...tensor_parallel.two_d import Grid
from .base import Check, run_per_size

WORLD_SIZES = (4, 9)  # q = 2 and 3
TOLERANCE = 1e-12  # float64
T, D_IN, D_OUT = 6, 12, 18  # tokens, d_in, d_out: 2 and 3 divide each, and no two are equal
WANTED = [("reduce_scatter", "row"), ("reduce_scatter", "col"), ("all_reduce", "col")]


def _dense(q):
    g = torch.Generator().manual_seed(14)
    x, dy = (torch.randn(T, D_IN, generator=g, dtype=torch.float64),
             torch.randn(T, D_OUT, generator=g, dtype=torch.float64))
    w = torch.randn(D_OUT, D_IN, generator=g, dtype=torch.float64)  # nn.Linear's layout
    return x, w, dy


def _block(m, i, j, q):
    return m.chunk(q, 0)[i].chunk(q, 1)[j]


def _in_rank(summa_backward):
    """Runs on every rank: the learner's backward on this rank's blocks."""
    grid = Grid()
    q, i, j = grid.q, grid.i, grid.j
    x, w, dy = _dense(q)
    dx, dw, db = dy @ w, dy.T @ x, dy.sum(0)  # the dense layer's gradients (Y = X Wᵀ + b)
    x_row = x.chunk(q, 0)[i]  # X_i·, what the forward gathered along the row
    w_col = w.chunk(q, 0)[j]  # W_·jᵀ, gathered along the column: (d_out/q, d_in)
    grad = _block(dy, i, j, q)
    # What the usual mistakes give, computed densely: every rank's term, summed the
    # other way (along the column: the ranks (i', j)) or not at all.
    dx_terms = {k: _block(dy, k, j, q) @ w_col for k in range(q)}  # rank (k, j)'s dX term
    dw_terms = {k: _block(dy, i, k, q).T @ x_row for k in range(q)}  # rank (i, k)'s dW term
    mistakes = {
        "grad_x": {"summed along the grid column": sum(dx_terms.values()).chunk(q, 1)[i],
                   "not summed: this rank's own term": (grad @ w_col).chunk(q, 1)[j],
                   "the whole row block kept": dx.chunk(q, 0)[i]},
        "grad_w": {"summed along the grid row": sum(dw_terms.values()).chunk(q, 1)[j],
                   "not summed: this rank's own term": (grad.T @ x_row).chunk(q, 1)[i],
                   "in X·dY's layout, not nn.Linear's": _block(dw, j, i, q).T},
        "grad_b": {"not summed: this rank's tokens only": grad.sum(0),
                   "summed along the grid row": sum(_block(dy, i, k, q).sum(0)
                                                    for k in range(q))},
    }
    want = {"grad_x": _block(dx, i, j, q), "grad_w": _block(dw, j, i, q),
            "grad_b": db.chunk(q)[j]}
    first = len(trace.events())
    got = summa_backward(grad.to(device()), x_row.to(device()), w_col.to(device()), grid)
    made = [(e.op, e.axis) for e in trace.events()[first:]]
    found = {"made": made, "shapes": {k: tuple(v.shape) for k, v in want.items()}}
    if not (isinstance(got, tuple | list) and len(got) == 3
            and all(isinstance(t, torch.Tensor) for t in got)):
        found["problem"] = "did not return three tensors (grad_x, grad_w, grad_b)"
        return found
    for (name, reference), tensor in zip(want.items(), got, strict=True):
        tensor = tensor.detach().double().cpu()
        entry = {"shape": tuple(tensor.shape)}
        if tensor.shape == reference.shape:
            entry["error"] = (tensor - reference).abs().max().item()
        entry["mistakes"] = [words for words, m in mistakes[name].items()
                             if m.shape == tensor.shape
                             and (m - tensor).abs().max().item() <= TOLERANCE]
        found[name] = entry
    return found


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.summa_backward, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="summa_backward",
                        size="N")


def _names(n) -> list[str]:
    q = {4: 2, 9: 3}[n]
    return [f"q={q}: grad_x is this rank's block dX_ij", f"q={q}: grad_w is its weight block's",
            f"q={q}: grad_b is db_j", f"q={q}: one reduce-scatter along the row, one along "
            "the column, one all-reduce along the column"]


HINTS = {
    "grad_x": "dY_ij @ w_col is this rank's term of dX for all of row block i: the terms of "
              "grid row i must be summed, each rank keeping its own d_in block",
    "grad_w": "dY_ijᵀ @ x_row is this rank's term of dWᵀ for all of column block j: the terms "
              "of grid column j must be summed, each rank keeping its own d_in block",
    "grad_b": "b_j is added on every rank of grid column j, each on its own tokens",
}


def _judge(n, names, per_rank) -> list[Check]:
    for rank, found in enumerate(per_rank):
        if "problem" in found:
            return [Check(names[0], False, f"rank {rank}: {found['problem']}", rank=rank)] + [
                Check(name, False, "not checked: see above") for name in names[1:]]
    checks = [_gradient(name, key, per_rank) for name, key
              in zip(names[:3], ("grad_x", "grad_w", "grad_b"), strict=True)]
    return checks + [_collectives(names[3], per_rank)]


def _gradient(name, key, per_rank) -> Check:
    worst = 0.0
    for rank, found in enumerate(per_rank):
        entry, want = found[key], found["shapes"][key]
        if entry["shape"] != want:
            why = f" ({entry['mistakes'][0]})" if entry["mistakes"] else ""
            return Check(name, False, f"rank {rank}: {key} has shape {entry['shape']}, "
                         f"expected {want}{why}", rank=rank, tensor=key, hint=HINTS[key])
        if entry["error"] > TOLERANCE:
            why = (f": {entry['mistakes'][0]}" if entry["mistakes"]
                   else f": largest error {entry['error']:.3g}")
            return Check(name, False, f"rank {rank}: {key} is wrong{why}", rank=rank,
                         tensor=key, max_error=entry["error"], hint=HINTS[key])
        worst = max(worst, entry["error"])
    return Check(name, True, f"largest error {worst:.1e}", max_error=worst)


def _collectives(name, per_rank) -> Check:
    for rank, found in enumerate(per_rank):
        if sorted(found["made"]) != sorted(WANTED):
            made = ", ".join(f"{op} along {axis}" for op, axis in found["made"]) or "none"
            return Check(name, False, f"rank {rank} made: {made}", rank=rank,
                         hint="each gradient needs exactly one collective: two reduce-scatters "
                              "(one per grid axis) and the bias's all-reduce")
    return Check(name, True, "reduce-scatter along row and column, all-reduce along column")
