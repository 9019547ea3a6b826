"""Checks for ex08: the online-softmax merge, the load-balanced split, one step of ring
attention.

(a) `merge`, in this process, float64, against the softmax over all the keys
(torch's own, on the whole score matrix): ordinary scores split unevenly between
two blocks; scores near +1000 and −1000 (e^1000 overflows float64: the merge must
subtract before it exponentiates); an empty partial (ℓ = −inf, O = 0), which
must change nothing; and no call to `minitp.context_parallel.merge_partials`.
Plain averaging of the two outputs is named.

(b) `chunks_of` and `split`, in this process, at cp = 2 and 4, every rank: the two
chunks (of 2·cp) rank r holds, r and 2·cp − 1 − r, early one first, cut out of a
float64 tensor, and their positions in the whole sequence. Named: a contiguous
split, the late chunk first, positions counted from 0 on every rank.

(c) `ring_step` at cp = 2 and 4 on real processes, float64, the load-balanced split
(this grader's own, so (c) does not depend on (b)'s answer): every rank starts at
out = 0, ℓ = −inf and calls the learner's step cp times.
* The trace: every step sends K and V to ``axis.next`` and returns the block it
  received (rank r−s−1's) — except after the last step, where c − 1 hops suffice
  and a ring that skips the last (useless) one is as right as one that makes it.
* After each step s, the running (out, ℓ) must be the attention over the blocks of
  ranks r, r−1, …, r−s: each of the rank's two query chunks against each key chunk
  that arrived, whole if the key chunk lies before, the causal triangle if it is
  the same chunk, nothing if it lies after. A wrong result is matched against what
  each usual mistake gives, folded step by step in float64: chunks numbered as a
  contiguous split; each query chunk paired with the same-numbered key chunk only;
  the block's two key chunks swapped; a later chunk attended; the diagonal chunk
  without its triangle; the block taken for rank r+s's, fetched from the wrong side,
  or both (the ring turned the wrong way).
* After cp steps, causal attention over the whole sequence computed on one process.
* The work: every call of the learner's `block_attention` is counted, in
  (chunk × chunk) blocks; each rank must compute the 2·cp + 1 the causal mask
  keeps, the same on every rank.
* The backward. The exercise's functions are forward-only (minitp's ring makes its own
  backward ring, sending dK and dV home); what is checked is autograd through the
  learner's steps, once the forward is right: every block a rank held enters its step
  as a leaf, sum(out · w) is differentiated on each rank, and q's gradient must equal
  causal attention's (one process, float64) there, and each block's gradient, this
  rank's share, summed over the ranks it visited (home, at its owner), must equal its
  owner's dK, dV. Named: a running (out, lse) written in place (autograd saved it for
  the merge's backward), a step that cut the graph (no gradient at all).

Why one file: the three parts grade one idea (ring attention, balanced) and the
ring's five checks read the same per-step record, field by field.
"""

from __future__ import annotations

import math

import torch

from ... import context_parallel
from ...rules import cp_chunks
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, crashed, no_shortcut, not_written, run_per_size

WORLD_SIZES = (2, 4)
B, H, L, D = 2, 2, 3, 4  # batch, heads, positions per chunk (a rank holds two), head size
TOLERANCE = 1e-12  # float64
MERGE_NAMES = ["merge: two partials give the softmax over all the keys",
               "merge: scores near +1000 and -1000 stay finite and exact",
               "merge: an empty partial (lse = -inf, out = 0) changes nothing",
               "merge: written, not borrowed from minitp.context_parallel"]
MERGE_HINT = ("lse is the log of e^lse1 + e^lse2, computed as m + log(e^(lse1 - m) + "
              "e^(lse2 - m)) with m the larger (or torch.logaddexp); out weights each "
              "block's output by its share of the mass, e^(lse_b - lse)")


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
    """The largest difference over (out, lse); an lse of -inf on both sides (a row that
    attended to nothing yet) agrees, and a nan never does."""
    worst = 0.0
    for a, b in zip(got, expected, strict=True):
        diff = torch.where(torch.isinf(a) & (a == b), 0.0, (a - b).abs())
        worst = max(worst, diff.nan_to_num(nan=math.inf).max().item())
    return worst


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


