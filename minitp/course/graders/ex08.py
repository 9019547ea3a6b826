"""Checks for ex08: the online-softmax merge, then one step of ring attention.

(a) `merge`, in this process, float64, against the softmax over all the keys
(torch's own, on the whole score matrix): ordinary scores split unevenly between
two blocks; scores near +1000 and −1000 (e^1000 overflows float64: the merge must
subtract before it exponentiates); an empty partial (ℓ = −inf, O = 0), which
must change nothing; and no call to `minitp.context_parallel.merge_partials`.
Plain averaging of the two outputs is named.

(b) `ring_step` at cp = 2 and 4 on real processes, float64, contiguous split:
every rank starts at out = 0, ℓ = −inf and calls the learner's step n times.
After each step the running (out, ℓ) must be the attention over the blocks of
ranks r, r−1, …, r−s (causal), and the K/V it returns must be rank r−s−1's block,
sent to ``axis.next`` (the trace) — except after the last step: by then every rank has
seen every block, so c − 1 hops suffice and a ring that skips the last (useless) one
is as right as one that makes it; after n steps, causal attention over the whole
sequence computed on one process. Named: the ring turned the wrong way (the
block of rank r+s), K/V not passed on (sent nothing, or returned its own block),
keys later than the query attended (no causal mask, or later blocks not skipped).

Why one file: the two parts grade one idea (the merge is what the ring step folds
each block in with) and share the reference partial, `_partial`; the ring's three
checks read the same per-step record, field by field.
"""

from __future__ import annotations

import math

import torch

from ... import context_parallel
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, crashed, no_shortcut, not_written, run_per_size

WORLD_SIZES = (2, 4)
B, H, C, D = 2, 2, 3, 4  # batch, heads, positions per rank, head size
TOLERANCE = 1e-12  # float64
MERGE_NAMES = ["merge: two partials give the softmax over all the keys",
               "merge: scores near +1000 and -1000 stay finite and exact",
               "merge: an empty partial (lse = -inf, out = 0) changes nothing",
               "merge: written, not borrowed from minitp.context_parallel"]
MERGE_HINT = ("lse = m + log(exp(lse1 - m) + exp(lse2 - m)) with m = torch.maximum(lse1, lse2) "
              "(or torch.logaddexp); out = exp(lse1 - lse)[..., None] * out1 + "
              "exp(lse2 - lse)[..., None] * out2")


# --------------------------------------------------------------------------- (a) the merge
def _partial(scores, values, keep):
    """The softmax over the kept keys only, and its log-sum-exp (rows, keys)."""
    masked = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(masked, dim=-1)
    weights = torch.exp(masked - lse.unsqueeze(-1)).nan_to_num(0.0)  # an empty row: zeros
    return weights @ values, lse


