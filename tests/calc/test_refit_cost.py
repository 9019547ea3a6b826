"""`calc.refit_cost` (a MODEL of a refit on a real cluster) against arithmetic written out
here from Llama 3 70B's published shape (Dubey et al. 2024, Table 3) and the DGX H100
preset's figures (50 GB/s of InfiniBand and 450 GB/s of NVLink per GPU each way, 10 µs a
hop across nodes), never by calling the module's own formula."""

import math

import pytest

from minitp import calc

L, H, KV, D, F, V = 80, 8192, 8, 128, 28672, 128256  # Llama 3 70B, Table 3
IB, NVLINK, HOP = 50e9, 450e9, 10e-6
# minitp's count: per layer q, o (h·h each), k, v (K·d·h each), SwiGLU's three h·f, two
# RMSNorm scales; the embedding (tied), the final norm
N = L * (2 * H * H + 2 * KV * D * H + 3 * H * F + 2 * H) + V * H + H
W = 2 * N  # bf16


def test_separate_serving_receives_its_slice_over_infiniband():
    cost = calc.refit_cost(calc.LLAMA3_70B, calc.H100_80GB, dp=2, pp=4, tp=8)
    assert cost.weight_bytes == W
    assert math.isclose(cost.need_bytes, W / 8) and cost.local_bytes == 0
    assert math.isclose(cost.network_bytes, W / 8)
    assert math.isclose(cost.sent_bytes, W / 32)  # 2 serving nodes, 2 holders of each shard
    assert math.isclose(cost.seconds, HOP + W / 8 / IB)
    # the naive broadcast: gathered into one GPU's NIC, then every GPU receives it all
    assert cost.broadcast_bytes == W
    assert math.isclose(cost.broadcast_seconds, 2 * HOP + (W - W / 32) / IB
                        + max(W / (8 * IB), W / NVLINK))
    assert cost.broadcast_seconds > 8 * cost.seconds


def test_collocated_serving_keeps_its_own_stage():
    cost = calc.refit_cost(calc.LLAMA3_70B, calc.H100_80GB, dp=2, pp=4, tp=8,
                           serving="collocated")
    assert math.isclose(cost.local_bytes, W / 32)
    assert math.isclose(cost.network_bytes, W / 8 * 3 / 4)
    assert math.isclose(cost.sent_bytes, 3 * W / 32)  # to the 3 other stages' nodes, shared
    assert math.isclose(cost.seconds, HOP + W / 8 * 3 / 4 / IB)
    more = calc.refit_cost(calc.LLAMA3_70B, calc.H100_80GB, dp=1, pp=4, tp=8, serve_nodes=4)
    assert math.isclose(more.sent_bytes, 4 * W / 32)  # one holder feeds 4 serving nodes


@pytest.mark.parametrize("kwargs, words", [
    (dict(dp=1, pp=4, tp=4), "tp filling a node"),
    (dict(dp=0, pp=4, tp=8), "dp must be a positive int"),
    (dict(dp=1, pp=4, tp=8, serving="elsewhere"), "serving must be one of"),
    (dict(dp=1, pp=4, tp=8, serving="collocated", serve_nodes=2), "leave serve_nodes out"),
    (dict(dp=1, pp=4, tp=8, serve_nodes=0), "serve_nodes must be a positive int"),
])
def test_bad_layouts_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words):
        calc.refit_cost(calc.LLAMA3_70B, calc.H100_80GB, **kwargs)
