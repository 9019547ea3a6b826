"""Checks for ex25: what each rank keeps of a Llama block under PyTorch's tensor-parallel
plan and FSDP2, read from DTensor's placements.

The learner's three functions are pure: they are called here, in this process. The truth
is PyTorch's own, from one launch of 4 ranks (gloo, float64) that runs nothing of the
learner's: every rank applies the plan of `pytorch/tutorials`'
`intermediate_source/TP_tutorial.rst` (`parallelize_module`) and FSDP2 (`fully_shard`) to
the block for real, on meshes (dp, tp) = (1, 4), (2, 2) and (4, 1), and reports the
placements PyTorch gave, the bytes it holds, and the shape `distribute_tensor(...)
.to_local()` leaves it for each of `CASES`. Any correct answer passes: a placement is
compared as the piece it names (Shard(-1) of a matrix is Shard(1)); shapes and bytes are
numbers. Each usual slip is named: the Embedding split like a Linear, a Linear's dims
swapped, a norm's weight split by sequence parallelism, blocks of n // k or the remainder
given to the first ranks, a dim sharded twice cut from the whole each time or in the
reverse order, the norms counted as split, every parameter divided evenly.
"""

from __future__ import annotations

import math

from torch.distributed.tensor import Placement, Replicate, Shard

from ...runtime.errors import LaunchError
from ...runtime.launch import launch
from .base import Check, Stopped, attempt, failure_check, file_lacks
from .ex25_truth import CASES, MESHES, SHAPES, WORLD, in_rank, key

TIMEOUT = 60.0
CHECK_NAMES = [
    "tp_placements: every parameter of the Llama block as parallelize_module leaves it (tp = 4)",
    "local_shape: DTensor's piece on every rank of a 4-rank and a 2 x 2 mesh (uneven, empty, "
    "a dim sharded twice)",
    "kept_bytes: each rank's parameter bytes after parallelize_module and fully_shard, "
    "(dp, tp) = (1, 4), (2, 2), (4, 1)",
]
ITEMSIZE = 8  # the block runs in float64

# (the kind of layer, the learner's placement) -> the slip it is
PLACEMENT_SLIPS = {
    ("embedding", "Shard(1)"): "RowwiseParallel splits a module's input; an nn.Embedding's "
    "input is a token id, which picks a row of its (num_embeddings, embedding_dim) weight: "
    "rowwise cuts the vocabulary rows, Shard(0), the reverse of an nn.Linear's",
    ("column", "Shard(1)"): "ColwiseParallel splits a Linear's outputs, and nn.Linear stores "
    "(out_features, in_features): dim 0",
    ("row", "Shard(0)"): "RowwiseParallel splits a Linear's inputs: dim 1 of its "
    "(out_features, in_features) weight",
    ("norm", "Shard(0)"): "SequenceParallel splits the activations along the sequence, not "
    "the norm's weight: every rank normalises its tokens with the whole weight, Replicate()",
}
KINDS = {"tok_embeddings": "embedding", "wo": "row", "w2": "row"}


def _kind(name: str) -> str:
    if "norm" in name:
        return "norm"
    return KINDS.get(name.split(".")[-2], "column")


def run(module) -> list[Check]:
    names = ("tp_placements", "local_shape", "kept_bytes")
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        return file_lacks(CHECK_NAMES, ", ".join(missing))
    if getattr(module, "SHAPES", None) != SHAPES:
        return [Check(n, False, "SHAPES is not the exercise's", hint="restore SHAPES as the "
                      "exercise file gives it: the grader's block is built from those shapes")
                for n in CHECK_NAMES]
    blanks = _blanks(module)
    if all(blanks):  # nothing written yet: no run to wait for
        return [Check(n, False, f"{f} is not written yet", hint=h)
                for n, f, h in zip(CHECK_NAMES, names, blanks, strict=True)]
    try:
        truth = launch(in_rank, WORLD, timeout=TIMEOUT)
    except LaunchError as error:
        return [failure_check(CHECK_NAMES[0], error, "the grader's own run")] + [
            Check(n, False, "not checked: the run above failed") for n in CHECK_NAMES[1:]]
    judges = (_judge_placements, _judge_shapes, _judge_bytes)
    checks = []
    for i, judge in enumerate(judges):
        try:
            checks.append(judge(module, truth))
        except Stopped as stop:  # a blank or a crash: this check only
            checks.append(Check(CHECK_NAMES[i], False, stop.checks[0].detail,
                                hint=stop.checks[0].hint))
    return checks


def _blanks(module) -> list[str | None]:
    """Each function's NotImplementedError message if it is still a blank, else None."""
    probes = ((module.tp_placements,), (module.local_shape, (5, 3), [Shard(0)], (4,), (0,)),
              (module.kept_bytes, 1, WORLD, 0, 0, ITEMSIZE))
    found = []
    for function, *args in probes:
        try:
            function(*args)
            found.append(None)
        except NotImplementedError as exc:
            found.append(str(exc) or "replace the NotImplementedError with your code")
        except Exception:  # noqa: BLE001 - written but wrong: the checks will say how
            found.append(None)
    return found


def _call(function, *args, label):
    return attempt(function, *args, names=CHECK_NAMES[:1], blank=function.__name__,
                   label=label, hint="see the docstring of the exercise for what it returns")


