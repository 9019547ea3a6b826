"""Pipeline schedules: in which order each rank runs its forwards and backwards.

With p stages and m microbatches, each of forward time t_f and backward t_b
per stage, a schedule that keeps every stage busy once the pipeline is full
still waits (p−1)(t_f + t_b) to fill and drain it: the bubble, as a fraction of
the useful time m(t_f + t_b), is (p−1)/m for GPipe and for 1F1B (Huang et al.
2019; Narayanan et al. 2021). 1F1B does not shrink the bubble; it bounds the
activations in flight to p microbatches instead of m. Interleaving gives each
rank v chunks of layers (chunk k of rank r is model chunk k·p + r); each
forward/backward is then 1/v as long and the bubble (p−1)/(v·m).

A schedule is a plain function ``(p, r, m, v) -> [(kind, chunk, microbatch)]``:
the order in which rank r runs its forwards "F" and backwards "B". Pure
arithmetic: `minitp.pipeline.run_schedule` executes such a list, and
`train_step(schedule=...)` accepts any function of this shape.
"""

from __future__ import annotations

from ..rules import SCHEDULE_NAMES, interleaving_fits


def gpipe(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """All forwards, then all backwards (GPipe; "AFAB")."""
    return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]


def one_f_one_b(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """Warm-up: p−r−1 forwards fill the pipeline below this stage. Steady: one
    forward, one backward. Cool-down: the backwards left. At most p−r
    microbatches' activations are alive at once (PipeDream-Flush)."""
    warmup = min(p - r - 1, m)
    order = [("F", 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", 0, warmup + i), ("B", 0, i)]
    return order + [("B", 0, i) for i in range(m - warmup, m)]


def interleaved(p: int, r: int, m: int, v: int = 2) -> list[tuple[str, int, int]]:
    """1F1B over v chunks per rank, Megatron-LM's order: microbatches go through
    a chunk in groups of p before the rank moves to its next chunk. Warm-up is
    2(p−r−1) + (v−1)p forwards; then one forward, one backward; then cool-down."""
    if not interleaving_fits(p, m):
        raise ValueError(f"the interleaved schedule needs microbatches ({m}) divisible by pp ({p})")
    total = m * v

    def unit(i, backward):
        k = (i // p) % v
        return (v - 1 - k if backward else k), (i // (p * v)) * p + i % p

    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [("F", *unit(i, False)) for i in range(warmup)]
    for i in range(total - warmup):
        order += [("F", *unit(warmup + i, False)), ("B", *unit(i, True))]
    return order + [("B", *unit(i, True)) for i in range(total - warmup, total)]


SCHEDULES = dict(zip(SCHEDULE_NAMES, (gpipe, one_f_one_b, interleaved), strict=True))


def simulate(schedule: str, p: int, m: int, v: int = 1) -> dict:
    """Run the schedule on paper: every forward and backward takes one tick per
    chunk, a unit starts when its rank is free and its input has arrived.
    Returns {"ticks", "busy", "bubble"}: bubble = idle / busy per rank."""
    orders = [SCHEDULES[schedule](p, r, m, v) for r in range(p)]
    done, clock, pos = {}, [0] * p, [0] * p
    n = p * v
    while any(pos[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if pos[r] == len(orders[r]):
                continue
            kind, k, i = orders[r][pos[r]]
            g = k * p + r
            need = [("F", g - 1, i)] if kind == "F" and g > 0 else []
            if kind == "B":
                need = [("F", g, i)] + ([("B", g + 1, i)] if g < n - 1 else [])
            if all(d in done for d in need):
                start = max([clock[r]] + [done[d] for d in need])
                clock[r] = done[(kind, g, i)] = start + 1
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks for p={p}, m={m}, v={v}")
    busy = 2 * m * v
    ticks = max(clock)
    return {"ticks": ticks, "busy": busy, "bubble": (ticks - busy) / busy}
