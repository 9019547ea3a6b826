"""ex08 (d): the learner's `block_backward`, the gradients one (query chunk, key chunk)
block adds, recomputed from the final log-sum-exp, in this process, float64 (see
ex08.py for the whole exercise).

Each case cuts an attention into blocks, calls the learner's function once a block with
the final out, lse and dout of the block's query rows, and sums what the blocks give:
dq over the key blocks a query row met, dK and dV over the query blocks a key block met
(what the ring's backward carries home to the K/V's owner). The sums must equal torch
autograd's gradients of sum(out · dout) through the whole attention. Any way of computing
a block's share that sums right passes; a wrong one is matched against what each usual
mistake gives, summed the same way.
"""

from __future__ import annotations

import math

import torch

from ...runtime._device import device
from .base import Check, Stopped, attempt, crashed
from .ex08_merge import TOLERANCE, B, D, H, L

BACKWARD_NAMES = ["block_backward: summed over the blocks of keys, the gradients of q, k "
                  "and v equal autograd's",
                  "block_backward: causal, block by block (two triangles and a whole block), "
                  "equals causal attention's gradients",
                  "block_backward: scores near +1000 and -1000 stay finite and exact"]
TRIPLE = "return (dq, dk, dv), shaped like (q, k, v)"
LARGE_TOLERANCE = 1e-9  # scores of 1000 and keys of ~50: a few ulps of what is summed
# name -> (what the learner's blocks did, what to do instead)
MISTAKES = {
    "own softmax": ("each block's probabilities were normalised over its own keys, as if they "
                    "were all the keys", "a block holds only its share of each query's "
                    "softmax: recompute it from the final lse passed in, exp(s - lse)"),
    "own attention": ("each block was differentiated as an attention of its own (its own "
                      "softmax, its own row sums)", "a block holds only its share of each "
                      "query's softmax: recompute it from the final lse passed in"),
    "no D": ("ds = p * dp: the softmax's backward lost its second term", "in each query row, "
             "subtract D = sum_j p_j dp_j from dp before multiplying by p"),
    "block D": ("D was summed over this block's keys only", "D runs over every key of the "
                "row, which no block holds: the final out and dout give it"),
    "no scale": ("dq and dk are sqrt(d) too large", "the scores are q·k/sqrt(d): both dq and "
                 "dk carry the 1/sqrt(d)"),
    "no mask": ("the diagonal block's probabilities above the diagonal are not 0: keys after "
                "the query were differentiated", "mask the causal triangle as the forward "
                "does (scores -inf above the diagonal)"),
}


def _scores(q, k, causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), -math.inf)
    return s


def _reference(q, k, v, out, lse, dout, causal, mistake="right"):
    """One block's (dq, dk, dv), right or with one usual mistake built in."""
    s = _scores(q, k, causal and mistake != "no mask")
    if mistake in ("own softmax", "own attention"):
        p = torch.softmax(s, dim=-1)
    else:
        p = torch.exp(s - lse.unsqueeze(-1))
    dp = dout @ v.transpose(-2, -1)
    if mistake in ("own attention", "block D"):
        delta = (p * dp).sum(-1, keepdim=True)
    else:
        delta = (dout * out).sum(-1, keepdim=True) if mistake != "no D" else 0.0
    ds = p * (dp - delta)
    scale = 1.0 if mistake == "no scale" else 1 / math.sqrt(q.shape[-1])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ dout


def _case(seed, n_q, n_k, blocks, causal=False, offset=0.0):
    """Attention of n_q queries over n_k keys (causal: the same positions), its final out,
    lse, a dout, autograd's gradients, and the blocks: (query rows, key rows, causal)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
                     for n in (n_q, n_k, n_k, n_q))
    if offset:  # a shared direction: every score near `offset` (q·k/sqrt(d) = a·b/2 there)
        q[..., 0] += 40.0
        k[..., 0] += offset * math.sqrt(D) / 40.0
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = _scores(leaves[0], leaves[1], causal)
    out = torch.softmax(s, dim=-1) @ leaves[2]
    (out * dout).sum().backward()
    want = tuple(t.grad for t in leaves)
    return {"tensors": (q, k, v, out.detach(), torch.logsumexp(s, dim=-1).detach(), dout),
            "want": want, "blocks": blocks}


def _summed(fn, case, convert=lambda t: t):
    """Every block's (dq, dk, dv) from `fn`, summed where its rows belong."""
    q, k, v, out, lse, dout = case["tensors"]
    total = [torch.zeros_like(t) for t in (q, k, v)]
    for rows, cols, causal in case["blocks"]:
        got = fn(*(convert(t[..., rows, :]) for t in (q,)),
                 *(convert(t[..., cols, :]) for t in (k, v)),
                 convert(out[..., rows, :]), convert(lse[..., rows]),
                 convert(dout[..., rows, :]), causal)
        got = _triple(got, (q[..., rows, :], k[..., cols, :], v[..., cols, :]))
        for t, where, g in zip(total, (rows, cols, cols), got, strict=True):
            t[..., where, :] += g
    return total


