"""Lesson 25: PyTorch's parallelism. Every question checked from first principles: the rows
a rank keeps by cutting a tensor of row numbers as tensor parallelism and then FSDP2 cut
it (`torch.chunk`), FSDP's and HSDP's bytes across node boundaries by walking their rings
message by message with the collectives each runs, and the fewest nodes by trying every
group size against 16 bytes a parameter."""

import torch
from answers_common import GiB, asked, close

NOT_CHECKED = set()


def test_22_strided_rows():
    for _, p, right in asked("25.strided-rows"):
        rows = torch.arange(p["rows"])
        tp_block = rows.chunk(p["tp"])[p["j"]]  # parallelize_module's Shard(0)
        kept = tp_block.chunk(p["dp"])[p["i"]]  # FSDP2's dim-0 cut of the local tensor
        assert right == kept[0].item(), p


def _ring_crossing(ring, node_of, chunks, chunk):
    """Bytes a ring puts across node boundaries: every rank sends `chunks` chunks to the next."""
    return sum(chunks * chunk for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
               if node_of(a) != node_of(b))


def test_22_crossing():
    for _, p, right in asked("25.crossing"):
        g, k, m, s = p["g"], p["nodes"], p["m"], 10**6
        n = g * k
        node = (lambda per_node: lambda rank: rank // per_node)(g)
        ring = list(range(n))  # each gather or reduce-scatter: n-1 chunks of S/n per rank
        gathers, scatters = 2 * m, 1  # forward and backward every microbatch; the last syncs
        fsdp = (gathers + scatters) * _ring_crossing(ring, node, n - 1, s / n)
        hsdp = sum(_ring_crossing(list(range(j, n, g)), node, 2 * (k - 1), s / g / k)
                   for j in range(g))  # once a step: each position's all-reduce of S/g
        assert close(right, fsdp / hsdp), p


def test_22_hsdp_memory():
    for _, p, right in asked("25.hsdp-memory"):
        fits = [s for s in range(1, p["nodes"] + 1) if p["nodes"] % s == 0
                and (2 + 2 + 12) * p["billions"] * 10**9 / (s * p["g"]) <= p["budget"] * GiB]
        assert len(set(p["options"])) == 4 and p["options"]["abcd".index(right)] == fits[0], p
