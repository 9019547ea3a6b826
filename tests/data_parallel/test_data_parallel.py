"""Data parallelism: the gradient sum is bucketed, starts inside backward, waits for
the last microbatch, and ZeRO-1 keeps 1/dp of the optimizer state per rank.
(That the results equal one device's is tests/test_3d.py's job.)"""

import pytest
import torch

import minitp as mt

CFG = dict(vocab_size=10, seq_len=12, n_layer=4, n_head=12, d_model=24)
BUCKET_BYTES = 16_000  # a few buckets for this model (~31k float64 parameters)


def _traced_step(dp, microbatches, zero):
    mesh = mt.Mesh(dp=dp)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg).double(), mesh, bucket_bytes=BUCKET_BYTES,
                           zero_stage=1 if zero else 0)
    opt = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2 * dp * microbatches, cfg.seq_len))
    mt.trace.clear()
    mt.train_step(model, (x, x), mesh, opt, microbatches=microbatches)
    buckets = [len(b) for b in model.grad_sync.buckets] if model.grad_sync else []
    state = opt.state_numel() if zero else sum(
        t.numel() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    params = sum(p.numel() for p in model.parameters())
    return mt.trace.events(), buckets, state, params


def test_gradient_sum_is_bucketed_and_overlaps_backward():
    m = 3
    run = mt.launch(_traced_step, 2, 2, m, False, timeout=60)
    for events, buckets, _, params in run:
        dp = [e for e in events if e.axis == "dp" and e.label != "batch loss"]
        # dp only: pp has one rank here, and an axis of one rank moves nothing, so it is not traced
        assert [e.axis for e in events if e.label == "batch loss"] == ["dp"]
        assert len(buckets) > 2
        assert [e.op for e in dp] == ["all_reduce"] * len(buckets)  # one per bucket
        assert sum(e.nbytes for e in dp) == params * 8  # every gradient once, float64
        assert all(e.label.startswith("dp grads bucket") and e.phase == "bwd" for e in dp)
        backward = {e.label: e for e in events if e.op == "compute" and e.phase == "bwd"}
        assert sorted(backward) == [f"B{i}" for i in range(m)]
        last = backward[f"B{m - 1}"]
        # skipped while microbatches accumulate: nothing before the last backward ...
        assert all(e.start >= last.start for e in dp)
        # ... and started from hooks inside it, before it ends: overlap
        assert sum(e.start < last.end for e in dp) >= len(buckets) - 1


def test_zero1_shards_optimizer_state():
    dp = 4
    plain = mt.launch(_traced_step, dp, dp, 1, False, timeout=60)
    zero = mt.launch(_traced_step, dp, dp, 1, True, timeout=60)
    for (_, _, plain_state, params), (events, _, zero_state, _) in zip(plain, zero, strict=True):
        assert plain_state == pytest.approx(2 * params, rel=0.01)  # AdamW: two moments (+ steps)
        assert zero_state == pytest.approx(plain_state / dp, rel=0.01)
        ops = [e.op for e in events if e.axis == "dp" and e.label != "batch loss"]
        assert ops == ["reduce_scatter", "all_gather"]  # no all-reduce left