def _triple(got, like) -> tuple:
    """The learner's (dq, dk, dv) as float64 on the CPU, or `Stopped` saying why not."""
    if not (isinstance(got, tuple | list) and len(got) == 3
            and all(isinstance(t, torch.Tensor) for t in got)):
        raise Stopped(crashed(BACKWARD_NAMES, "block_backward",
                              TypeError(f"returned {type(got).__name__}, not (dq, dk, dv)"),
                              TRIPLE))
    if any(t.shape != w.shape for t, w in zip(got, like, strict=True)):
        shapes = ", ".join(str(tuple(t.shape)) for t in got)
        wanted = ", ".join(str(tuple(t.shape)) for t in like)
        raise Stopped(crashed(BACKWARD_NAMES, "block_backward",
                              ValueError(f"returned shapes {shapes}; expected {wanted}"), TRIPLE))
    return tuple(t.detach().cpu().double() for t in got)


def _error(got, want) -> tuple[float, str]:
    """The largest difference over (dq, dk, dv), a nan counted infinite, and where."""
    errors = {n: (g - w).abs().nan_to_num(nan=math.inf).max().item()
              for n, g, w in zip(("dq", "dk", "dv"), got, want, strict=True)}
    worst = max(errors, key=errors.get)
    return errors[worst], worst


def grade_backward(block_backward) -> list[Check]:
    half = slice(0, L), slice(L, 2 * L)
    cases = [[_case(21, 5, 7, [(slice(0, 5), slice(0, 3), False),
                               (slice(0, 5), slice(3, 7), False)])],
             [_case(22, 2 * L, 2 * L, [(half[0], half[0], True), (half[1], half[0], False),
                                       (half[1], half[1], True)], causal=True)],
             [_case(23, 5, 7, [(slice(0, 5), slice(0, 3), False),
                               (slice(0, 5), slice(3, 7), False)], offset=offset)
              for offset in (1000.0, -1000.0)]]

    def learner(*args):
        return attempt(block_backward, *args, names=BACKWARD_NAMES, blank="block_backward",
                       label="block_backward", hint=TRIPLE)

    try:
        # copies: a learner's in-place write must not change the next block's inputs
        found = [[_summed(learner, c, lambda t: t.clone().to(device())) for c in these]
                 for these in cases]
    except Stopped as stop:
        return stop.checks
    return [_judge(BACKWARD_NAMES[i], found[i], cases[i], TOLERANCE if i < 2
                   else LARGE_TOLERANCE) for i in range(3)]


def _judge(name, found, cases, tolerance) -> Check:
    worst = 0.0
    for got, case, sign in zip(found, cases, ("+", "-"), strict=False):
        if len(cases) > 1 and not all(torch.isfinite(t).all() for t in got):
            return Check(name, False, f"scores near {sign}1000: the gradients hold inf or nan: "
                         "exp(s) overflows float64 at +1000, and exp(-1000) is 0 (0/0 is nan)",
                         tensor="dq, dk, dv", hint="exponentiate s - lse, never s alone: "
                         "exp(s - lse) is at most 1")
        error, tensor = _error(got, case["want"])
        if error > tolerance:
            return _wrong(name, found, cases, tolerance, error, tensor)
        worst = max(worst, error)
    return Check(name, True, f"largest error {worst:.1e}", max_error=worst)


def _wrong(name, found, cases, tolerance, error, tensor) -> Check:
    """Names the usual mistake that explains the learner's sums in every case, if one does."""
    for mistake, (detail, hint) in MISTAKES.items():
        fits = all(_error(got, _summed(lambda *a, m=mistake: _reference(*a, mistake=m), case))[0]
                   <= tolerance for got, case in zip(found, cases, strict=True))
        if fits:
            return Check(name, False, detail, tensor=tensor, max_error=error, hint=hint)
    return Check(name, False, f"largest error {error:.3g}, in {tensor}, against autograd's",
                 tensor=tensor, max_error=error, hint="recompute the block's share of the "
                 "softmax from the final lse; the softmax's backward subtracts, in each query "
                 "row, D = sum_j p_j dp_j over every key; dv = pᵀ·dout, dq and dk from ds")
