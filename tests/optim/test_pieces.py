"""Where ZeRO's flat shards cut the matrices: over the dp ranks each matrix's elements are
held once, in rank order, and a rank's shard is exactly its pieces and its rest."""

import types

import torch

import minitp as mt
from minitp.optim.pieces import flat_pieces, module_paths


def _layout(model):
    out, offset = [], 0
    for module in model.modules():
        for attr, p in module._parameters.items():
            out.append((module, attr, p, offset, tuple(p.shape)))
            offset += p.numel()
    return out, offset


def test_each_matrix_is_held_once_and_each_shard_is_pieces_and_rest():
    model = mt.GPT(mt.GPTConfig(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8))
    layout, numel = _layout(model)
    ranks, tp = 3, types.SimpleNamespace(size=1)
    size = -(-numel // ranks)
    per_rank = []
    for rank in range(ranks):
        axis = types.SimpleNamespace(size=ranks, rank=rank)
        per_rank.append(flat_pieces(torch.zeros(size), axis, layout, tp, module_paths(model), {}))
    for piece in per_rank[0][0]:
        starts = [b for _, b in piece.ranges[:-1]]
        assert piece.ranges[0][0] == 0 and piece.ranges[-1][1] == piece.numel
        assert [a for a, _ in piece.ranges[1:]] == starts  # contiguous, in rank order
    for pieces, rest in per_rank:
        runs = sorted([(p.lo, p.hi) for p in pieces if p.hi > p.lo] + rest)
        assert runs[0][0] == 0 and runs[-1][1] == size
        assert all(a[1] == b[0] for a, b in zip(runs, runs[1:], strict=False))
    assert len(per_rank[0][0]) == 8  # qkv, proj, fc, proj per layer
