"""Overlapped tensor-parallel communication (`minitp.tensor_parallel.overlap`) computes what the
plain sequence-parallel model computes, and its trace shows the ring.

Equivalence, float64: two AdamW steps of the GPT with ``tp_overlap=True``, with
``tp_overlap=False`` and on one device; every step's loss, then every gradient
of a third batch and every parameter, gathered back from the shards, agree to
1e-10 (tp 2 with full recomputation, tp 4 without). The sums run in another
order, so not bit for bit.

Trace (tp 3, so that "next" and "previous" on the ring are different ranks):
per layer and pass, the 4 GEMMs are cut into t chunks each (4t compute regions)
and their collectives are replaced by 4(t-1) sends to the next rank and as many
receives from the previous one, each of one (B, T/t, C) chunk — together the
ring model's bytes of the 4 collectives they replace. Every message is posted
before a chunk's GEMM and waited on after it: that is the overlap.
"""

import pytest
import torch
from test_tensor_parallel import (  # 12 heads: tp 2, 3, 4
    CFG,
    TOLERANCE,
    _batches,
    one_step_events,
)

import minitp as mt

BATCH = 4  # what _batches draws


def _train_three_ways(tp, recompute):
    """Worst differences of overlapped vs non-overlapped and overlapped vs one device."""
    mesh = mt.Mesh(tp=tp)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = mt.GPT(cfg).double()
    plain = mt.parallelize(ref, mesh, sequence_parallel=True, recompute=recompute)
    over = mt.parallelize(ref, mesh, sequence_parallel=True, recompute=recompute, tp_overlap=True)
    kinds = {type(m).__name__ for m in over.modules()}
    assert {"OverlappedColumnParallelLinear", "OverlappedRowParallelLinear"} <= kinds
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, plain, over)]
    *steps, last = _batches(3, cfg)
    worst = {"loss vs plain": 0.0, "loss vs one device": 0.0}
    for x, y in steps:
        opts[0].zero_grad()
        ref_loss = ref(x, y)[1]
        ref_loss.backward()
        opts[0].step()
        losses = [mt.train_step(m, (x, y), mesh, o) for m, o in ((plain, opts[1]), (over, opts[2]))]
        worst["loss vs plain"] = max(worst["loss vs plain"], abs(losses[1] - losses[0]))
        worst["loss vs one device"] = max(worst["loss vs one device"],
                                          abs(losses[1] - ref_loss.item()))
    # one more batch, gradients only: every gradient, gathered back to the dense names
    for m in (ref, plain, over):
        m.zero_grad()
    ref_loss = ref(*last)[1]
    ref_loss.backward()
    grads = {}
    for name, m in (("plain", plain), ("over", over)):
        loss = m(*last)[1]
        loss.backward()
        m.sync_partial_grads()
        grads[name] = m.full_grad_dict()
        if name == "over":
            worst["loss vs one device"] = max(worst["loss vs one device"],
                                              abs(loss.item() - ref_loss.item()))
    params = over.full_state_dict()
    for n, p in ref.named_parameters():
        for key, other in (("grad vs plain", grads["plain"][n]), ("grad vs one device", p.grad),
                           ("param vs one device", p.detach())):
            mine = params[n] if key.startswith("param") else grads["over"][n]
            worst[key] = max(worst.get(key, 0.0), (mine - other).abs().max().item())
    return worst


@pytest.mark.parametrize("tp, recompute", [(2, "full"), (4, None)])
def test_overlapped_equals_plain_and_one_device_float64(tp, recompute):
    # full recomputation runs the ring again inside backward
    run = mt.launch(_train_three_ways, tp, tp, recompute, timeout=120)
    for rank, worst in enumerate(run):
        for what, error in worst.items():
            assert error < TOLERANCE, f"rank {rank}, tp={tp}: {what} differs by {error:.3g}"


# --------------------------------------------------------------------------- the trace
def _one_step_events(tp, tp_overlap):
    return one_step_events(tp, sequence_parallel=True, tp_overlap=tp_overlap)


def _in_layer(events, layer, phase):
    return [e for e in events if e.phase == phase
            and (e.label == layer or e.label.startswith(layer + "."))]


def test_trace_shows_the_chunked_ring():
    tp = 3
    overlapped = mt.launch(_one_step_events, tp, tp, True, timeout=60)
    plain = mt.launch(_one_step_events, tp, tp, False, timeout=60)[0]
    chunk_bytes = BATCH * CFG["seq_len"] // tp * CFG["d_model"] * 8  # one (B, T/t, C) float64
    for rank, events in enumerate(overlapped):
        for layer in ("layer0", "layer1"):
            for phase in ("fwd", "bwd"):
                mine = _in_layer(events, layer, phase)
                sends = [e for e in mine if e.op == "send"]
                recvs = [e for e in mine if e.op == "recv"]
                gemms = [e for e in mine if e.op == "compute"]
                where = f"rank {rank} {layer} {phase}"
                # the SP collectives are gone from the layer: only the ring's messages
                assert {e.op for e in mine} == {"send", "recv", "compute"}, where
                assert len(sends) == len(recvs) == 4 * (tp - 1), where
                assert {e.axis for e in sends + recvs} == {"tp"}, where  # counted as tp's bytes
                assert len(gemms) == 4 * tp, where
                # every GEMM is cut into chunks 0..t-1 (4 GEMMs: each chunk 4 times)
                chunks = sorted(int(e.label.rsplit("gemm", 1)[1]) for e in gemms)
                assert chunks == sorted(list(range(tp)) * 4), where
                assert {e.peer for e in sends} == {(rank + 1) % tp}, where
                assert {e.peer for e in recvs} == {(rank - 1) % tp}, where
                assert all(e.nbytes == chunk_bytes for e in sends + recvs), where
                # the overlap: each message was in flight during a chunk's GEMM
                for m in sends + recvs:
                    assert any(m.start <= g.start and g.end <= m.end for g in gemms), (
                        f"{where}: {m.op} at {m.start:.6f} overlaps no GEMM")
                # the same bytes as the collectives they replace (ring model)
                replaced = sum(e.model_bytes for e in _in_layer(plain, layer, phase)
                               if rank == 0 and e.is_comm)
                if rank == 0:
                    assert sum(e.nbytes for e in sends) == replaced, where