def _merge_case(offset: float, split: int, seed: int, empty: bool = False):
    """Two partials of scores (B, H, 5, 7) + offset and their whole softmax."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, 5, 7, generator=g, dtype=torch.float64) * 3 + offset
    values = torch.randn(B, H, 7, D, generator=g, dtype=torch.float64)
    first = torch.arange(7) < split
    if empty:
        first = torch.zeros(7, dtype=torch.bool)
    parts = [_partial(scores, values, first), _partial(scores, values, ~first)]
    whole = (torch.softmax(scores, dim=-1) @ values, torch.logsumexp(scores, dim=-1))
    return parts, whole


def _error(got, expected) -> float:
    out, lse = got
    return max((out - expected[0]).abs().max().item(), (lse - expected[1]).abs().max().item())


class _Watch:
    """Records calls of `minitp.context_parallel.merge_partials` while active."""

    def __enter__(self):
        self.calls, self._original = [], context_parallel.merge_partials

        def watched(*args, **kwargs):
            self.calls.append("minitp.context_parallel.merge_partials")
            return self._original(*args, **kwargs)

        context_parallel.merge_partials = watched
        return self

    def __exit__(self, *exc):
        context_parallel.merge_partials = self._original


def _grade_merge(merge) -> list[Check]:
    cases = {"ordinary": [_merge_case(0.0, split, seed) for seed, split in ((0, 3), (1, 1))],
             "large": [_merge_case(offset, 3, 2) for offset in (1000.0, -1000.0)],
             "empty": [_merge_case(0.0, 3, 3, empty=True)]}
    answers = {}
    with _Watch() as watch:
        for kind, these in cases.items():
            answers[kind] = []
            for (one, two), _ in these:
                try:
                    got = merge(one[0].to(device()), one[1].to(device()),
                                two[0].to(device()), two[1].to(device()))
                except NotImplementedError as exc:
                    return not_written(MERGE_NAMES, "merge", str(exc))
                except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
                    return crashed(MERGE_NAMES, f"merge ({kind} scores)", exc,
                                   "return a pair (out, lse) shaped like (out1, lse1)")
                if not (isinstance(got, tuple | list) and len(got) == 2):
                    return crashed(MERGE_NAMES, f"merge ({kind} scores)",
                                   TypeError(f"returned {type(got).__name__}, not (out, lse)"),
                                   "return a pair (out, lse) shaped like (out1, lse1)")
                answers[kind].append(tuple(t.detach().cpu().double() for t in got))
    return [_ordinary(answers["ordinary"], cases["ordinary"]),
            _large(answers["large"], cases["large"]),
            _empty(answers["empty"], cases["empty"]),
            no_shortcut(MERGE_NAMES[3], watch.calls, "write the two lines yourself: that is "
                        "the exercise")]


def _ordinary(answers, cases) -> Check:
    worst = 0.0
    for got, ((one, two), whole) in zip(answers, cases, strict=True):
        if got[0].shape != whole[0].shape or got[1].shape != whole[1].shape:
            return Check(MERGE_NAMES[0], False, f"returned shapes {tuple(got[0].shape)}, "
                         f"{tuple(got[1].shape)}; expected {tuple(whole[0].shape)}, "
                         f"{tuple(whole[1].shape)}", tensor="out", hint=MERGE_HINT)
        if torch.allclose(got[0], (one[0] + two[0]) / 2, rtol=0, atol=TOLERANCE):
            return Check(MERGE_NAMES[0], False, "the output is the plain average of the two: "
                         "a block of 3 keys and a block of 4 (or 1 and 6) do not hold equal "
                         "shares of the softmax", tensor="out", hint="weight each output by "
                         "its block's share of the mass, exp(lse_b - lse)")
        worst = max(worst, _error(got, whole))
    if worst > TOLERANCE:
        return Check(MERGE_NAMES[0], False, f"largest error {worst:.3g} against the softmax over "
                     "all the keys", tensor="out, lse", max_error=worst, hint=MERGE_HINT)
    return Check(MERGE_NAMES[0], True, f"largest error {worst:.1e}", max_error=worst)


def _large(answers, cases) -> Check:
    worst = 0.0
    for got, (_, whole), offset in zip(answers, cases, ("+1000", "-1000"), strict=True):
        if not (torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all()):
            return Check(MERGE_NAMES[1], False, f"scores near {offset}: the result holds "
                         "inf or nan: exp(1000) overflows float64 (and exp(-1000) is 0, whose "
                         "log is -inf)", tensor="lse", hint="subtract the larger lse before "
                         "exponentiating: m + log(exp(lse1 - m) + exp(lse2 - m)), or "
                         "torch.logaddexp")
        worst = max(worst, _error(got, whole))
    if worst > 1e-9:  # relative to scores of 1000: a few ulps
        return Check(MERGE_NAMES[1], False, f"largest error {worst:.3g}", tensor="out, lse",
                     max_error=worst, hint=MERGE_HINT)
    return Check(MERGE_NAMES[1], True, f"finite, largest error {worst:.1e}", max_error=worst)


def _empty(answers, cases) -> Check:
    got, (_, whole) = answers[0], cases[0]
    if not (torch.isfinite(got[0]).all() and not torch.isnan(got[1]).any()):
        return Check(MERGE_NAMES[2], False, "merging with lse = -inf gave nan: the ring starts "
                     "from out = 0, lse = -inf", tensor="out", hint="with m the larger lse, "
                     "exp(-inf - m) is 0: subtract m, not the other lse")
    error = _error(got, whole)
    if error > TOLERANCE:
        return Check(MERGE_NAMES[2], False, f"largest error {error:.3g}: the other partial "
                     "should come back unchanged", max_error=error, hint=MERGE_HINT)
    return Check(MERGE_NAMES[2], True, "the other partial, unchanged")


# --------------------------------------------------------------------------- (b) the ring
def _expected(q, k, v, r, blocks, causal=True):
    """Rank r's attention over the key blocks `blocks` (contiguous split): each a pair
    (whose block, as which rank's block it is treated): earlier than r, all of it;
    r itself, the causal triangle; later, nothing. causal=False: all of every block."""
    n_keys = k.shape[-2]
    owner = torch.arange(n_keys, device=k.device) // C
    local = torch.arange(C, device=k.device)
    keep = torch.zeros(C, n_keys, dtype=torch.bool, device=k.device)
    for block, treated_as in blocks:
        inside = (owner == block).expand(C, n_keys)
        if causal and treated_as > r:
            continue
        if causal and treated_as == r:
            inside = inside & (local.repeat(n_keys // C)[None, :] <= local[:, None])
        keep |= inside
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    return _partial(scores, v, keep.expand(scores.shape))


def _causal(q, k, v, r):
    """Rank r's rows of causal attention over the whole sequence, as one process
    computes it: the whole score matrix, masked, torch.softmax."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    queries = torch.arange(r * C, (r + 1) * C, device=k.device)
    later = torch.arange(k.shape[-2], device=k.device) > queries[:, None]
    probs = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1)
    return probs @ v, torch.logsumexp(scores.masked_fill(later, float("-inf")), dim=-1)