# --------------------------------------------------------------------------- (b) the split
SPLIT_SIZES = (2, 4)
SPLIT_NAMES = ["split: rank r holds chunks r and 2cp-1-r of the 2cp, early one first "
               "(cp = 2 and 4)",
               "split: the positions are the chunks' places in the whole sequence"]
SPLIT_HINT = ("cut the sequence into 2·cp chunks; rank r takes chunk r from the start and "
              "chunk r from the end (counting from 0): one early, one late")


def _grade_split(chunks_of, split) -> list[Check]:
    g = torch.Generator().manual_seed(8)
    found = []
    for cp in SPLIT_SIZES:
        x = torch.randn(B, H, 2 * cp * L, D, generator=g, dtype=torch.float64)
        for rank in range(cp):
            try:
                ids = chunks_of(rank, cp)
            except NotImplementedError as exc:
                return not_written(SPLIT_NAMES, "chunks_of", str(exc))
            except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
                return crashed(SPLIT_NAMES, f"chunks_of({rank}, {cp})", exc,
                               "return the two chunk numbers, early one first")
            try:
                got = split(x.to(device()), rank, cp)
            except NotImplementedError as exc:
                return not_written(SPLIT_NAMES, "split", str(exc))
            except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
                return crashed(SPLIT_NAMES, f"split(x, {rank}, {cp})", exc,
                               "return (part, positions): the two chunks of x along dim -2, "
                               "concatenated, and their positions")
            if not (isinstance(got, tuple | list) and len(got) == 2
                    and isinstance(got[0], torch.Tensor)):
                return crashed(SPLIT_NAMES, f"split(x, {rank}, {cp})",
                               TypeError(f"returned {type(got).__name__}, not (part, positions)"),
                               "return a pair (part, positions)")
            found.append((cp, rank, ids, got[0].detach().cpu().double(), got[1], x))
    return [_chunks(found), _positions(found)]


def _ints(value) -> list[int] | None:
    try:
        return [int(i) for i in torch.as_tensor(value).flatten().tolist()]
    except (TypeError, ValueError, RuntimeError):
        return None


def _chunks(found) -> Check:
    for cp, rank, ids, part, _, x in found:
        want, where = cp_chunks(rank, cp), f"rank {rank} of cp={cp}"
        got = _ints(ids)
        if got != list(want):
            if got == [2 * rank, 2 * rank + 1]:
                why = (f"chunks {got[0]} and {got[1]}: a contiguous split, which leaves rank 0 "
                       f"the least causal work and rank {cp - 1} the most")
            elif got == list(want)[::-1]:
                why = f"{tuple(got)}: the late chunk first"
            else:
                why = f"{ids!r}"
            return Check(SPLIT_NAMES[0], False, f"{where}: chunks_of gives {why}; it holds "
                         f"chunks {want[0]} and {want[1]}, early one first", rank=rank,
                         hint=SPLIT_HINT)
        chunks = x.chunk(2 * cp, dim=-2)
        expected = torch.cat([chunks[c] for c in want], dim=-2)
        if part.shape != expected.shape:
            return Check(SPLIT_NAMES[0], False, f"{where}: the part has shape "
                         f"{tuple(part.shape)}; expected {tuple(expected.shape)}", rank=rank,
                         tensor="part", hint="two chunks of L positions each, along dim -2")
        if not torch.equal(part, expected):
            if torch.equal(part, x[..., rank * 2 * L:(rank + 1) * 2 * L, :]):
                why = (f"positions {rank * 2 * L}..{(rank + 1) * 2 * L - 1} of x: a "
                       "contiguous split")
            elif torch.equal(part, torch.cat([chunks[c] for c in want[::-1]], dim=-2)):
                why = "its two chunks, the late one first"
            else:
                why = f"not chunks {want[0]} and {want[1]} of x"
            return Check(SPLIT_NAMES[0], False, f"{where}: the part is {why}", rank=rank,
                         tensor="part", hint=SPLIT_HINT)
    return Check(SPLIT_NAMES[0], True, "every rank's two chunks, at cp = 2 and 4")


