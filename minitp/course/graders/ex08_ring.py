"""ex08 (c), on the ranks: the learner's `ring_step`, cp times, checked after each step
against the attention it should hold and against what each usual mistake gives (folded
step by step in float64), then the backward through it. What each rank found goes to
the parent, which judges it (ex08_ring_checks.py).
"""

from __future__ import annotations

import math

import torch

from ...rules import cp_chunks
from ...runtime import trace
from ...runtime._device import device
from ...runtime.mesh import world
from .ex08_merge import B, D, H, L, _error, _partial

# A ring mistake: at step j rank r holds rank r + held·j's K/V and computes as if it were
# rank r + treated·j's (right: both -1).
RING_MISTAKES = {"wrong owner": (-1, 1), "reversed": (1, 1), "wrong way": (1, -1)}
BLOCK_MISTAKES = ("contiguous", "same halves", "keys swapped", "later", "no triangle")
HYPOTHESES = ("right", *RING_MISTAKES, *BLOCK_MISTAKES)


def _rows(chunk: int) -> slice:
    return slice(chunk * L, (chunk + 1) * L)


def _kind(q_chunk: int, k_chunk: int) -> str | None:
    """What the causal mask keeps of one (query chunk, key chunk) block."""
    if k_chunk < q_chunk:
        return "full"
    return "causal" if k_chunk == q_chunk else None


def _plan(r, n, owner, mistake=None) -> list[tuple[int, int, str]]:
    """The blocks (query half a, key half b, kind) rank r computes with rank `owner`'s
    K/V, right or with one block mistake built in."""
    mine, theirs = cp_chunks(r, n), cp_chunks(owner, n)
    if mistake == "contiguous":
        mine, theirs = (2 * r, 2 * r + 1), (2 * owner, 2 * owner + 1)
    plan = []
    for a in range(2):
        for b in range(2):
            if mistake == "same halves" and a != b:
                continue
            kind = _kind(mine[a], theirs[1 - b] if mistake == "keys swapped" else theirs[b])
            if mistake == "later" and kind is None:
                kind = "full"
            if mistake == "no triangle" and kind == "causal":
                kind = "full"
            if kind:
                plan.append((a, b, kind))
    return plan