def _in_rank(ring_step):
    """Runs on every rank: the learner's step, n times, checked after each."""
    axis = world()
    n, r = axis.size, axis.rank
    g = torch.Generator().manual_seed(13)
    q_all, k_all, v_all = (torch.randn(B, H, n * C, D, generator=g, dtype=torch.float64)
                           .to(device()) for _ in range(3))
    block = [slice(j * C, (j + 1) * C) for j in range(n)]
    q = q_all[..., block[r], :]
    out = torch.zeros(B, H, C, D, dtype=torch.float64, device=device())
    lse = torch.full((B, H, C), float("-inf"), dtype=torch.float64, device=device())
    k, v = k_all[..., block[r], :].contiguous(), v_all[..., block[r], :].contiguous()
    steps = []
    for step in range(n):
        first = len(trace.events())
        got = ring_step(q.clone(), k, v, out, lse, step, axis)
        sent = [e.peer for e in trace.events()[first:] if e.op == "send"]
        record = {"sent": sent, "next": axis.next, "prev": axis.prev}
        if not (isinstance(got, tuple | list) and len(got) == 4
                and all(isinstance(t, torch.Tensor) for t in got)):
            record["problem"] = "did not return four tensors (out, lse, k_next, v_next)"
            steps.append(record)
            break
        out, lse, k, v = got
        if out.shape != q.shape or lse.shape != q.shape[:-1] or k.shape != (B, H, C, D):
            record["problem"] = (f"returned shapes {tuple(out.shape)}, {tuple(lse.shape)}, "
                                 f"{tuple(k.shape)}; expected {tuple(q.shape)}, "
                                 f"{tuple(q.shape[:-1])}, {(B, H, C, D)}")
            steps.append(record)
            break
        seen = [((r - j) % n, (r - j) % n) for j in range(step + 1)]
        hypotheses = {
            "right": _expected(q, k_all, v_all, r, seen),
            "reversed": _expected(q, k_all, v_all, r, [((r + j) % n,) * 2
                                                       for j in range(step + 1)]),
            "wrong source": _expected(q, k_all, v_all, r, [((r - j) % n, (r + j) % n)
                                                           for j in range(step + 1)]),
            "no mask": _expected(q, k_all, v_all, r, seen, causal=False)}
        record["errors"] = {name: _error((out, lse), h) for name, h in hypotheses.items()}
        record["holds"] = [j for j in range(n)
                           if torch.equal(k, k_all[..., block[j], :])
                           and torch.equal(v, v_all[..., block[j], :])]
        steps.append(record)
    whole = _causal(q, k_all, v_all, r)
    final = _error((out, lse), whole) if out.shape == q.shape and lse.shape == q.shape[:-1] \
        else None
    return {"steps": steps, "final": final}


def _names(n) -> list[str]:
    return [f"cp={n}: each step (the last may skip it) sends K and V to axis.next and "
            "returns rank r-s-1's block",
            f"cp={n}: after each step s, (out, lse) is the attention over ranks r, r-1, .., r-s",
            f"cp={n}: after {n} steps, equals causal attention over the whole sequence"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_passing(names[0], per_rank, n), _steps(names[1], per_rank, n),
            _final(names[2], per_rank)]


