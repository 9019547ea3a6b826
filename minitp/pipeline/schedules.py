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
(`minitp.tensor_parallel.weight_grad`). With unit costs F = B = W, 1F1B idles (p−1)(F+B+W) per rank;
ZB-H1 keeps 1F1B's order and peak memory (p microbatches in flight on every stage) but
delays stage r's W passes by r microbatches, so the backwards reach the first stage
sooner and the late W's fill the drain: (p−1)(F+B−W). ZB-H2 lets every stage hold up to
2p−1 microbatches: extra forwards fill the warm-up and no stage idles between its first
and last unit (its stages still start and end p−1 units apart, the pipeline's shape; the
paper's optimizer post-validation removes the step's synchronization that would wait).

Two chunks per rank placed in a V (rank r runs stages r and 2p−1−r; placement "v",
`minitp.rules.schedules`) let the first and the last stage share a rank, so a backward
starts where the forward ended. ZBV (Qi et al. 2024, §6) orders them so that with
F = B = W no rank idles between its first and last unit while holding no more than
1F1B's activations; DualPipeV (DeepSeek-V3's DualPipe cut in half; deepseek-ai/DualPipe,
dualpipe/dualpipev.py) pairs one chunk's forward with the other's backward so that a
runtime can overlap their compute and communication — minitp runs each pair one unit
after the other, so its timeline shows the order, not the overlap.

A schedule is a plain function ``(p, r, m, v) -> [(kind, chunk, microbatch)]``:
the order in which rank r runs its forwards "F", backwards "B" and, for a backward split
in two, weight passes "W" (a "B" whose (chunk, microbatch) has a "W" computes only the
input gradient; `minitp.rules.schedules`). Pure arithmetic:
`minitp.pipeline.run_schedule` executes such a list, and `train_step(schedule=...)`
accepts any function of this shape.
"""

from __future__ import annotations

from ..rules import (
    SCHEDULE_NAMES,
    check_microbatches,
    interleaving_fits,
)


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


def zbv(p: int, r: int, m: int, v: int = 2) -> list[tuple[str, int, int]]:
    """ZB-V (Qi et al. 2024, §6), chunk 0 = stage r, chunk 1 = stage 2p−1−r. Warm-up:
    2(p−r)−1 forwards down the V; r pairs (F up, F down); then p−r times a forward up
    followed at once by its B and W (the V's bottom turns the microbatch around). Steady:
    (F0, B0, W0, F1, B1, W1) while forwards remain. Cool-down: r pairs (B0, B1), then p−r
    pairs (B0, W0), then the W's left. Needs m ≥ 2p−1 (the warm-up's first forwards)."""
    check_microbatches("zbv", p, m)
    order, nxt = [], {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0, ("W", 0): 0, ("W", 1): 0}

    def unit(kind, k):
        order.append((kind, k, nxt[kind, k]))
        nxt[kind, k] += 1

    for _ in range(2 * (p - r) - 1):
        unit("F", 0)
    for _ in range(r):
        unit("F", 1)
        unit("F", 0)
    for _ in range(p - r):
        unit("F", 1), unit("B", 1), unit("W", 1)
    while nxt["F", 1] < m:
        if nxt["F", 0] < m:
            unit("F", 0)
        unit("B", 0), unit("W", 0), unit("F", 1), unit("B", 1), unit("W", 1)
    for _ in range(r):
        unit("B", 0), unit("B", 1)
    for _ in range(p - r):
        unit("B", 0), unit("W", 0)
    for k in (1, 0):
        while nxt["W", k] < m:
            unit("W", k)
    return order


def dualpipev(p: int, r: int, m: int, v: int = 2) -> list[tuple[str, int, int]]:
    """DualPipeV's order on rank r (deepseek-ai/DualPipe, dualpipe/dualpipev.py, `step`,
    its eight phases), chunk 0 going down the V and chunk 1 back up. A backward is
    split (B now, its W queued) in the phases that use zero bubble, whole elsewhere;
    queued W's run first in, first out. Its "F&B" pairs (F0 with B1, F1 with B0) are
    overlapped by DualPipe's runtime; here they run one after the other. Needs m ≥ 2p."""
    check_microbatches("dualpipev", p, m)
    order, nxt, queued = [], {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}, []

    def forward(k):
        order.append(("F", k, nxt["F", k]))
        nxt["F", k] += 1

    def backward(k, split):
        i = nxt["B", k]
        nxt["B", k] += 1
        order.append(("B", k, i))
        if split:
            queued.append((k, i))

    def weights():
        order.append(("W", *queued.pop(0)))

    for _ in range(2 * (p - r - 1)):          # 1: forwards down the V
        forward(0)
    for _ in range(r + 1):                    # 2: down and up
        forward(0), forward(1)
    for _ in range(p - r - 1):                # 3: B1 W1 F1, zero bubble
        backward(1, True), weights(), forward(1)
    for _ in range(m - 2 * p + r + 1):        # 4: the main phase, two F&B pairs
        forward(0), backward(1, False), forward(1), backward(0, False)
    for _ in range(p - r - 1):                # 5: B1, then the pair F1&B0
        backward(1, False), forward(1), backward(0, False)
    split = False
    for i in range(r + 1):                    # 6: B1 B0, the second half split
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        backward(1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        backward(0, split)
    for _ in range(p - r - 1):                # 7: W B0
        weights(), backward(0, True)
    while queued:                             # 8: the W's left
        weights()
    return order


SCHEDULES = dict(zip(SCHEDULE_NAMES, (gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zbv,
                                      dualpipev), strict=True))