def _fold(q, k_all, v_all, r, n, steps, mistake="right"):
    """Rank r's running (out, lse) after `steps` steps of the ring: every block its plan
    computes, folded in by the online softmax, as the learner's step would with `mistake`."""
    held, treated = RING_MISTAKES.get(mistake, (-1, -1))
    block_mistake = mistake if mistake in BLOCK_MISTAKES else None
    qs = q.chunk(2, dim=-2)
    outs = [torch.zeros_like(h) for h in qs]
    lses = [torch.full(h.shape[:-1], float("-inf"), dtype=h.dtype, device=h.device) for h in qs]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    for j in range(steps):
        keys = cp_chunks((r + held * j) % n, n)
        for a, b, kind in _plan(r, n, (r + treated * j) % n, block_mistake):
            k, v = k_all[..., _rows(keys[b]), :], v_all[..., _rows(keys[b]), :]
            keep = causal if kind == "causal" else torch.ones_like(causal)
            scores = qs[a] @ k.transpose(-2, -1) / math.sqrt(D)
            o, ell = _partial(scores, v, keep.expand(scores.shape))
            lse = torch.logaddexp(lses[a], ell)
            outs[a] = (torch.exp(lses[a] - lse).unsqueeze(-1) * outs[a]
                       + torch.exp(ell - lse).unsqueeze(-1) * o)
            lses[a] = lse
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def _causal(q, k, v, positions):
    """Rank r's rows of causal attention over the whole sequence, as one process
    computes it: the whole score matrix, masked, torch.softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    later = torch.arange(k.shape[-2], device=k.device) > positions[:, None]
    scores = scores.masked_fill(later, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def _counting(ring_step) -> dict:
    """Counts, in (chunk × chunk) blocks, every call the learner's step makes of its
    `block_attention` (swapped in its globals, on this rank only; `_uncount` undoes it)."""
    names = ring_step.__globals__
    counted = {"blocks": 0.0, "names": names, "original": names.get("block_attention")}
    original = counted["original"]
    if callable(original):
        def block_attention(q, k, *args, **kwargs):
            counted["blocks"] += q.shape[-2] * k.shape[-2] / (L * L)
            return original(q, k, *args, **kwargs)

        names["block_attention"] = block_attention
    return counted


def _uncount(counted) -> None:
    if counted["original"] is not None:
        counted["names"]["block_attention"] = counted["original"]


def _in_rank(ring_step):
    """Runs on every rank: the learner's step, n times, checked after each; then the
    backward through it (autograd of the learner's code, see `_backward`)."""
    axis = world()
    n, r = axis.size, axis.rank
    g = torch.Generator().manual_seed(13)
    q_all, k_all, v_all = (torch.randn(B, H, 2 * n * L, D, generator=g, dtype=torch.float64)
                           .to(device()) for _ in range(3))
    w_all = torch.randn(B, H, 2 * n * L, D, generator=g, dtype=torch.float64).to(device())
    positions = torch.cat([torch.arange(c * L, (c + 1) * L) for c in cp_chunks(r, n)]).to(device())
    q, k, v = (t[..., positions, :].contiguous() for t in (q_all, k_all, v_all))
    q_leaf = q.clone().requires_grad_()  # the gradients of q, and of each block held, by autograd
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float64, device=device())
    held = {j: torch.cat([k_all[..., _rows(c), :] for c in cp_chunks(j, n)], dim=-2)
            for j in range(n)}
    counted, steps, leaves = _counting(ring_step), [], []
    try:
        for step in range(n):
            first = len(trace.events())
            k, v = k.detach().requires_grad_(), v.detach().requires_grad_()
            owner = [j for j in range(n) if torch.equal(k, held[j])]  # whose block, truly
            leaves.append((k, v, owner[0] if len(owner) == 1 else None))
            got = ring_step(q_leaf.clone(), k, v, out, lse, step, axis)
            sent = [e.peer for e in trace.events()[first:] if e.op == "send"]
            record = {"sent": sent, "next": axis.next, "prev": axis.prev}
            steps.append(record)
            if not (isinstance(got, tuple | list) and len(got) == 4
                    and all(isinstance(t, torch.Tensor) for t in got)):
                record["problem"] = "did not return four tensors (out, lse, k_next, v_next)"
                break
            out, lse, k, v = got
            if out.shape != q.shape or lse.shape != q.shape[:-1] or k.shape != q.shape:
                record["problem"] = (f"returned shapes {tuple(out.shape)}, {tuple(lse.shape)}, "
                                     f"{tuple(k.shape)}; expected {tuple(q.shape)}, "
                                     f"{tuple(q.shape[:-1])}, {tuple(q.shape)}")
                break
            with torch.no_grad():
                record["errors"] = {m: _error((out, lse), _fold(q, k_all, v_all, r, n,
                                                                step + 1, m))
                                    for m in HYPOTHESES}
                record["holds"] = [j for j in range(n) if torch.equal(k, held[j])]
    finally:
        _uncount(counted)
    done = not any("problem" in s for s in steps)
    with torch.no_grad():
        final = _error((out, lse), _causal(q, k_all, v_all, positions)) if done else None
    grads = _gradients(out, w_all[..., positions, :], q_leaf, leaves, q_all, k_all, v_all,
                       w_all, positions) if done else None
    return {"steps": steps, "final": final, "blocks": counted["blocks"], "grads": grads}


def _gradients(out, w, q_leaf, leaves, q_all, k_all, v_all, w_all, positions) -> dict:
    """Backward of sum(out · w) through the learner's steps (every block held a leaf of
    its own), and causal attention's gradients on one process, this rank's rows."""
    found = {"crash": None, "cut": False}
    if not out.requires_grad:
        found["cut"] = True
    else:
        try:
            (out * w).sum().backward()
        except RuntimeError as error:
            found["crash"] = str(error).strip().splitlines()[0]
    zeros = torch.zeros_like
    found["dq"] = (zeros(q_leaf) if q_leaf.grad is None else q_leaf.grad).cpu()
    found["dkv"] = [(owner, *((zeros(t) if t.grad is None else t.grad).cpu() for t in kv))
                    for *kv, owner in leaves]  # per step: whose block, this rank's share
    whole = [t.clone().requires_grad_() for t in (q_all, k_all, v_all)]
    every = torch.arange(q_all.shape[-2], device=q_all.device)
    (_causal(*whole, every)[0] * w_all).sum().backward()
    found["want"] = [t.grad[..., positions, :].cpu() for t in whole]  # dq, dk, dv: its rows
    return found
