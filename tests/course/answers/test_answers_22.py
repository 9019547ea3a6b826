"""Lesson 22: PyTorch's parallelism. Every question checked from first principles: the
placements from the pieces each rank holds (plain tensors sliced as the column- and
row-parallel layers slice them, and classified by their shapes and sums), FSDP's and
HSDP's bytes across node boundaries by walking their rings message by message, and the
model states from 16 bytes a parameter."""

import torch
from answers_common import GiB, asked, close

NOT_CHECKED = set()
TOKENS, D, F, TP = 6, 4, 8, 2


def _classify(pieces, whole):
    """The placement that the ranks' `pieces` of `whole` are: a block along a dim, the
    whole tensor, or full-shaped terms that sum to it."""
    for dim in range(whole.dim()):
        if torch.equal(torch.cat(pieces, dim), whole) and pieces[0].shape[dim] < whole.shape[dim]:
            return f"Shard({dim})"
    if all(torch.equal(p, whole) for p in pieces):
        return "Replicate()"
    assert torch.allclose(sum(pieces), whole)
    return "Partial()"


def _placements(sp):
    g = torch.Generator().manual_seed(0)
    x, w1, b1, w2, b2 = (torch.randn(*s, generator=g, dtype=torch.float64)
                         for s in ((TOKENS, D), (F, D), (F,), (D, F), (D,)))
    h = torch.nn.functional.gelu(x @ w1.T + b1)
    y = h @ w2.T + b2
    cols = [slice(r * F // TP, (r + 1) * F // TP) for r in range(TP)]
    rows = [slice(r * TOKENS // TP, (r + 1) * TOKENS // TP) for r in range(TP)]
    held = {  # what rank r holds, for each r
        "fc1.weight": [w1[c] for c in cols], "fc1.bias": [b1[c] for c in cols],
        "fc2.weight": [w2[:, c] for c in cols], "fc2.bias": [b2] * TP,
        "h, fc1's output": [h[:, c] for c in cols],
        "h @ fc2.weight.T, before any communication": [h[:, c] @ w2[:, c].T for c in cols],
        "x, the MLP's input as a rank holds it": [x[r] for r in rows] if sp else [x] * TP,
        "y, the MLP's output after fc2's communication": [y[r] for r in rows] if sp else [y] * TP,
    }
    whole = {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2,
             "h, fc1's output": h, "h @ fc2.weight.T, before any communication": y - b2,
             "x, the MLP's input as a rank holds it": x,
             "y, the MLP's output after fc2's communication": y}
    return {k: _classify(v, whole[k]) for k, v in held.items()}


def test_22_placement():
    found = {sp: _placements(sp) for sp in (False, True)}
    options = ("Shard(0)", "Shard(1)", "Replicate()", "Partial()")
    for _, p, right in asked("22.placement"):
        assert right == "abcd"[options.index(found[p["sp"]][p["tensor"]])], p


def _ring_crossing(ring, node_of, chunks, chunk):
    """Bytes a ring puts across node boundaries: every rank sends `chunks` chunks to the next."""
    return sum(chunks * chunk for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
               if node_of(a) != node_of(b))


def test_22_crossing():
    for _, p, right in asked("22.crossing"):
        g, k, m, s = p["g"], p["nodes"], p["m"], 10**6
        n = g * k
        node = (lambda per_node: lambda rank: rank // per_node)(g)
        ring = list(range(n))  # FSDP: two gathers and a reduce-scatter a microbatch, n-1 chunks
        fsdp = 3 * m * _ring_crossing(ring, node, n - 1, s / n)
        hsdp = sum(_ring_crossing(list(range(j, n, g)), node, 2 * (k - 1), s / g / k)
                   for j in range(g))  # once a step: each position's all-reduce of S/g
        assert close(right, fsdp / hsdp), p


def test_22_hsdp_memory():
    for _, p, right in asked("22.hsdp-memory"):
        assert close(right, (2 + 2 + 12) * p["billions"] * 10**9 / p["g"] / GiB)