def _problem(name, per_rank) -> Check | None:
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            if "problem" in s:
                return Check(name, False, f"rank {rank}, step {step}: {s['problem']}", rank=rank,
                             hint="return (out, lse, k_next, v_next), each shaped like the "
                                  "one it replaces")
    return None


def _passing(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            where = f"rank {rank}, step {step}"
            if step == n - 1 and not s["sent"]:
                continue  # the last hop carries a block no rank needs: skipping it is right
            if not s["sent"]:
                return Check(name, False, f"{where}: sent nothing: K/V not passed on", rank=rank,
                             hint="every step but the last, send k and v to axis.next and "
                                  "receive the next block from axis.prev (mt.comm.sendrecv)")
            if any(peer != s["next"] for peer in s["sent"]):
                return Check(name, False, f"{where}: sent to rank(s) {sorted(set(s['sent']))}; "
                             f"axis.next is rank {s['next']}", rank=rank,
                             hint="the blocks travel one way: send to axis.next, receive from "
                                  "axis.prev")
            want = (rank - step - 1) % n
            if s["holds"] != [want]:
                held = (f"rank {s['holds'][0]}'s block" if s["holds"]
                        else "no rank's block")
                why = (": its own, the received one was dropped" if s["holds"] == [rank]
                       else "")
                return Check(name, False, f"{where}: returned {held}{why}; it should return "
                             f"rank {want}'s, received from axis.prev", rank=rank,
                             tensor="k_next, v_next",
                             hint="return what sendrecv wrote into the receive buffers")
    return Check(name, True, "every step before the last: K and V sent to axis.next, the block "
                 "of rank r-s-1 returned")


def _steps(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    worst, failed = 0.0, []
    for rank, found in enumerate(per_rank):
        for step, s in enumerate(found["steps"]):
            if s["errors"]["right"] <= TOLERANCE:
                worst = max(worst, s["errors"]["right"])
            else:
                failed.append((rank, step, s["errors"]))
    if not failed:
        return Check(name, True, f"largest error {worst:.1e}", max_error=worst)
    # Name the mistake that explains every failed step (one step alone can fit two).
    rank, step, errors = failed[0]
    where = f"rank {rank}, after step {step}"
    fits = [m for m in ("wrong source", "reversed", "no mask")
            if all(e[m] <= TOLERANCE for _, _, e in failed)]
    if "wrong source" in fits:
        return Check(name, False, f"{where}: treated the block it held as rank "
                     f"{(rank + step) % n}'s; it was rank {(rank - step) % n}'s", rank=rank,
                     hint="blocks arrive from axis.prev: at step s a rank holds the block of "
                          "rank (r - s) % n, and that rank decides the mask (earlier: all, "
                          "itself: causal, later: skip)")
    if "reversed" in fits:
        return Check(name, False, f"{where}: the attention over ranks {rank}, "
                     f"{(rank + 1) % n}, ..: the blocks of ranks r+s, the ring turned the wrong "
                     "way", rank=rank, hint="K/V go to axis.next, so at step s a rank holds "
                     "the block of rank (r - s) % n")
    if "no mask" in fits:
        return Check(name, False, f"{where}: attended to keys later than the query", rank=rank,
                     hint="a block from a later rank is skipped, this rank's own is causal "
                          "(causal=True), an earlier rank's is whole")
    return Check(name, False, f"{where}: largest error {errors['right']:.3g}", rank=rank,
                 tensor="out, lse", max_error=errors["right"],
                 hint="compute the held block's partial with block_attention and merge it "
                      "into (out, lse); skip blocks of later ranks")


def _final(name, per_rank) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    rank, error = max(enumerate(f["final"] for f in per_rank), key=lambda p: p[1])
    if error > TOLERANCE:
        return Check(name, False, f"rank {rank}: largest error {error:.3g}", rank=rank,
                     tensor="out, lse", max_error=error,
                     hint="after n steps every block has visited every rank once")
    return Check(name, True, f"largest error {error:.1e}", max_error=error)


def run(module) -> list[Check]:
    checks = _grade_merge(module.merge)

    def launch_at(n):
        return launch(_in_rank, n, module.ring_step, timeout=20.0)

    return checks + run_per_size(WORLD_SIZES, _names, launch_at, _judge,
                                 what="ring_step", size="cp")
