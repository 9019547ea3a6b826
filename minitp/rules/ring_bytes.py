"""The ring algorithm's bytes: a MODEL (what a ring would send), never a measurement.
Traces carry it beside the bytes the kernel counted (`minitp.runtime.io_counters`)."""

from __future__ import annotations

import math
from fractions import Fraction


def ring_send_fraction(op: str, n: int) -> Fraction:
    """MODEL: the fraction of the full tensor S one rank sends for `op` on a ring of
    `n` ranks: all_reduce 2(n−1)/n, all_gather and reduce_scatter (n−1)/n (the
    calculator uses it exactly; `ring_wire_bytes` rounds to whole bytes)."""
    if n < 1:
        raise ValueError(f"a ring has at least one rank, got n={n}")
    if op == "all_reduce":
        return Fraction(2 * (n - 1), n)
    if op in ("all_gather", "reduce_scatter"):
        return Fraction(n - 1, n)
    raise ValueError(f"no ring model for collective {op!r}")


def ring_wire_bytes(op: str, nbytes: int, n: int) -> int:
    """MODEL, not measurement: the bytes each rank sends for `op` on a ring of `n`
    ranks moving a tensor of `nbytes` in all (S).

    all_reduce is a reduce-scatter followed by an all-gather: each of the two
    passes sends n−1 chunks of S/n, hence 2(n−1)/n·S; all_gather and
    reduce_scatter send (n−1)/n·S. A point-to-point send moves the whole message
    once; a receive sends nothing. A broadcast is pipelined along a chain, so
    every rank but the last forwards S once: we count S, the root's share.
    Integer division: a ring's chunks are whole bytes.
    """
    if op == "send":
        return nbytes
    if op == "recv" or n <= 1:
        return 0
    if op == "broadcast":
        return nbytes
    return math.floor(nbytes * ring_send_fraction(op, n))
