"""Checks for ex09: a tensor-parallel rank's K/V heads and the ranks that share them
(grouped-query attention), and a context-parallel rank's global positions.

The reference is what minitp builds, not a second copy of the arithmetic: the K/V
heads come from the parallel model's own rules (`minitp.rules.heads.kv_layout`: split
over tp, or a head replicated to ``ReplicatedKV.head``), the positions from
`minitp.context_parallel.split.global_positions`, which `ContextParallelRotary` turns
q and k by. Each common mistake is named: a rank with no K/V head when tp is above
n_kv (the split applied where it cannot be), every tp rank summing a replicated head's
gradient (or none), positions counted from 0 on every rank, or the contiguous split.
No process is launched.
"""

from __future__ import annotations

from types import SimpleNamespace

from ...context_parallel.split import global_positions
from ...rules.heads import kv_layout
from .base import Check, crashed, not_written

# (tp, n_head, n_kv): split (tp divides n_kv), equal, replicated (tp above n_kv), MQA
HEADS = ((2, 8, 4), (4, 8, 4), (4, 8, 2), (8, 8, 2), (4, 4, 1), (2, 12, 6))
POSITIONS = ((8, 0, 2), (8, 1, 2), (4, 3, 4), (12, 2, 4))  # (length, cp rank, cp)
NAMES = ["kv_heads_of: every rank's K/V heads, split and replicated",
         "sharing_ranks: the ranks a K/V head's gradient is summed over",
         "rope_positions: each cp rank's global positions (the load-balanced split)"]


def _kv_reference(rank, tp, n_head, n_kv):
    cfg = SimpleNamespace(kv_heads=n_kv, n_head=n_head)
    if kv_layout(cfg, tp) == "split":
        return list(range(rank * n_kv // tp, (rank + 1) * n_kv // tp))
    return [rank * n_kv // tp]  # ReplicatedKV.head


def _sharing_reference(rank, tp, n_head, n_kv):
    mine = _kv_reference(rank, tp, n_head, n_kv)
    return [r for r in range(tp) if _kv_reference(r, tp, n_head, n_kv) == mine]


def _positions_reference(length, rank, cp):
    return global_positions(length, SimpleNamespace(rank=rank, size=cp)).tolist()


def run(module) -> list[Check]:
    for function in ("kv_heads_of", "sharing_ranks", "rope_positions"):
        if not hasattr(module, function):
            return [Check(n, False, f"the file has no {function}",
                          hint="keep the names of the exercise file") for n in NAMES]
    checks = []
    for name, check in zip(NAMES, (_kv_heads, _sharing, _positions), strict=True):
        try:
            checks.append(check(module, name))
        except NotImplementedError as exc:
            checks += not_written([name], name.split(":")[0], str(exc))
        except Exception as exc:  # noqa: BLE001  (the learner's code: say what it raised)
            checks += crashed([name], name.split(":")[0], exc, "run it on the case above by "
                              "hand and compare with the docstring")
    return checks


def _first_wrong(function, reference):
    """The first (tp, n_head, n_kv, rank, yours, minitp's) where `function` differs, or None."""
    for tp, n_head, n_kv in HEADS:
        for rank in range(tp):
            got = list(function(rank, tp, n_head, n_kv))
            want = reference(rank, tp, n_head, n_kv)
            if got != want:
                return tp, n_head, n_kv, rank, got, want
    return None


def _kv_heads(module, name) -> Check:
    wrong = _first_wrong(module.kv_heads_of, _kv_reference)
    if wrong is None:
        return Check(name, True, f"{len(HEADS)} head layouts, every rank")
    tp, n_head, n_kv, rank, got, want = wrong
    hint = ("which query heads does this rank hold, and which K/V head does each of them "
            "read (the n_head query heads share the n_kv K/V heads in equal groups)?")
    if not got and tp > n_kv:
        hint = (f"tp={tp} is above n_kv={n_kv}: the K/V heads cannot be split over the ranks, "
                "so each rank holds a copy of the one its query heads read")
    return Check(name, False, f"tp={tp}, n_head={n_head}, n_kv={n_kv}, rank {rank}: you said "
                 f"{got}, minitp's model holds {want}", rank=rank, hint=hint)


def _sharing(module, name) -> Check:
    wrong = _first_wrong(module.sharing_ranks, _sharing_reference)
    if wrong is None:
        return Check(name, True, f"{len(HEADS)} head layouts, every rank")
    tp, n_head, n_kv, rank, got, want = wrong
    if got == list(range(tp)):
        hint = ("every tp rank is too many: ranks that hold other K/V heads have no term of "
                "this one's gradient to add")
    elif got == [rank]:
        hint = (f"tp={tp} is above n_kv={n_kv}: {len(want)} ranks hold copies of this K/V "
                "head, each with its query heads' part of the gradient; left unsummed, the "
                "copies drift apart")
    else:
        hint = ("whose query heads add terms to the gradient of the K/V heads this rank "
                "holds?")
    return Check(name, False, f"tp={tp}, n_head={n_head}, n_kv={n_kv}, rank {rank}: you said "
                 f"{got}, the gradient is summed over {want}", rank=rank, hint=hint)


def _positions(module, name) -> Check:
    wrong = []  # (length, rank, cp, yours, the split's)
    for length, rank, cp in POSITIONS:
        got = list(module.rope_positions(length, rank, cp))
        want = _positions_reference(length, rank, cp)
        if got != want:
            wrong.append((length, rank, cp, got, want))
    if not wrong:
        return Check(name, True, f"{len(POSITIONS)} (length, rank, cp) cases")
    # on cp rank 0 the two usual slips give the same list: judge by every case
    if all(got == list(range(length)) for length, _, _, got, _ in wrong):
        hint = ("these are local positions: every rank would turn its tokens as if they "
                "began the sequence. Which two chunks does this rank hold?")
    elif all(got == list(range(rank * length, (rank + 1) * length))
             for length, rank, _, got, _ in wrong):
        hint = ("that is the contiguous split; minitp balances the causal work: rank i "
                "holds chunks i and 2·cp - 1 - i")
    else:
        hint = ("how long is a chunk, and which two of the 2·cp chunks give every rank the "
                "same causal work?")
    length, rank, cp, got, want = wrong[-1]  # the last: a rank above 0
    return Check(name, False, f"length {length} on cp rank {rank} of {cp}: you said {got}, "
                 f"the split gives {want}", rank=rank, hint=hint)
