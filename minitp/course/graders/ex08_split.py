"""ex08 (b): the learner's `chunks_of` and `split`, in this process, at cp = 2 and 4,
every rank: the load-balanced split's two chunks and their positions (see ex08.py)."""

from __future__ import annotations

import torch

from ...rules import cp_chunks
from ...runtime._device import device
from .base import Check, Stopped, attempt, crashed
from .ex08_merge import B, D, H, L

SPLIT_SIZES = (2, 4)
SPLIT_NAMES = ["split: rank r holds chunks r and 2cp-1-r of the 2cp, early one first "
               "(cp = 2 and 4)",
               "split: the positions are the chunks' places in the whole sequence"]
SPLIT_HINT = ("cut the sequence into 2·cp chunks; rank r takes chunk r from the start and "
              "chunk r from the end (counting from 0): one early, one late")


def grade_split(chunks_of, split) -> list[Check]:
    g = torch.Generator().manual_seed(8)
    found = []
    try:
        for cp in SPLIT_SIZES:
            x = torch.randn(B, H, 2 * cp * L, D, generator=g, dtype=torch.float64)
            for rank in range(cp):
                found.append((cp, rank, *_answer(chunks_of, split, x, rank, cp), x))
    except Stopped as stop:
        return stop.checks
    return [_chunks(found), _positions(found)]


def _answer(chunks_of, split, x, rank, cp) -> tuple:
    """The learner's chunk numbers and (part, positions) for one rank (`Stopped` if a
    call failed)."""
    ids = attempt(chunks_of, rank, cp, names=SPLIT_NAMES, blank="chunks_of",
                  label=f"chunks_of({rank}, {cp})",
                  hint="return the two chunk numbers, early one first")
    label = f"split(x, {rank}, {cp})"
    got = attempt(split, x.to(device()), rank, cp, names=SPLIT_NAMES, blank="split",
                  label=label, hint="return (part, positions): the two chunks of x along "
                  "dim -2, concatenated, and their positions")
    if not (isinstance(got, tuple | list) and len(got) == 2
            and isinstance(got[0], torch.Tensor)):
        raise Stopped(crashed(SPLIT_NAMES, label,
                              TypeError(f"returned {type(got).__name__}, not (part, positions)"),
                              "return a pair (part, positions)"))
    return ids, got[0].detach().cpu().double(), got[1]


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
