"""Checks for ex18: a tensor-parallel decode step with its KV cache.

One launch per t in (2, 4), that many ranks, float64, a grouped-query attention block of 8
query heads and 2 K/V heads (split at t = 2, one head copied on two ranks at t = 4). The
reference is one device's attention over the whole sequence at once, causal, through
torch's `scaled_dot_product_attention` (no cache: nothing of the exercise's shape):

* (a) `cache_heads` for 8, 4, 2 and 1 K/V heads where t can hold them, against
  `minitp.rules.kv_layout`: split, rank r keeps K/t consecutive heads; copied, the one
  head r·K // t. Named: a cache kept whole on every rank (every head listed), and copies
  tiled (head r mod K, which rank r's query heads do not read);
* (b) `new_cache`: zeros (B, K_r, L, d), float64. Named: a cache kept whole on every
  rank (K heads where the rank reads K_r);
* (c) `decode_step`, token by token over T positions from the grader's own empty cache
  and the grader's shards (so (c) does not depend on (a) and (b)): every step's output
  must equal the reference's row, and the cache must hold position p's K and V in slot
  p. Named: a missing all-reduce (each rank returned its own heads' share), positions off
  by one (written one slot late; the query not seeing itself; the query reading one
  empty slot past itself);
* (d) the trace of each step: exactly one all-reduce, nothing else.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ...rules import kv_layout
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from ._parts import ops_since
from .base import Check, call_kept, run_per_size
from .ex10 import _blank, _judge, _raised, _same  # the same per-rank verdicts

WORLD_SIZES = (2, 4)
B, H, K, D, T = 2, 8, 2, 4, 5  # batch, query heads, K/V heads, head size, positions decoded
HIDDEN = H * D
KV_COUNTS = (8, 4, 2, 1)
TIMEOUT = 30.0  # outputs agree to ex10's 1e-12 (its _same)
HINT_A = ("which query heads does rank r hold, and which K/V head does each read (groups of "
          "H/K consecutive query heads share one)?")
HINT_B = "how many K/V heads does this rank keep (part (a))? Only those take memory here"
HINT_C = ("project this token's q, k and v, write k and v into slot pos, attend over slots "
          "0..pos, project with wo's rows, then one all-reduce")


def _names(n: int) -> list[str]:
    return [f"t={n}: (a) cache_heads: the K/V heads this rank's query heads read, only those",
            f"t={n}: (b) new_cache: an empty cache of this rank's K/V heads",
            f"t={n}: (c) decode_step: each step equals one device's attention over the whole "
            "sequence, and slot p holds position p",
            f"t={n}: (d) each step's communication: one all-reduce, nothing else"]





def _kept(n_kv, tp, rank) -> list[int]:
    """The K/V heads rank keeps, from the rules' layout (not the exercise's code)."""
    if kv_layout(SimpleNamespace(kv_heads=n_kv), tp) == "split":
        return [rank * n_kv // tp + i for i in range(n_kv // tp)]
    return [rank * n_kv // tp]


def _check_a(fns, axis):
    tp, r = axis.size, axis.rank
    for n_kv in KV_COUNTS:
        if n_kv % tp and tp % n_kv:
            continue  # refused by the rules: not the learner's case
        got, why = call_kept(fns.cache_heads, n_kv, tp, r)
        if why:
            return _raised("cache_heads", why, HINT_A)
        want = _kept(n_kv, tp, r)
        if list(got or []) == want:
            continue
        where = f"{n_kv} K/V heads, t={tp}, rank {r}"
        if list(got) == list(range(n_kv)):
            return (False, f"{where}: every head listed: a cache kept whole on every rank, "
                    f"where this rank's query heads read only {want}", HINT_A)
        if tp > n_kv and list(got) == [r % n_kv]:
            return (False, f"{where}: head {r % n_kv} (r mod K), but this rank's query heads "
                    f"read head {want[0]}", HINT_A)
        return (False, f"{where}: returned {got}, expected {want}", HINT_A)
    return (True, "", "")


def _check_b(fns, axis):
    tp, r = axis.size, axis.rank
    length = T + 1
    got, why = call_kept(fns.new_cache, B, length, K, D, axis)
    if why:
        return _raised("new_cache", why, HINT_B)
    want = (B, len(_kept(K, tp, r)), length, D)
    if not (isinstance(got, tuple | list) and len(got) == 2
            and all(isinstance(c, torch.Tensor) for c in got)):
        return (False, "did not return a pair (k, v) of tensors", HINT_B)
    shape = tuple(got[0].shape)
    if shape != want or tuple(got[1].shape) != want:
        detail = f"rank {r}: shape {shape}, expected {want}"
        if len(shape) == 4 and shape[1] == K and want[1] < K:
            detail += (f": a cache kept whole on every rank, {K // want[1]}x the memory this "
                       "rank's heads need")
        return (False, detail, HINT_B)
    if any(c.dtype != torch.float64 or c.abs().max().item() != 0 for c in got):
        return (False, "not float64 zeros", HINT_B)
    return (True, "", "")


def _dense(g):
    def draw(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[0])
                ).to(device())
    return {"wq": draw(HIDDEN, H * D), "wk": draw(HIDDEN, K * D), "wv": draw(HIDDEN, K * D),
            "wo": draw(H * D, HIDDEN), "x": draw(B, T, HIDDEN) * math.sqrt(B)}


def _reference(dense):
    """One device, the whole sequence at once: per-head outputs, K, V and the output."""
    x = dense["x"]

    def heads(w, n):
        return (x @ w).view(B, T, n, D).transpose(1, 2)  # (B, n, T, d)

    q, k, v = heads(dense["wq"], H), heads(dense["wk"], K), heads(dense["wv"], K)
    group = H // K
    per_head = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                              v.repeat_interleave(group, dim=1), is_causal=True)
    out = per_head.transpose(1, 2).reshape(B, T, H * D) @ dense["wo"]
    return SimpleNamespace(q=q, k=k, v=v, per_head=per_head, out=out)


def _shards(dense, tp, r):
    kept = _kept(K, tp, r)
    q_cols = slice(r * H // tp * D, (r + 1) * H // tp * D)
    kv_cols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in kept]).to(device())
    return {"wq": dense["wq"][:, q_cols], "wk": dense["wk"][:, kv_cols],
            "wv": dense["wv"][:, kv_cols], "wo": dense["wo"][q_cols]}, q_cols, kept


def _attend(ref, wo, pos, window):
    """The output at `pos`, every head, attending to slots 0..window-1 of the right cache
    (slots past pos empty): what an off-by-one window gives, summed over the ranks."""
    keys = torch.zeros(B, K, T + 1, D, dtype=torch.float64, device=device())
    values = torch.zeros_like(keys)
    keys[:, :, :pos + 1], values[:, :, :pos + 1] = ref.k[:, :, :pos + 1], ref.v[:, :, :pos + 1]
    keys = keys[:, :, :window].repeat_interleave(H // K, dim=1)  # (B, H, window, d)
    values = values[:, :, :window].repeat_interleave(H // K, dim=1)
    scores = ref.q[:, :, pos:pos + 1] @ keys.transpose(-2, -1) / math.sqrt(D)
    heads = torch.softmax(scores, dim=-1) @ values  # (B, H, 1, d)
    return heads.transpose(1, 2).reshape(B, 1, H * D) @ wo


def _check_c(fns, axis, dense, ref):
    tp, r = axis.size, axis.rank
    shards, q_cols, kept = _shards(dense, tp, r)
    q_heads = list(range(r * H // tp, (r + 1) * H // tp))
    cache = tuple(torch.zeros(B, len(kept), T + 1, D, dtype=torch.float64, device=device())
                  for _ in range(2))
    outputs, ops = [], []
    for pos in range(T):
        x = dense["x"][:, pos:pos + 1].clone()
        start = len(trace.events())
        got, why = call_kept(fns.decode_step, x, {k: w.clone() for k, w in shards.items()},
                         cache, pos, axis)
        ops.append(ops_since(start))
        if why:
            return _raised("decode_step", why, HINT_C), ops
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (B, 1, HIDDEN):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return (False, f"step {pos}: returned {shape}, expected {(B, 1, HIDDEN)}",
                    HINT_C), ops
        outputs.append(got.detach())
    return _judge_steps(outputs, cache, ref, dense, shards, q_heads, kept, r), ops


def _judge_steps(outputs, cache, ref, dense, shards, q_heads, kept, r):
    want = [ref.out[:, p:p + 1] for p in range(T)]
    if all(_same(y, w) for y, w in zip(outputs, want, strict=True)) and _cache_right(
            cache, ref, kept):
        worst = max((y - w).abs().max().item() for y, w in zip(outputs, want, strict=True))
        return (True, f"{T} steps, largest error {worst:.1e}", "")

    def share(heads_out):  # (B, H/t, 1, d) -> this rank's part of the output, before the sum
        return heads_out.transpose(1, 2).reshape(B, 1, -1) @ shards["wo"]

    mine = [share(ref.per_head[:, q_heads, p:p + 1]) for p in range(T)]
    if all(_same(y, m) for y, m in zip(outputs, mine, strict=True)):
        return (False, f"rank {r} returned only its own heads' share of the output: the "
                "all-reduce is missing", "the row-parallel wo leaves each rank a partial sum: "
                "which collective adds the ranks' parts?")
    late = cache[0][:, :, 1:T + 1]
    if _same(late, ref.k[:, kept]):
        return (False, "positions off by one: position p's K and V went to slot p + 1",
                "this token is position pos: which slot of the cache is its?")
    if not _cache_right(cache, ref, kept):
        return (False, f"rank {r}: the cache's slot p does not hold position p's K and V of "
                f"heads {kept}", HINT_C)
    for p in range(1, T):
        if _same(outputs[p], _attend(ref, dense["wo"], p, p)):
            return (False, f"positions off by one: step {p} attended to slots 0..{p - 1}, "
                    "not to itself", "the new token's query reads slots 0..pos, its own "
                    "included")
        if _same(outputs[p], _attend(ref, dense["wo"], p, p + 2)):
            return (False, f"positions off by one: step {p} also attended to slot {p + 1}, "
                    "empty yet", "the new token's query reads slots 0..pos: nothing later "
                    "is written")
    p, error = max(((p, (y - w).abs().max().item())
                    for p, (y, w) in enumerate(zip(outputs, want, strict=True))),
                   key=lambda e: e[1])
    return (False, f"rank {r}: step {p} off by up to {error:.3g}", HINT_C)


def _cache_right(cache, ref, kept) -> bool:
    return (_same(cache[0][:, :, :T], ref.k[:, kept])
            and _same(cache[1][:, :, :T], ref.v[:, kept]))


def _check_d(ops):
    for pos, step in enumerate(ops):
        if step == ["all_reduce"]:
            continue
        said = ", ".join(op.replace("_", "-") for op in step) or "nothing"
        return (False, f"step {pos} recorded {said}; expected one all-reduce",
                "the heads are independent until wo: one all-reduce of wo's partial sums, "
                "at the end")
    return (True, f"{len(ops)} steps, one all-reduce each", "")


def _in_rank(fns):
    axis = world()
    dense = _dense(torch.Generator().manual_seed(18))
    ref = _reference(dense)
    c, ops = _check_c(fns, axis, dense, ref)
    results = [_check_a(fns, axis), _check_b(fns, axis), c,
               _check_d(ops) if len(ops) == T else (False, "not checked: (c) stopped", "")]
    blank = any(res[1].endswith("not written yet") for res in results)
    return {"results": results, "blank": blank}


def run(module) -> list[Check]:
    for function in ("cache_heads", "new_cache", "decode_step"):
        if not hasattr(module, function):
            return [Check(n, False, f"the file has no {function}",
                          hint="keep the names of the exercise file")
                    for size in WORLD_SIZES for n in _names(size)]
    fns = SimpleNamespace(cache_heads=module.cache_heads, new_cache=module.new_cache,
                          decode_step=module.decode_step)

    def launch_at(n):
        return launch(_in_rank, n, fns, timeout=TIMEOUT)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="the decode step",
                        size="t", blank=_blank)