def _positions(found) -> Check:
    got = {(cp, rank): _ints(positions) for cp, rank, _, _, positions, _ in found}
    for cp in SPLIT_SIZES:
        want = {r: [p for c in cp_chunks(r, cp) for p in range(c * L, (c + 1) * L)]
                for r in range(cp)}
        wrong = [r for r in range(cp) if got[cp, r] != want[r]]
        if not wrong:
            continue
        rank = wrong[0]
        where = f"rank {rank} of cp={cp}: positions {got[cp, rank]}"
        # Rank 0's are the same both ways: a mistake is named only where every rank shows it.
        if all(got[cp, r] == list(range(2 * L)) for r in range(cp)):
            why = "counted from 0 on every rank: places in the rank's part, not in the sequence"
        elif all(got[cp, r] == list(range(r * 2 * L, (r + 1) * 2 * L)) for r in range(cp)):
            why = "a contiguous split's"
        else:
            why = "not where its chunks sit"
        return Check(SPLIT_NAMES[1], False, f"{where}: {why}; expected {want[rank]}",
                     rank=rank, tensor="positions",
                     hint="chunk c of L positions starts at position c·L of the whole sequence")
    return Check(SPLIT_NAMES[1], True, "every rank's positions, at cp = 2 and 4")


# --------------------------------------------------------------------------- (c) the ring
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


def _names(n) -> list[str]:
    return [f"cp={n}: each step (the last may skip it) sends K and V to axis.next and "
            "returns rank r-s-1's block",
            f"cp={n}: after each step s, (out, lse) is the attention over the blocks of ranks "
            "r, r-1, .., r-s",
            f"cp={n}: after {n} steps, equals causal attention over the whole sequence",
            f"cp={n}: every rank computes the {2 * n + 1} (chunk x chunk) blocks the causal "
            "mask keeps: the same work",
            f"cp={n}: backward through the steps: the gradients of q, and of K and V summed "
            "at their owner, equal causal attention's"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_passing(names[0], per_rank, n), _steps(names[1], per_rank, n),
            _final(names[2], per_rank), _work(names[3], per_rank, n),
            _backward(names[4], per_rank, n)]


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
    for mistake in HYPOTHESES[1:]:
        if all(e[mistake] <= TOLERANCE for _, _, e in failed):
            detail, hint = _diagnosis(mistake, rank, step, n)
            return Check(name, False, f"rank {rank}, after step {step}: {detail}", rank=rank,
                         tensor="out, lse", hint=hint)
    return Check(name, False, f"rank {rank}, after step {step}: largest error "
                 f"{errors['right']:.3g}", rank=rank, tensor="out, lse",
                 max_error=errors["right"],
                 hint="for each of your query chunks and each key chunk that arrived: "
                      "block_attention on what the causal mask keeps, merged into that query "
                      "chunk's rows of (out, lse)")


MASK = ("each (query chunk, key chunk) pair: a key chunk before the query chunk, whole; the "
        "same chunk, the causal triangle; a key chunk after it, nothing")


