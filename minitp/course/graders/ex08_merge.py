"""ex08 (a): the learner's `merge` of two online-softmax partials, in this process,
float64, against torch's softmax over all the keys (see ex08.py for the whole exercise).

Also the shapes and the error measure every part of ex08 uses.
"""

from __future__ import annotations

import math

import torch

from ... import context_parallel
from ...runtime._device import device
from .base import Check, Stopped, attempt, crashed, no_shortcut

B, H, L, D = 2, 2, 3, 4  # batch, heads, positions per chunk (a rank holds two), head size
TOLERANCE = 1e-12  # float64
MERGE_NAMES = ["merge: two partials give the softmax over all the keys",
               "merge: scores near +1000 and -1000 stay finite and exact",
               "merge: an empty partial (lse = -inf, out = 0) changes nothing",
               "merge: written, not borrowed from minitp.context_parallel"]
MERGE_HINT = ("lse is the log of e^lse1 + e^lse2, computed as m + log(e^(lse1 - m) + "
              "e^(lse2 - m)) with m the larger (or torch.logaddexp); out weights each "
              "block's output by its share of the mass, e^(lse_b - lse)")


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


PAIR = "return a pair (out, lse) shaped like (out1, lse1)"


def _answer(merge, kind, one, two) -> tuple:
    """The learner's merge of one case, as float64 on the CPU (`Stopped` if it failed)."""
    label = f"merge ({kind} scores)"
    got = attempt(merge, one[0].to(device()), one[1].to(device()), two[0].to(device()),
                  two[1].to(device()), names=MERGE_NAMES, blank="merge", label=label, hint=PAIR)
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise Stopped(crashed(MERGE_NAMES, label,
                              TypeError(f"returned {type(got).__name__}, not (out, lse)"), PAIR))
    return tuple(t.detach().cpu().double() for t in got)


def grade_merge(merge) -> list[Check]:
    cases = {"ordinary": [_merge_case(0.0, split, seed) for seed, split in ((0, 3), (1, 1))],
             "large": [_merge_case(offset, 3, 2) for offset in (1000.0, -1000.0)],
             "empty": [_merge_case(0.0, 3, 3, empty=True)]}
    answers = {}
    with _Watch() as watch:
        try:
            for kind, these in cases.items():
                answers[kind] = [_answer(merge, kind, one, two) for (one, two), _ in these]
        except Stopped as stop:
            return stop.checks
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