def _judge_placements(module, truth) -> Check:
    name = CHECK_NAMES[0]
    got = _call(module.tp_placements, label="tp_placements()")
    if not isinstance(got, dict):
        return Check(name, False, f"tp_placements() returned {type(got).__name__}",
                     hint="return a dict {parameter name: placement}")
    for param, shape in SHAPES.items():
        if param not in got or not isinstance(got[param], Placement):
            return Check(name, False, f"{param}: no placement" if param not in got else
                         f"{param}: {got[param]!r} is not a placement",
                         hint="every name of SHAPES needs Shard(d) or Replicate()")
        mine, real = key(got[param], len(shape)), truth[0]["placements"][param]
        if mine != real:
            slip = PLACEMENT_SLIPS.get((_kind(param), mine))
            if mine == "Partial()":
                slip = ("a parameter is never a sum still to be taken: each rank keeps a "
                        "block of it, or the whole")
            elif mine == "Replicate()":
                slip = "this layer's weight is split: each of the tp ranks keeps 1/tp of it"
            return Check(name, False, f"{param} as {mine}; parallelize_module left {real}",
                         tensor=param, hint=slip or "which dim holds what the style splits?")
    return Check(name, True, "every placement is the one PyTorch gave")


def _rules(shape, placements, mesh_shape, coord, split, whole=False, reverse=False):
    """A shape under a cutting rule `split(n, k, i)`: the right one, or a usual slip's
    (`whole`: every cut from the whole dim; `reverse`: the mesh's last dimension first)."""
    local, order = list(shape), list(zip(placements, mesh_shape, coord, strict=True))
    for placement, ranks, at in (order[::-1] if reverse else order):
        if isinstance(placement, Shard):
            dim = placement.dim % len(shape)
            local[dim] = split(shape[dim] if whole else local[dim], ranks, at)
    return tuple(local)


def _chunk(n, k, i):
    block = -(-n // k)
    return max(0, min(block, n - i * block))


def _floor(n, k, i):
    return n // k


SHAPE_SLIPS = (
    (dict(split=_floor), "n // k rows each drops the remainder: torch.chunk gives blocks of "
     "ceil(n / k), the last ones short or empty (5 over 4: 2, 2, 1, 0)"),
    (dict(split=lambda n, k, i: n // k + (i < n % k)), "that gives the remainder to the first "
     "ranks (torch.tensor_split, numpy.array_split); torch.chunk gives ceil(n / k) to each "
     "until the rows run out (5 over 4: 2, 2, 1, 0)"),
    (dict(split=_chunk, whole=True), "when two mesh dimensions shard the same dim, the "
     "second cuts the first one's piece, not the whole tensor"),
    (dict(split=_chunk, reverse=True), "placements go in the mesh's order: the first mesh "
     "dimension cuts first"),
)


def _judge_shapes(module, truth) -> Check:
    name = CHECK_NAMES[1]
    for rank, found in enumerate(truth):
        for (shape, placements, mesh_shape), (coord, real) in zip(CASES, found["shapes"],
                                                                  strict=True):
            label = f"local_shape({shape}, {list(placements)}, {mesh_shape}, {coord})"
            mine = _call(module.local_shape, shape, placements, mesh_shape, coord, label=label)
            try:
                mine = tuple(int(s) for s in mine)
            except (TypeError, ValueError):
                return Check(name, False, f"{label} returned {mine!r}",
                             hint="return the shape as a tuple of ints")
            if mine != real:
                hint = next((says for rule, says in SHAPE_SLIPS
                             if _rules(shape, placements, mesh_shape, coord, **rule) == mine),
                            "cut each sharded dim in the mesh's order, as torch.chunk would")
                return Check(name, False, f"{label} gave {mine}; DTensor's rank {rank} holds "
                             f"{real}", rank=rank, hint=hint)
    return Check(name, True, f"{len(CASES)} cases on each of the {WORLD} ranks: DTensor's "
                 "own shapes")


def _bytes_under(dp, tp, dp_rank, tp_rank, split=_chunk, norms_split=False):
    """A rank's bytes under the right rule, or under a usual slip's."""
    total = 0
    for param, shape in SHAPES.items():
        kind = _kind(param)
        place = Replicate() if kind == "norm" and not norms_split else Shard(int(kind == "row"))
        piece = list(_rules(shape, [place], [tp], [tp_rank], split=split))
        piece[0] = split(piece[0], dp, dp_rank)
        total += math.prod(piece)
    return total * ITEMSIZE


BYTES_SLIPS = (
    (lambda *at: _bytes_under(*at, norms_split=True), "the norms' weights are whole on every "
     "tp rank (SequenceParallel splits the tokens, not the weight)"),
    (lambda *at: _bytes_under(*at, split=_floor), "49 vocabulary rows do not divide: cut as "
     "torch.chunk does, ceil-sized blocks with the last short"),
    (lambda dp, tp, *_: sum(map(math.prod, SHAPES.values())) * ITEMSIZE / (dp * tp),
     "not every parameter divides by dp x tp: the norms are whole on every tp rank and 49 "
     "rows do not divide evenly; add up each rank's own pieces"),
)


def _judge_bytes(module, truth) -> Check:
    name = CHECK_NAMES[2]
    for rank, found in enumerate(truth):
        for (dp, tp), (coord, real) in zip(MESHES, found["bytes"], strict=True):
            label = f"kept_bytes({dp}, {tp}, {coord[0]}, {coord[1]}, {ITEMSIZE})"
            mine = _call(module.kept_bytes, dp, tp, *coord, ITEMSIZE, label=label)
            if mine != real:
                hint = next((says for rule, says in BYTES_SLIPS if rule(dp, tp, *coord) == mine),
                            "for each parameter: TP's piece (its placement on a mesh of tp), "
                            "then that piece's dim 0 cut over dp; add the elements, times the "
                            "itemsize")
                return Check(name, False, f"{label} gave {mine}; rank {rank} holds {real:,} "
                             "bytes", rank=rank, hint=hint)
    return Check(name, True, "every rank's bytes, on every mesh, are the ones PyTorch left")