def _diagnosis(mistake, rank, step, n) -> tuple[str, str]:
    """What the learner's step did, in words, and what to do instead."""
    owner = (rank - step) % n
    mine, theirs = cp_chunks(rank, n), cp_chunks(owner, n)
    pairs = [(mine[a], theirs[b]) for a in range(2) for b in range(2)]
    if mistake == "wrong owner":
        return (f"treated the K/V it held as rank {(rank + step) % n}'s; they were rank "
                f"{owner}'s", "the blocks move one rank per step toward axis.next: count "
                "which rank's K/V have reached this one after `step` moves")
    if mistake == "reversed":
        return (f"the attention over the blocks of ranks {rank}, {(rank + 1) % n}, ..: the "
                "ring turned the wrong way", "K/V go to axis.next and come from axis.prev")
    if mistake == "wrong way":
        return (f"computed with rank {(rank + step) % n}'s K/V as if they were rank {owner}'s: "
                "they came round the ring from axis.next", "send to axis.next, receive from "
                "axis.prev")
    if mistake == "contiguous":
        return (f"numbered its chunks {2 * rank} and {2 * rank + 1}, and the K/V's "
                f"{2 * owner} and {2 * owner + 1}, as a contiguous split would; it holds chunks "
                f"{mine[0]} and {mine[1]}, and the K/V it held were rank {owner}'s chunks "
                f"{theirs[0]} and {theirs[1]}", "every rank holds chunks_of(its rank): "
                "yours, and the K/V's owner's")
    if mistake == "same halves":
        return ("each query chunk met only the key chunk in the same place (first with "
                "first, second with second)", "both query chunks meet both key chunks, "
                f"four pairs per step; {MASK}")
    if mistake == "keys swapped":
        return (f"took the K/V's first chunk for chunk {theirs[1]} and its second for chunk "
                f"{theirs[0]}", "K/V arrive as their owner's split cut them: the early chunk "
                "first")
    if mistake == "later":
        q_chunk, k_chunk = next(p for p in pairs if _kind(*p) is None)
        return (f"attended to key chunk {k_chunk}, which lies after query chunk {q_chunk}: "
                "every key in it is later than every query", f"skip it: {MASK}")
    q_chunk = next(q for q, k in pairs if q == k)  # "no triangle"
    return (f"attended to all of key chunk {q_chunk} for query chunk {q_chunk}, itself: the "
            "keys after each query were seen", "the block on the diagonal is the causal "
            "triangle: block_attention(..., causal=True)")


def _final(name, per_rank) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    rank, error = max(enumerate(f["final"] for f in per_rank), key=lambda p: p[1])
    if error > TOLERANCE:
        return Check(name, False, f"rank {rank}: largest error {error:.3g}", rank=rank,
                     tensor="out, lse", max_error=error,
                     hint="after cp steps every block has visited every rank once")
    return Check(name, True, f"largest error {error:.1e}", max_error=error)


def _work(name, per_rank, n) -> Check:
    bad = _problem(name, per_rank)
    if bad:
        return bad
    counts, want = [f["blocks"] for f in per_rank], 2 * n + 1
    if 0 in counts:
        rank = counts.index(0)
        return Check(name, False, f"rank {rank} computed no block through block_attention",
                     rank=rank, hint="compute each (query chunk, key chunk) block with "
                     "block_attention: the grader counts its calls, in chunk x chunk blocks")
    if len(set(counts)) > 1:
        shown = ", ".join(f"rank {r}: {c:g}" for r, c in enumerate(counts))
        return Check(name, False, f"blocks computed: {shown}: unequal, and every step of the "
                     "ring waits for the busiest rank", rank=counts.index(max(counts)),
                     hint="one early chunk and one late chunk per rank need the same work "
                          f"together, {want} blocks at cp={n}: " + MASK)
    if counts[0] > want:
        return Check(name, False, f"every rank computed {counts[0]:g} blocks where the causal "
                     f"mask keeps {want}: blocks whose keys all come after their queries were "
                     "computed", hint="a key chunk after the query chunk needs no block")
    if counts[0] < want:
        return Check(name, False, f"every rank computed {counts[0]:g} blocks where the causal "
                     f"mask keeps {want}: some were skipped", hint=MASK)
    return Check(name, True, f"every rank computed {want} blocks (a triangle counted as one)")


