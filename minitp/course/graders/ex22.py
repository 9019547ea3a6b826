"""Checks for ex22: the DTensor placement of every tensor in a tensor-parallel MLP, with
and without sequence parallelism.

The learner's `placements(sp)` is called here, in this process, for both cases; then one
launch of 2 ranks (gloo, float64) judges them by running DTensor. Every rank builds the
one-device MLP (6 token rows, d = 4, f = 8) and the piece of each tensor it really holds
under minitp's layout (lessons 02 and 05: fc1 split by its outputs, fc2 by its inputs,
SP's token rows), wraps that piece with ``DTensor.from_local`` and the learner's placement
and gathers it back with ``full_tensor()``: the whole one-device tensor must come back.
A wrong placement comes back with the wrong shape (a weight split along the other dim,
a piece called whole) or the wrong values (a term of a sum called whole: rank 0's term
alone; a whole tensor called a term: tp times it). Each usual slip is named.

Then the MLP runs in DTensor from the learner's placements of the input and the
parameters (redistributed to ``x_in`` before fc1 and to ``y`` after fc2) and must give one
device's output on every rank; DTensor's own propagation of h and of fc2's product is
reported beside the learner's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from ...runtime._device import device
from ...runtime.errors import LaunchError
from ...runtime.launch import launch
from .base import Check, crashed, failure_check, file_lacks, not_written

WORLD, TOKENS, D, F_HIDDEN = 2, 6, 4, 8
TOLERANCE = 1e-12  # float64
TIMEOUT = 60.0
NAMES = ("x", "x_in", "fc1.weight", "fc1.bias", "h", "fc2.weight", "fc2.bias", "y_partial", "y")
GROUPS = (("fc1, column-parallel: fc1.weight, fc1.bias, h", (False, True),
           ("fc1.weight", "fc1.bias", "h")),
          ("fc2, row-parallel: fc2.weight, fc2.bias, y_partial (before the reduction)",
           (False, True), ("fc2.weight", "fc2.bias", "y_partial")),
          ("without SP, the activations: x, x_in, y", (False,), ("x", "x_in", "y")),
          ("with SP, the activations: x, x_in, y", (True,), ("x", "x_in", "y")))
RUN = "the MLP run in DTensor from your placements equals one device (without and with SP)"
CHECK_NAMES = [g[0] for g in GROUPS] + [RUN]
GENERAL = ("which dim, if any, does the split cut, and does each rank hold a block, the "
           "whole tensor, or one term of a sum?")


def _key(p) -> str:
    if isinstance(p, Shard):
        return f"Shard({p.dim})"
    return {Replicate: "Replicate()", Partial: "Partial()"}.get(type(p), repr(p))


# (name, sp or None for both, the learner's placement) -> the slip it is
SLIPS = {
    ("fc1.weight", None, "Shard(1)"): "nn.Linear stores its weight as (out_features, "
    "in_features): a column-parallel layer splits its outputs, so fc1.weight is cut along "
    "dim 0, not 1",
    ("fc2.weight", None, "Shard(0)"): "a row-parallel layer splits its inputs; in nn.Linear's "
    "(out_features, in_features) that is dim 1, not 0",
    ("fc1.weight", None, "Replicate()"): "each rank holds only its f/tp output rows of fc1's "
    "weight; Replicate() says every rank holds the whole matrix",
    ("fc2.weight", None, "Replicate()"): "each rank holds only its f/tp input columns of "
    "fc2's weight; Replicate() says every rank holds the whole matrix",
    ("fc1.bias", None, "Replicate()"): "fc1's bias follows its outputs: each rank adds only "
    "the f/tp entries of its own hidden features",
    ("fc2.bias", None, "Partial()"): "the bias is added once, to the summed output: Partial() "
    "would make it a term of the sum, added tp times",
    ("fc2.bias", None, "Shard(0)"): "every rank adds the whole bias to the whole output (after "
    "the reduction): nothing of it is split",
    ("h", None, "Shard(0)"): "fc1 splits the hidden features (h's columns), not the tokens",
    ("y_partial", None, "Replicate()"): "after the row-parallel matmul each rank holds only its "
    "term of the output (its hidden features' share): Replicate() would say each already "
    "holds the whole sum. The sum still to be taken is Partial()",
    ("y_partial", None, "Shard(1)"): "each rank's product already has the output's full shape "
    "(tokens, d): it is a term of the sum, Partial(), not a block",
    ("x", True, "Replicate()"): "under sequence parallelism each rank holds only its 1/tp of "
    "the token rows outside the MLP: Shard(0), the rows",
    ("x", True, "Shard(1)"): "sequence parallelism splits the tokens (rows, dim 0 here), not "
    "the features",
    ("x", False, "Shard(0)"): "without sequence parallelism every rank holds the whole input",
    ("x_in", True, "Shard(0)"): "fc1 multiplies every token on every rank: SP's all-gather "
    "before it makes x_in whole",
    ("y", True, "Replicate()"): "SP ends the MLP with a reduce-scatter, not an all-reduce: each "
    "rank keeps its 1/tp of the token rows, Shard(0)",
    ("y", True, "Partial()"): "after SP's reduce-scatter the sum is taken: each rank holds its "
    "token rows of it, Shard(0)",
    ("y", False, "Partial()"): "fc2's all-reduce has taken the sum: every rank holds the whole "
    "output, Replicate()",
    ("y", False, "Shard(0)"): "without SP fc2 ends in an all-reduce: every rank holds the "
    "whole output",
}


def _hint(name: str, sp: bool, placement) -> str:
    key = _key(placement)
    return SLIPS.get((name, sp, key)) or SLIPS.get((name, None, key)) or GENERAL


def run(module) -> list[Check]:
    if not hasattr(module, "placements"):
        return file_lacks(CHECK_NAMES, "placements")
    chosen = {}
    for sp in (False, True):
        try:
            chosen[sp] = dict(module.placements(sp))
        except NotImplementedError as exc:
            return not_written(CHECK_NAMES, "placements", str(exc))
        except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
            return crashed(CHECK_NAMES, f"placements(sp={sp})", exc,
                           "return a dict {name: placement} for every name in NAMES")
        missing = [n for n in NAMES if n not in chosen[sp]]
        wrong = [n for n in NAMES if n in chosen[sp] and not isinstance(chosen[sp][n], Placement)]
        if missing or wrong:
            what = f"no placement for {missing}" if missing else f"not a placement: {wrong}"
            return [Check(n, False, f"placements(sp={sp}): {what}",
                          hint="every name needs Shard(d), Replicate() or Partial()")
                    for n in CHECK_NAMES]
    try:
        per_rank = launch(_in_rank, WORLD, chosen, timeout=TIMEOUT)
    except LaunchError as error:
        return [failure_check(CHECK_NAMES[0], error, "placements")] + [
            Check(n, False, "not checked: the run above failed") for n in CHECK_NAMES[1:]]
    return [_judge_group(group, per_rank) for group in GROUPS] + [_judge_run(per_rank)]


def _judge_group(group, per_rank) -> Check:
    name, cases, tensors = group
    for sp in cases:
        for rank, record in enumerate(per_rank):
            for tensor in tensors:
                got = record[sp]["tensors"][tensor]
                if got["ok"]:
                    continue
                placed = record[sp]["placed"][tensor]
                return Check(name, False, f"{'with' if sp else 'without'} SP, {tensor} as "
                             f"{_key(placed)}: {got['why']}", rank=rank, tensor=tensor,
                             max_error=got.get("error"), hint=_hint(tensor, sp, placed))
    return Check(name, True, "every rank's piece, wrapped with your placement and gathered "
                 "by DTensor, is one device's tensor")


def _judge_run(per_rank) -> Check:
    for rank, record in enumerate(per_rank):
        for sp in (False, True):
            got = record[sp]["run"]
            if not got["ok"]:
                return Check(RUN, False, f"{'with' if sp else 'without'} SP: {got['why']}",
                             rank=rank, max_error=got.get("error"),
                             hint="the checks above name the placement to fix first")
    seen = per_rank[0][False]["run"]
    worst = max(r[sp]["run"]["error"] for r in per_rank for sp in (False, True))
    return Check(RUN, True, f"largest error {worst:.1e}; DTensor propagated h as {seen['h']}, "
                 f"h @ fc2.weight.T as {seen['partial']}", max_error=worst)


def _pieces(sp: bool, n: int, r: int):
    """The one-device tensors and this rank's true piece of each (minitp's layout)."""
    gen = torch.Generator().manual_seed(22)
    dev = device()
    x, w1, b1, w2, b2 = (torch.randn(*shape, generator=gen, dtype=torch.float64).to(dev)
                         for shape in ((TOKENS, D), (F_HIDDEN, D), (F_HIDDEN,), (D, F_HIDDEN),
                                       (D,)))
    h = F.gelu(F.linear(x, w1, b1))
    y = F.linear(h, w2, b2)
    cols = slice(r * F_HIDDEN // n, (r + 1) * F_HIDDEN // n)
    rows = slice(r * TOKENS // n, (r + 1) * TOKENS // n)
    whole = {"x": x, "x_in": x, "fc1.weight": w1, "fc1.bias": b1, "h": h, "fc2.weight": w2,
             "fc2.bias": b2, "y_partial": y - b2, "y": y}
    piece = {"x": x[rows] if sp else x, "x_in": x, "fc1.weight": w1[cols], "fc1.bias": b1[cols],
             "h": h[:, cols], "fc2.weight": w2[:, cols], "fc2.bias": b2,
             "y_partial": F.linear(h[:, cols], w2[:, cols]), "y": y[rows] if sp else y}
    return whole, piece


def _gathered(piece, placement, whole, mesh) -> dict:
    try:
        full = DTensor.from_local(piece, mesh, [placement], run_check=False).full_tensor()
    except Exception as exc:  # noqa: BLE001  (a placement DTensor refuses: say so)
        return {"ok": False, "why": f"DTensor refused it: {type(exc).__name__}: {exc}"}
    if full.shape != whole.shape:
        return {"ok": False, "why": f"the ranks' pieces gather into a {tuple(full.shape)} "
                f"tensor; one device's is {tuple(whole.shape)}"}
    error = (full - whole).abs().max().item()
    if error > TOLERANCE:
        return {"ok": False, "error": error, "why": f"gathered, it differs from one device's "
                f"by up to {error:.3g}"}
    return {"ok": True}


def _run_mlp(p, piece, whole, mesh) -> dict:
    def wrap(name):
        return DTensor.from_local(piece[name], mesh, [p[name]], run_check=False)

    try:
        x_in = wrap("x").redistribute(mesh, [p["x_in"]])
        h = F.gelu(F.linear(x_in, wrap("fc1.weight"), wrap("fc1.bias")))
        partial = F.linear(h, wrap("fc2.weight"))
        y = (partial + wrap("fc2.bias")).redistribute(mesh, [p["y"]])
        full = y.full_tensor()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "why": f"DTensor raised {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"}
    if full.shape != whole["y"].shape:
        return {"ok": False, "why": f"the output gathers into {tuple(full.shape)}, one "
                f"device's is {tuple(whole['y'].shape)}"}
    error = (full - whole["y"]).abs().max().item()
    return {"ok": error <= TOLERANCE, "error": error, "h": _key(h.placements[0]),
            "partial": _key(partial.placements[0]),
            "why": f"the output differs from one device's by up to {error:.3g}"}


def _in_rank(chosen):
    """Runs on every rank: each tensor's piece gathered under the learner's placement, and
    the MLP in DTensor, without and with SP."""
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = DeviceMesh(device().type, list(range(n)))
    out = {}
    for sp in (False, True):
        whole, piece = _pieces(sp, n, r)
        p = chosen[sp]
        out[sp] = {"placed": p, "run": _run_mlp(p, piece, whole, mesh),
                   "tensors": {t: _gathered(piece[t], p[t], whole[t], mesh) for t in NAMES}}
    return out
