"""What a museum run showed, in words a learner reads without being told the bug: the step's
loss beside one device's, the first module that departs (or, outside the GPT's step, how
far the ranks' result lands), a hang's report, and the trace's collectives. Numbers are
printed as bounds (a power of ten), so another CPU prints the same lines.

``FIXES``: every bug's fix, sorted by its words (so its place says nothing of its bug).
"""

from __future__ import annotations

import math
from collections import Counter

from .catalog import BUGS, TOLERANCE

FIXES = sorted(bug.fix for bug in BUGS)


def bound(x: float) -> str:
    """`x` (a difference, ≥ 0): "is within 1e-12 of it", or the decade it departs by."""
    if not x > TOLERANCE:
        return f"is within {TOLERANCE:.0e} of it"
    k = math.floor(math.log10(x))
    return f"departs from it by between 1e{k} and 1e{k + 1}"


def collectives(trace) -> list[str]:
    """One line per (op, axis, label) of the trace's collectives: how many calls and their
    bytes, on all ranks together (counts, not times: another run prints the same)."""
    counts, sent = Counter(), Counter()
    for e in trace:
        if e.is_comm:
            counts[e.op, e.axis, e.label] += 1
            sent[e.op, e.axis, e.label] += e.nbytes
    return [f"  {n:3d} x {op} on {axis}" + (f" ({label})" if label else "")
            + f": {sent[op, axis, label]:,} bytes"
            for (op, axis, label), n in sorted(counts.items())]


def describe(visit) -> str:
    """The lines a learner gets about a broken (or fixed) run."""
    head = f"the run: {visit.context}"
    if visit.hung:
        kept = [line for line in visit.report.splitlines()
                if "had already returned" in line or line.startswith(
                    ("a collective was not joined", "the first collective"))]
        return "\n".join([head, "it hangs: CollectiveTimeout", *kept])
    lines = [head]
    if visit.reference_loss is not None:
        gap = max(abs(loss - visit.reference_loss) for loss in visit.losses)
        lines.append(f"the step's loss: one device's {visit.reference_loss:.3f}; the ranks' "
                     f"loss {bound(gap)}")
    first = visit.divergence
    if first is not None:
        lines.append(f"first divergence: {first.module}, {first.phase}, {first.tensor}, "
                     f"on rank {first.rank}: {bound(first.difference)}")
    elif visit.reference_loss is not None:
        lines.append(f"first divergence: none (every module within {TOLERANCE:.0e} of one "
                     "device)")
    else:
        lines.append("outside the GPT's step: the ranks' result against one device's "
                     f"{bound(visit.departure)}")
    lines += ["the trace's collectives (every rank):", *collectives(visit.trace)]
    return "\n".join(lines)
