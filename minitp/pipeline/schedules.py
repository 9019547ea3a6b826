"""Pipeline schedules: in which order each rank runs its forwards and backwards.

With p stages and m microbatches, each of forward time t_f and backward t_b
per stage, a schedule that keeps every stage busy once the pipeline is full
still waits (p−1)(t_f + t_b) to fill and drain it: the bubble, as a fraction of
the useful time m(t_f + t_b), is (p−1)/m for GPipe and for 1F1B (Huang et al.
2019; Narayanan et al. 2021). 1F1B does not shrink the bubble; it bounds the
activations in flight to p microbatches instead of m. Interleaving gives each
rank v chunks of layers (chunk k of rank r is model chunk k·p + r); each
forward/backward is then 1/v as long and the bubble (p−1)/(v·m).

Zero-bubble schedules (Qi et al. 2024) split each backward in two: B, the input
gradient the previous stage waits for, and W, the weight gradients, which can wait
(`minitp.weight_grad`). With unit costs F = B = W, 1F1B idles (p−1)(F+B+W) per rank;
ZB-H1 keeps 1F1B's order and peak memory (p microbatches in flight on every stage) but
delays stage r's W passes by r microbatches, so the backwards reach the first stage
sooner and the late W's fill the drain: (p−1)(F+B−W). ZB-H2 lets every stage hold up to
2p−1 microbatches: extra forwards fill the warm-up and no stage idles between its first
and last unit (its stages still start and end p−1 units apart, the pipeline's shape; the
paper's optimizer post-validation removes the step's synchronization that would wait).

A schedule is a plain function ``(p, r, m, v) -> [(kind, chunk, microbatch)]``:
the order in which rank r runs its forwards "F", backwards "B" and, for a backward split
in two, weight passes "W" (a "B" whose (chunk, microbatch) has a "W" computes only the
input gradient; `minitp.schedule_rules`). Pure arithmetic:
`minitp.pipeline.run_schedule` executes such a list, and `train_step(schedule=...)`
accepts any function of this shape.
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


def zb_h1(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """ZB-H1: 1F1B's forwards and backwards, each backward split into B and W, and
    stage r's W passes delayed by r microbatches (the rest at the end)."""
    order, next_w = [], 0
    for kind, k, i in one_f_one_b(p, r, m):
        order.append((kind, k, i))
        if kind == "B" and i >= r:
            order.append(("W", 0, next_w))
            next_w += 1
    return order + [("W", 0, i) for i in range(next_w, m)]


def zb_h2(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """ZB-H2: every stage, at each unit of time, runs a B if one is ready, else a
    forward while it holds fewer than 2p−1 microbatches (forwarded, W not yet done),
    else a pending W — the greedy order this rule gives with unit costs F = B = W,
    played out for all p stages at once (the paper's Figure 3, bottom)."""
    return _greedy_orders(p, m, 2 * p - 1)[r]


def _greedy_orders(p: int, m: int, limit: int) -> list[list[tuple[str, int, int]]]:
    orders = [[] for _ in range(p)]
    f_done = [[None] * m for _ in range(p)]
    b_done = [[None] * m for _ in range(p)]
    next_f, next_b, next_w, free_at = [0] * p, [0] * p, [0] * p, [0] * p
    t = 0
    while any(next_w[r] < m for r in range(p)):
        for r in range(p):
            if free_at[r] > t:
                continue
            i, j = next_b[r], next_f[r]
            b_ready = i < j and f_done[r][i] <= t and (
                r == p - 1 or (b_done[r + 1][i] is not None and b_done[r + 1][i] <= t))
            f_ready = j < m and j - next_w[r] < limit and (
                r == 0 or (f_done[r - 1][j] is not None and f_done[r - 1][j] <= t))
            if b_ready:
                orders[r].append(("B", 0, i))
                b_done[r][i], next_b[r] = t + 1, i + 1
            elif f_ready:
                orders[r].append(("F", 0, j))
                f_done[r][j], next_f[r] = t + 1, j + 1
            elif next_w[r] < next_b[r]:
                orders[r].append(("W", 0, next_w[r]))
                next_w[r] += 1
            else:
                continue
            free_at[r] = t + 1
        t += 1
    return orders


SCHEDULES = dict(zip(SCHEDULE_NAMES, (gpipe, one_f_one_b, interleaved, zb_h1, zb_h2),
                     strict=True))


def simulate(schedule, p: int, m: int, v: int = 1, costs=None) -> dict:
    """Run the schedule on paper: each unit takes its cost in ticks, a unit starts when
    its rank is free and its inputs have arrived (a B needs the next stage's B, not its
    W); a "B" with no "W" of its own is the whole backward and costs B + W. Default costs:
    one tick per forward and per whole backward (W costs 0); the zero-bubble paper's unit
    costs are ``costs=dict(F=1, B=1, W=1)``. `schedule`: a name or a schedule function.
    Returns {"ticks", "busy", "bubble", "idle", "inner_idle", "peak"}: per rank, idle =
    ticks − busy, inner_idle the idle between its first and last unit, peak the most
    microbatches it holds at once (forwarded, weight gradients not yet done); bubble =
    the largest idle / busy."""
    costs = {"F": 1, "B": 1, "W": 0, **(costs or {})}
    make = SCHEDULES[schedule] if isinstance(schedule, str) else schedule
    orders = [make(p, r, m, v) for r in range(p)]
    split = [{(k, i) for kind, k, i in order if kind == "W"} for order in orders]
    done, clock, pos, first = {}, [0] * p, [0] * p, [None] * p
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
            if kind == "W":
                need = [("B", g, i)]
            if all(d in done for d in need):
                cost = costs[kind] + (costs["W"] if kind == "B" and (k, i) not in split[r] else 0)
                start = max([clock[r]] + [done[d] for d in need])
                first[r] = start if first[r] is None else first[r]
                clock[r] = done[(kind, g, i)] = start + cost
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks for p={p}, m={m}, v={v}")
    busy = m * v * (costs["F"] + costs["B"] + costs["W"])
    ticks = max(clock)
    idle = [ticks - busy for _ in range(p)]
    return {"ticks": ticks, "busy": busy, "bubble": max(idle) / busy, "idle": idle,
            "inner_idle": [clock[r] - first[r] - busy for r in range(p)],
            "peak": [_peak(order) for order in orders]}


def _peak(order) -> int:
    """The most microbatches a rank holds at once: forwarded, weight gradients not done
    (a "B" without its own "W" finishes them)."""
    split = {(k, i) for kind, k, i in order if kind == "W"}
    live = best = 0
    for kind, k, i in order:
        done = kind == "W" or (kind == "B" and (k, i) not in split)
        live += 1 if kind == "F" else -1 if done else 0
        best = max(best, live)
    return best
