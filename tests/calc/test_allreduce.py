"""minitp.calc.network.allreduce: a ring's latency grows with t, a one-shot's does not; the ring is
the price every other collective in `minitp.calc` pays."""

import pytest

import minitp.calc as calc
from minitp.calc.network.allreduce import allreduce_time

H100 = calc.H100_80GB
ALPHA, BETA = H100.intra_latency, H100.intra_bandwidth
S = 64 * 1024  # Llama 3 8B's B·h·w at batch 8, bf16


@pytest.mark.parametrize("n", [2, 3, 4, 6, 8])
def test_one_shot_pays_one_hop_at_every_size_and_a_ring_two_per_rank(n):
    one_shot, ring = (allreduce_time(H100, S, n, a) for a in ("one_shot", "ring"))
    assert one_shot.latency_seconds == ALPHA  # flat in n: one synchronisation
    assert ring.latency_seconds == pytest.approx(2 * (n - 1) * ALPHA)
    # one-shot: every peer's whole buffer read; ring: 2(n−1)/n of it
    assert one_shot.transfer_seconds == pytest.approx((n - 1) * S / BETA)
    assert one_shot.transfer_seconds == pytest.approx(n / 2 * ring.transfer_seconds)


def test_the_ring_is_the_clusters_collective_price():
    for n in (1, 2, 4, 8, 16):
        assert allreduce_time(H100, S, n).seconds == pytest.approx(
            H100.collective_seconds("all_reduce", S, n, n))


def test_bad_input_is_one_clear_line():
    with pytest.raises(ValueError, match="runs inside one node"):
        allreduce_time(H100, S, 16, "one_shot")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        allreduce_time(H100, S, 4, "tree")
