"""`stragglers(run)`: from a run's trace, who waited for whom. MEASURED: the times are
what the ranks' clocks said (seconds since the launch began, one clock on one machine).

A collective ends on every rank only once its last rank has arrived; until then the
others wait. So for each collective (the k-th call on a group of ranks, matched across
its ranks as `_collective_checks` matches calls), the rank that entered it last is the
one the others waited for, and each other rank's wait is how much earlier it came.
A rank's time computing is the part of its traced span (from its first event's start
to its last event's end) spent outside any message or collective.

After Megatron-LM's straggler detector (``StragglerDetector`` in megatron/core/utils.py,
megatron/core/README_STRAGGLER.md), which times each rank's kernels and reports the
slowest ranks.
Read with care: a collective started without waiting (``all_reduce_start``) counts
from its post, while the rank may compute meanwhile, so its wait is an upper bound;
point-to-point messages are not matched (a pipeline's stage that waits on a ``recv``
is waiting on its neighbour's compute, not on a straggler of a group).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Collective:
    """One collective as every rank of its group called it: the ``index``-th on that
    group, when each rank arrived, and (`last`) the one the others waited for."""

    index: int
    op: str
    axis: str
    ranks: tuple[int, ...]
    arrived: dict[int, float]  # rank -> when it entered the op (s)

    @property
    def last(self) -> int:
        return max(self.ranks, key=lambda r: (self.arrived[r], r))

    @property
    def waits(self) -> dict[int, float]:
        """Seconds each rank of the group waited for `last` to arrive."""
        end = self.arrived[self.last]
        return {r: end - self.arrived[r] for r in self.ranks}


@dataclass(frozen=True)
class Stragglers:
    """Per rank: seconds computing, seconds waiting in collectives for later ranks, and
    seconds the others waited for it (summed over the ranks that waited); and every
    matched collective, in the order they ended."""

    computing: dict[int, float]
    waiting: dict[int, float]
    waited_for: dict[int, float]
    collectives: tuple[Collective, ...]

    @property
    def straggler(self) -> int:
        """The rank the others waited for longest in all."""
        return max(self.waited_for, key=lambda r: (self.waited_for[r], -r))

    def __str__(self) -> str:
        rows = [("rank", "computing (s)", "waiting (s)", "others waited for it (s)")]
        rows += [(str(r), f"{self.computing[r]:.3f}", f"{self.waiting[r]:.3f}",
                  f"{self.waited_for[r]:.3f}") for r in sorted(self.computing)]
        lines = ["stragglers (MEASURED, this run's clocks):", *_table(rows)]
        lines.append(f"the slowest: rank {self.straggler} (the others waited "
                     f"{self.waited_for[self.straggler]:.3f} s for it in all)")
        rows = [("#", "op", "axis", "ranks", "last to arrive", "the others waited (s)")]
        for c in self.collectives:
            waited = max((w for r, w in c.waits.items() if r != c.last), default=0.0)
            rows.append((str(c.index), c.op, c.axis, str(list(c.ranks)), f"rank {c.last}",
                         f"up to {waited:.3f}"))
        lines += ["each collective (#: its number on its group):", *_table(rows)]
        return "\n".join(lines)


def stragglers(run) -> Stragglers:
    """Each rank's time computing and waiting, each collective's last rank to arrive (the
    one the others waited for), and which rank the others waited for most. `run`: what
    `mt.launch` returned (or its ``.trace``, a list of `mt.trace.Event`)."""
    events = run.trace if hasattr(run, "trace") else run
    if not isinstance(events, list | tuple) or not all(hasattr(e, "group_ranks")
                                                       for e in events):
        raise TypeError(f"stragglers needs a run (what mt.launch returns) or its trace, "
                        f"got {type(run).__name__}")
    collectives = _matched(events)
    if not collectives:
        raise ValueError("stragglers: the trace holds no collective that two ranks joined "
                         "(one process, tracing paused, or --impl torch's own collectives)")
    ranks = sorted({r for c in collectives for r in c.ranks})
    waiting = dict.fromkeys(ranks, 0.0)
    waited_for = dict.fromkeys(ranks, 0.0)
    for c in collectives:
        for r, w in c.waits.items():
            waiting[r] += w
            waited_for[c.last] += w
    return Stragglers({r: _computing([e for e in events if e.rank == r]) for r in ranks},
                      waiting, waited_for, tuple(collectives))


def _matched(events) -> list[Collective]:
    """The k-th collective on each group on every rank of it, where all its ranks have
    a k-th and call it the same op (a trace from a failed or partly paused run may not)."""
    calls: dict[tuple, dict[int, list]] = {}
    for e in sorted(events, key=lambda e: e.start):
        if e.is_comm and len(e.group_ranks) > 1:
            calls.setdefault((e.axis, e.group_ranks), {}).setdefault(e.rank, []).append(e)
    out = []
    for (axis, ranks), by_rank in calls.items():
        if set(by_rank) != set(ranks):
            continue
        for k in range(min(len(v) for v in by_rank.values())):
            joined = {r: by_rank[r][k] for r in ranks}
            if len({e.op for e in joined.values()}) > 1:
                break  # the ranks' calls part here: nothing after it matches
            out.append((max(e.end for e in joined.values()),
                        Collective(k, joined[ranks[0]].op, axis, tuple(ranks),
                                   {r: e.start for r, e in joined.items()})))
    return [c for _, c in sorted(out, key=lambda pair: pair[0])]


def _computing(events) -> float:
    """Seconds of the rank's traced span outside every message and collective."""
    if not events:
        return 0.0
    span = max(e.end for e in events) - min(e.start for e in events)
    busy, reach = 0.0, float("-inf")
    for e in sorted((e for e in events if e.is_comm), key=lambda e: e.start):
        start = max(e.start, reach)  # collectives in flight at once: their union
        if e.end > start:
            busy += e.end - start
        reach = max(reach, e.end)
    return span - busy


def _table(rows) -> list[str]:
    """Columns aligned: numbers to the right, words to the left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    numeric = [all(_is_number(row[i]) for row in rows[1:]) for i in range(len(widths))]
    return ["  " + "  ".join(c.rjust(w) if right else c.ljust(w)
                             for c, w, right in zip(row, widths, numeric, strict=True)).rstrip()
            for row in rows]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
