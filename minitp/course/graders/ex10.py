"""Checks for ex10: Ulysses' two all-to-alls, and grouped-query K/V before them.

One launch per cp in (2, 4), that many ranks, float64. Every rank cuts the same
(B, H, s, d) tensor with the load-balanced split (`minitp.context_parallel.split_sequence`,
chunks r and 2·cp − 1 − r) and calls the learner's functions on its part; the reference is
the split's own layout, never a second copy of the exercise:

* (a) `heads_to_sequence` must return head group r (of cp consecutive ones) of the whole
  tensor, in sequence order. Named: the sequence split where the heads should be (the
  shape says so), the positions left in the order they arrived (rank order: the chunks
  of rank 0, then rank 1's, ...);
* (b) `sequence_to_heads`, given (a)'s right answer (the grader's, so (b) does not depend
  on (a)), must give the rank's own part back: (a)'s inverse. Named, as a reverse that
  does not undo (a): the head groups not gathered back (the shape says so), the
  positions sent back as a contiguous split;
* (c) `kv_for_all_to_all` on 8, 4, 2 and 1 K/V heads, where valid: K itself where cp
  divides the K/V heads, else each head repeated next to itself (rank r's query heads
  read K/V head r·n_kv/cp: `minitp.rules.ulysses_kv_layout`). Named: K/V heads handed
  over as if they were query heads (unchanged where cp does not divide them), the
  copies tiled (rank r would get head r mod n_kv), heads copied where they split;
* (d) the three installed as the all-to-alls of every Ulysses attention core of a
  Llama-style GPT (8 query heads, 2 K/V heads: split at cp 2, copied at cp 4) made by
  ``mt.parallelize(cp_comm="a2a")``: (b) runs backward where (a) ran forward and the
  other way round (an all-to-all's adjoint is its inverse); one training step's loss
  and every gradient must equal the plain GPT's. Run only when (a)-(c) held on every
  rank (the ranks agree on that first: a rank alone in a collective would hang).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn

from ...context_parallel.split import chunk_order, split_sequence
from ...context_parallel.ulysses import UlyssesAttention
from ...data_parallel import make_optimizer
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from ...step import train_step
from .base import Check, call_kept, run_per_size

WORLD_SIZES = (2, 4)
B, H, C, D = 2, 8, 3, 4  # batch, query heads, positions per chunk (a rank holds two), head size
KV_HEADS = (8, 4, 2, 1)
MODEL = dict(vocab_size=16, seq_len=16, n_layer=2, n_head=8, d_model=32, norm="rmsnorm",
             positions="rope", mlp="swiglu", bias=False, n_kv_head=2)
TOLERANCE, STEP_TOLERANCE, TIMEOUT = 1e-12, 1e-10, 30.0
SKIPPED = "not checked: (a), (b) or (c) failed on some rank (see above)"
HINT_A = ("which dimension shrinks and which grows? Which two chunks of the sequence did "
          "rank j send you, and where do they stand in the sequence?")
HINT_B = ("which of the 2·cp chunks are rank j's, in which order does it hold them, and in "
          "which order do the head groups that arrive stack up?")
HINT_C = ("which K/V head do rank r's query heads read, and which head of the tensor you "
          "return does heads_to_sequence hand rank r?")


def _names(n: int) -> list[str]:
    return [f"cp={n}: (a) heads_to_sequence: head group r, every position, in sequence order",
            f"cp={n}: (b) sequence_to_heads: every head of the rank's two chunks, and the "
            "inverse of (a)",
            f"cp={n}: (c) kv_for_all_to_all: K/V split where cp divides them, else copied",
            f"cp={n}: (d) all three as Ulysses attention in a grouped-query GPT: one training "
            "step equals one device's"]


def _same(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and (a.detach() - b).abs().max().item() <= TOLERANCE)


def _raised(fn_name, why, hint):
    kind, message = why
    if kind == "blank":
        return (False, f"{fn_name} is not written yet", message or hint)
    return (False, f"{fn_name} raised {message}", hint)


def _check_regroup(fn, hint, given, want, axis, wrong_shape, wrong_values):
    """The learner's `fn` on `given` against `want`: raised, no tensor, right, or the
    mistake `wrong_shape(got, detail)` / `wrong_values(got)` names (None: no usual one)."""
    got, why = call_kept(fn, given.clone(), axis)
    if why:
        return _raised(fn.__name__, why, hint)
    if not isinstance(got, torch.Tensor):
        return (False, f"returned {type(got).__name__}, not a tensor", hint)
    if _same(got, want):
        return (True, "", "")
    if tuple(got.shape) != tuple(want.shape):
        detail = f"rank {axis.rank} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        return wrong_shape(got, detail) or (False, detail, hint)
    error = (got.detach() - want).abs().max().item()
    return wrong_values(got) or (False, f"rank {axis.rank}: largest error {error:.3g}", hint)


def _check_a(fns, x, whole, axis):
    cp, r = axis.size, axis.rank

    def wrong_shape(got, detail):
        if got.dim() == 4 and got.shape[1] >= H:
            return (False, f"{detail}: every head is still here: the sequence was split "
                    "where the heads should be", "after the all-to-all a rank holds fewer "
                    "heads and more positions: which dimension do you cut into cp parts?")
        return None

    def wrong_values(got):
        arrived = torch.cat([whole.chunk(2 * cp, dim=2)[c] for c in chunk_order(cp)], dim=2)
        if _same(got, arrived.chunk(cp, dim=1)[r]):
            return (False, f"rank {r}: the positions are in the order they arrived, chunks "
                    f"{chunk_order(cp)}, not in the sequence's order", "where in the sequence "
                    "do rank j's two chunks stand? The causal mask reads a key's place from "
                    "its index")
        return None

    return _check_regroup(fns.heads_to_sequence, HINT_A, x, whole.chunk(cp, dim=1)[r], axis,
                          wrong_shape, wrong_values)


def _check_b(fns, x, whole, axis):
    cp, r = axis.size, axis.rank
    length = x.shape[2]

    def wrong_shape(got, detail):
        if got.dim() == 4 and got.shape[1] != H:
            return (False, f"{detail}: not every head came back, so this does not undo (a)",
                    "which dimension does (a) cut into cp parts, and which does it grow? "
                    "Which does the way back cut, then?")
        return None

    def wrong_values(got):
        if _same(got, whole[:, :, r * length:(r + 1) * length]):
            return (False, f"rank {r} got positions {r * length}..{(r + 1) * length - 1} "
                    "back, a contiguous split: the reverse does not undo (a)", "which two "
                    "chunks does rank j hold, and where do they stand in the sequence?")
        return None

    return _check_regroup(fns.sequence_to_heads, HINT_B, whole.chunk(cp, dim=1)[r], x, axis,
                          wrong_shape, wrong_values)


def _check_c(fns, cp, g):
    for n_kv in KV_HEADS:
        if n_kv % cp and cp % n_kv:
            continue  # refused by the rules: not the learner's case
        k = torch.randn(B, n_kv, 2 * C, D, generator=g, dtype=torch.float64).to(device())
        want = k if n_kv % cp == 0 else k.repeat_interleave(cp // n_kv, dim=1)
        got, why = call_kept(fns.kv_for_all_to_all, k.clone(), cp)
        if why:
            return _raised("kv_for_all_to_all", why, HINT_C)
        if _same(got, want):
            continue
        where = f"{n_kv} K/V heads, cp={cp}"
        if _same(got, k):
            return (False, f"{where}: returned K unchanged, as if its heads were query heads: "
                    f"{cp} ranks cannot split {n_kv}", HINT_C)
        if n_kv % cp and _same(got, k.repeat(1, cp // n_kv, 1, 1)):
            return (False, f"{where}: the copies are tiled: rank r would get K/V head "
                    f"r mod {n_kv}", HINT_C)
        if n_kv % cp == 0:
            return (False, f"{where}: cp divides them, so the all-to-all splits them like "
                    "the queries: copying them sends more for nothing", "when does each "
                    "rank already receive whole K/V heads of its own?")
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return (False, f"{where}: returned {shape}, not the layout expected", HINT_C)
    return (True, "", "")


class _Regroup(torch.autograd.Function):
    """The learner's (a) or (b) forward; backward, the other one (the adjoint of a
    permutation is its inverse)."""

    @staticmethod
    def forward(ctx, x, fns, axis, to_sequence):
        ctx.fns, ctx.axis, ctx.to_sequence = fns, axis, to_sequence
        fn = fns.heads_to_sequence if to_sequence else fns.sequence_to_heads
        return fn(x, axis)

    @staticmethod
    def backward(ctx, grad):
        fn = ctx.fns.sequence_to_heads if ctx.to_sequence else ctx.fns.heads_to_sequence
        return fn(grad.contiguous(), ctx.axis), None, None, None


class _Learners(nn.Module):
    """Ulysses attention with the learner's all-to-alls around the layer's own core."""

    def __init__(self, axis, inner, fns):
        super().__init__()
        self.axis, self.inner, self.fns = axis, inner, fns

    def forward(self, q, k, v):
        cp = self.axis.size
        k, v = (self.fns.kv_for_all_to_all(t, cp) for t in (k, v))
        q, k, v = (_Regroup.apply(t, self.fns, self.axis, True) for t in (q, k, v))
        return _Regroup.apply(self.inner(q, k, v), self.fns, self.axis, False)


def _check_d(fns, axis):
    mesh = Mesh(cp=axis.size)
    cfg = GPTConfig(**MODEL)
    torch.manual_seed(0)
    ref = GPT(cfg).to(device=device(), dtype=torch.float64)
    model = parallelize(ref, mesh, cp_comm="a2a")
    for name, module in list(model.named_modules()):
        if isinstance(module, UlyssesAttention):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, _Learners(mesh.cp, module.inner, fns))
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g).to(device())
            for _ in range(2))
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    loss = train_step(model, (x, y), mesh, make_optimizer(model, mesh, torch.optim.SGD, lr=0.0))
    error = abs(loss - ref_loss.item())
    grads = model.full_grad_dict()
    worst, where = max(((grads[n] - p.grad).abs().max().item(), n)
                       for n, p in ref.named_parameters())
    if max(error, worst) > STEP_TOLERANCE:
        what = (f"the loss by {error:.3g}" if error > STEP_TOLERANCE
                else f"{where}.grad by {worst:.3g}")
        return (False, f"differs from one device's: {what}", "(a)-(c) held on the cases "
                "above: does anything depend on the batch size, the head count or the dtype?")
    return (True, f"loss and every gradient, largest error {max(error, worst):.1e}", "")


def _in_rank(fns):
    axis = world()
    cp = axis.size
    g = torch.Generator().manual_seed(9)
    whole = torch.randn(B, H, 2 * cp * C, D, generator=g, dtype=torch.float64).to(device())
    x = split_sequence(whole, axis, dim=2)
    results = [_check_a(fns, x, whole, axis), _check_b(fns, x, whole, axis),
               _check_c(fns, cp, g)]
    everyone = [None] * cp
    dist.all_gather_object(everyone, all(ok for ok, _, _ in results))
    results.append(_check_d(fns, axis) if all(everyone) else (False, SKIPPED, ""))
    blank = any(r[1].endswith("not written yet") for r in results)
    return {"results": results, "blank": blank}


def run(module) -> list[Check]:
    for function in ("heads_to_sequence", "sequence_to_heads", "kv_for_all_to_all"):
        if not hasattr(module, function):
            return [Check(n, False, f"the file has no {function}",
                          hint="keep the names of the exercise file")
                    for size in WORLD_SIZES for n in _names(size)]
    fns = SimpleNamespace(heads_to_sequence=module.heads_to_sequence,
                          sequence_to_heads=module.sequence_to_heads,
                          kv_for_all_to_all=module.kv_for_all_to_all)

    def launch_at(n):
        return launch(_in_rank, n, fns, timeout=TIMEOUT)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="the all-to-alls",
                        size="cp", blank=_blank)


def _blank(per_rank, checks) -> str | None:
    if any(r["blank"] for r in per_rank):
        return "a function is not written yet"
    return None


def _judge(n, names, per_rank) -> list[Check]:
    checks = []
    for i, name in enumerate(names):
        failed = [(rank, r["results"][i]) for rank, r in enumerate(per_rank)
                  if not r["results"][i][0]]
        if not failed:
            detail = per_rank[0]["results"][i][1] or f"every rank of {n}"
            checks.append(Check(name, True, detail))
            continue
        rank, (_, detail, hint) = failed[0]
        checks.append(Check(name, False, detail, rank=rank, hint=hint))
    return checks