def _backward(name, per_rank, n) -> Check:
    """The exercise's functions are forward-only: the gradients are autograd's, through the
    learner's `ring_step` (its masking, its `merge`, its bookkeeping of out and lse). Each
    block a rank held is a leaf of its own, so its gradient is this rank's share of the
    owner's dK, dV; the shares are summed at their owner (the journey home that minitp's
    ring makes in backward), and compared with causal attention's, float64."""
    bad = _problem(name, per_rank)
    if bad:
        return bad
    if any(f["final"] is None or f["final"] > TOLERANCE for f in per_rank) or any(
            kv[0] is None for f in per_rank for kv in f["grads"]["dkv"]):
        return Check(name, False, "not checked: the forward above is wrong")
    for rank, f in enumerate(per_rank):
        g = f["grads"]
        if g["crash"] and WRITTEN in g["crash"]:
            return Check(name, False, f"rank {rank}: backward failed: a tensor the merge saved "
                         "was written in place since (the running out or lse)", rank=rank,
                         tensor="out, lse", hint="the forward is right, but autograd saved the "
                         "running (out, lse) to differentiate the merge; build the new result "
                         "(torch.cat of the merged chunks), never write into out or lse")
        if g["crash"]:
            return Check(name, False, f"rank {rank}: backward raised RuntimeError: "
                         f"{g['crash']}", rank=rank, hint="every operation from q, k, v to out "
                         "must be one autograd can differentiate")
        if g["cut"] or not (g["dq"].any() or any(t.any() for _, *kv in g["dkv"] for t in kv)):
            return Check(name, False, f"rank {rank}: no gradient reached q, k or v: the "
                         "step cut the graph", rank=rank, tensor="out",
                         hint="the values are right, but something detached them "
                              "(.detach(), .data, torch.no_grad(), a copy through numpy): "
                              "training would learn nothing from the attention")
    worst = 0.0
    for rank, f in enumerate(per_rank):  # q never travels: its gradient is the rank's own
        error = (f["grads"]["dq"] - f["grads"]["want"][0]).abs().nan_to_num(math.inf).max()
        if error > TOLERANCE:
            return Check(name, False, f"rank {rank}: the gradient of q is off by {error:.3g}",
                         rank=rank, tensor="q.grad", max_error=error.item(), hint=GRAD_HINT)
        worst = max(worst, error.item())
    for owner in range(n):  # each block's gradient home: every rank's share, summed
        home = [sum(kv[1 + i] for f in per_rank for kv in f["grads"]["dkv"] if kv[0] == owner)
                for i in range(2)]
        for i, tensor in enumerate(("k", "v")):
            error = (home[i] - per_rank[owner]["grads"]["want"][1 + i]).abs()
            error = error.nan_to_num(math.inf).max()
            if error > TOLERANCE:
                return Check(name, False, f"rank {owner}: the gradient of its {tensor}, summed "
                             f"over the ranks that attended to it, is off by {error:.3g}",
                             rank=owner, tensor=f"{tensor}.grad", max_error=error.item(),
                             hint=GRAD_HINT)
            worst = max(worst, error.item())
    return Check(name, True, f"dq on every rank, dK and dV summed at their owner: largest "
                 f"error {worst:.1e}", max_error=worst)


WRITTEN = "modified by an inplace operation"  # autograd's version check
GRAD_HINT = ("the forward is right, so the backward differs where autograd sees operations "
             "the values do not show: a nan or inf in a masked-out branch (torch.where), or a "
             "result built from copies instead of the merge's own tensors")


def run(module) -> list[Check]:
    checks = _grade_merge(module.merge) + _grade_split(module.chunks_of, module.split)

    def launch_at(n):
        return launch(_in_rank, n, module.ring_step, timeout=20.0)

    return checks + run_per_size(WORLD_SIZES, _names, launch_at, _judge,
                                 what="ring_step", size="cp")