def test_refuses_without_sequence_parallelism():
    # a rank's ValueError reaches the test as a LaunchError carrying its traceback
    with pytest.raises(mt.LaunchError, match="ValueError: tp_overlap=True needs "
                       "sequence_parallel=True and tp > 1 \\(got sequence_parallel=False, tp=2"):
        mt.launch(_parallelize, 2, 2, False, timeout=60)
    with pytest.raises(mt.LaunchError, match="ValueError: tp_overlap=True needs .* tp=1\\)"):
        mt.launch(_parallelize, 1, 1, True, timeout=60)
    with pytest.raises(mt.LaunchError, match="ValueError: the overlapped layers .* need"):
        mt.launch(_overlapped_row_without_sp, 2, timeout=60)


def _parallelize(tp, sequence_parallel):
    mesh = mt.Mesh(tp=tp)
    return mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)), mesh, sequence_parallel=sequence_parallel,
                          tp_overlap=True)


def _overlapped_row_without_sp():
    from minitp.tensor_parallel.overlap import OverlappedRowParallelLinear
    return OverlappedRowParallelLinear(8, 4, mt.Mesh(tp=2).tp, sequence_parallel=False,
                                       device=mt.device())


# --------------------------------------------------------------------------- the model
def test_model_of_the_saving_by_hand():
    from minitp.calc import A100_80GB
    from minitp.calc.network.tp_overlap import tp_overlap_model
    # GPT-3's layer on A100s (h 12288, s 2048, t 8, b 1, bf16): one hop moves 2048/8·12288·2
    # bytes over 300 GB/s after 5 µs; 8 collectives of 7 hops, none hidden without overlap
    m = tp_overlap_model(12288, 2048, 8, A100_80GB)
    hop = 5e-6 + 2048 // 8 * 12288 * 2 / 300e9
    assert m.hop == pytest.approx(hop, rel=1e-12)
    assert m.comm_exposed_plain == pytest.approx(8 * 7 * hop, rel=1e-12)
    # at peak the smallest chunk GEMM (2·256·h·h/8 FLOPs: 31 µs) outlasts a hop: all hidden
    assert m.smallest_chunk_gemm == pytest.approx(2 * 256 * 12288**2 / 8 / 312e12, rel=1e-12)
    assert m.comm_exposed_overlap == 0
    compute = 3 * (24 * 2048 * 12288**2 + 4 * 2048**2 * 12288) / 8 / 312e12
    assert m.saving == pytest.approx(8 * 7 * hop / (compute + 8 * 7 * hop), rel=1e-12)
    # one hop per collective left exposed
    late = tp_overlap_model(12288, 2048, 8, A100_80GB, first_hop_exposed=True)
    assert late.comm_exposed_overlap == pytest.approx(8 * hop, rel=1e-12)
    # a layer too small to hide its hops: each hop exposes c − g
    small = tp_overlap_model(256, 64, 4, A100_80GB)
    per = 0.0
    for d_in, d_out in ((1, 3), (1, 1), (1, 4), (4, 1)):
        g = 2 * 16 * (d_in * 256) * (d_out * 256) / 4 / 312e12
        per += 2 * 3 * max(0.0, small.hop - g)
    assert small.comm_exposed_overlap == pytest.approx(per, rel=1e-12) and per > 0
    with pytest.raises(ValueError, match="t >= 2"):
        tp_overlap_model(256, 64, 1, A100_80GB)


def test_model_against_megatrons_plain_baseline():
    # Megatron-LM's plain TP + SP already hides 2 of the 8 collectives (the backward
    # reduce-scatters of QKV and FC, beside their weight-gradient GEMMs): the baseline
    # exposes 6·(t−1) hops, the overlapped side is unchanged, and the saving is smaller.
    from minitp.calc import A100_80GB
    from minitp.calc.network.tp_overlap import MEGATRON_PLAIN_OVERLAPPED, tp_overlap_model
    assert MEGATRON_PLAIN_OVERLAPPED == 2
    for efficiency, saving in ((1.0, 0.106), (0.5, 0.056)):  # the 10.6% and 5.6%
        none = tp_overlap_model(12288, 2048, 8, A100_80GB, gemm_efficiency=efficiency)
        mega = tp_overlap_model(12288, 2048, 8, A100_80GB, gemm_efficiency=efficiency,
                                plain_overlapped=MEGATRON_PLAIN_OVERLAPPED)
        assert mega.comm_exposed_plain == pytest.approx(6 * 7 * none.hop, rel=1e-12)
        assert mega.comm_exposed_overlap == none.comm_exposed_overlap
        assert mega.compute == none.compute and mega.saving < none.saving
        assert mega.saving == pytest.approx(saving, abs=5e-4)
    everything = tp_overlap_model(12288, 2048, 8, A100_80GB, plain_overlapped=8)
    assert everything.comm_exposed_plain == 0 and everything.saving == 0
    for bad in (-1, 9):
        with pytest.raises(ValueError, match="plain_overlapped"):
            tp_overlap_model(12288, 2048, 8, A100_80GB, plain_overlapped=bad)
