"""Sharded checkpoints: written by every rank (each element once), loaded exactly at
other layouts, each rank reading only the bytes its shards need."""

import json
import os

import torch

import minitp as mt
from minitp import checkpoint, data
from minitp.checkpoint.reshard import dense_optimizer_state
from minitp.checkpoint.sharded import Saver
from minitp.data_parallel.zero import gathered

CFG = dict(vocab_size=10, seq_len=8, n_layer=4, n_head=12, d_model=24)


def _dense(model, optimizer):
    with gathered(model):
        return ({k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()},
                dense_optimizer_state(model, optimizer))


def _mesh(sizes):
    dp, pp, tp = sizes
    return mt.Mesh(dp=dp, pp=pp, tp=tp)


def _train_and_save(sizes, zero_stage, directory):
    """Two steps at `sizes`, then a sharded save at step 2; the dense state saved."""
    mesh = _mesh(sizes)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)).double(), mesh, zero_stage=zero_stage)
    optimizer = mt.make_optimizer(model, mesh, lambda p: torch.optim.Adam(p, lr=1e-2))
    tokens = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(3))
    for step in range(2):
        mt.train_step(model, data.get_batch(tokens, step, 8, 8), mesh, optimizer,
                      microbatches=2)
    saver = Saver(model, optimizer, mesh, directory, dict(zero_stage=zero_stage))
    saver.save(2)
    saver.close()
    return _dense(model, optimizer)


def _load(sizes, zero_stage, directory):
    model, optimizer, meta = checkpoint.load(
        directory, _mesh(sizes), zero_stage=zero_stage,
        optimizer_factory=lambda p: torch.optim.Adam(p, lr=1e-2))
    return _dense(model, optimizer), meta["bytes_read"]


def _same(a, b) -> bool:
    (wa, oa), (wb, ob) = a, b
    return (all(torch.equal(wa[k], wb[k]) for k in wa) and torch.equal(oa["step"], ob["step"])
            and all(torch.equal(oa[k][n], ob[k][n]) for k in ("exp_avg", "exp_avg_sq")
                    for n in oa[k]))


def test_saved_at_tp2_pp2_loads_exactly_elsewhere_reading_only_its_bytes(tmp_path):
    """Saved at (dp 1, pp 2, tp 2): every element written once (the files add up to the
    model and Adam's state); loaded bit for bit at (dp 2, pp 1, tp 1, ZeRO-1), every rank
    reading less than the dense load's every byte (the other layouts: the same code)."""
    d = str(tmp_path)
    saved = mt.launch(_train_and_save, 4, (1, 2, 2), 0, d, backend="gloo", timeout=120)[0]
    step = os.path.join(d, "step-2")
    manifest = json.load(open(os.path.join(step, "manifest.json")))
    n_params = sum(v.numel() for v in saved[0].values())
    total = sum(f["bytes"] for f in manifest["files"].values())
    assert total == 3 * n_params * 8  # parameters, exp_avg, exp_avg_sq; float64; once each
    for sizes, zero_stage in (((2, 1, 1), 1),):
        run = mt.launch(_load, sizes[0] * sizes[2], sizes, zero_stage, step,
                        backend="gloo", timeout=120)
        assert all(_same(state, saved) for state, _ in run), (sizes, zero_stage)
        assert all(read < total for _, read in run)
