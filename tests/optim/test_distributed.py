"""Muon over a parallel model equals one device's Muon (Muon for the linear weights, AdamW
for the rest) in float64: every strategy on sampled meshes, ZeRO 0-3, tp ± SP, pp, ep (MoE), a 3D
mesh; the loss of every step and every parameter after 3 steps to 1e-10. One launch per
world size runs all of its settings. The same runs count what each rank sent for Muon (the
trace's bytes, beside `mt.calc.muon_comm_bytes`, a MODEL) and the Newton–Schulz FLOPs each
rank ran (duplicated under gather, spread under owner).

With ep the experts' weights (3-D banks) are AdamW's: no Muon matrix is an expert's. Not
covered here: cp (its dp×cp group is the same code path as dp), bf16 (refused).
"""

import functools

import pytest
import torch
from helpers import random_batches, train_side_by_side

import minitp as mt

TOLERANCE = 1e-10
CFG = dict(vocab_size=10, seq_len=8, n_layer=2, n_head=2, d_model=8)
MOE = dict(n_experts=2, top_k=1)  # with ep: the experts' 3-D banks are AdamW's, the router Muon's
OPTIONS = dict(lr=0.02, weight_decay=0.1, adamw_lr=1e-2, adamw_weight_decay=0.01)

# (mesh sizes, ZeRO stage, sequence parallel, strategy, qkv_split): sampled, one launch per
# world; "heads" orthogonalises qkv head by head (whole heads on each tp rank: no tp bytes)
SETTINGS = {
    2: [(dict(dp=2), 0, False, "owner", None), (dict(dp=2), 1, False, "gather", None),
        (dict(dp=2), 1, False, "owner", None), (dict(dp=2), 3, False, "owner", None),
        (dict(dp=2), 2, False, "gather", None),
        (dict(tp=2), 0, False, "gather", None), (dict(tp=2), 0, True, "tp", None),
        (dict(pp=2), 1, False, "owner", None), (dict(tp=2), 0, False, "gather", "heads"),
        (dict(dp=2, ep=2), 1, False, "owner", None)],
    8: [(dict(dp=2, pp=2, tp=2), 1, True, "tp", None),
        (dict(dp=2, pp=2, tp=2), 3, False, "owner", None),
        (dict(dp=4, tp=2), 2, False, "owner", None)],  # dp 4: LPT over 4 homes, tp at home
}


def _train(settings):
    """On every rank, per setting: (loss error, (parameter error, name), Newton–Schulz
    FLOPs of the last step, Muon's bytes sent in the last step (trace MODEL), the whole
    matrices of this rank's stage as (rows, cols, split_dim[, elements each dp rank holds]))."""
    from minitp.optim import muon_with_adamw

    out = []
    for sizes, zero, sp, strategy, qkv_split in settings:
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**CFG, **(MOE if "ep" in sizes else {}))
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, sequence_parallel=sp, zero_stage=zero)
        opt = mt.make_optimizer(model, mesh, "muon", strategy=strategy, qkv_split=qkv_split,
                                **OPTIONS)
        sent = []

        def count(step, events, sent=sent):
            sent.append(sum(e.model_bytes for e in events if e.label.startswith("muon")))

        pp = sizes.get("pp", 1)
        loss_error, worst, _ = train_side_by_side(
            ref, model, mesh, random_batches(3, cfg, 2 * pp * sizes.get("dp", 1)),
            microbatches=pp, optimizers=(muon_with_adamw(ref, qkv_split, **OPTIONS), opt),
            after_step=count)
        inner = getattr(opt, "inner", opt)
        out_state = _state(model, opt, inner)
        shapes = [(*p.dense_shape, p.split_dim) if p.ranges is None else
                  (*p.dense_shape, p.split_dim, [b - a for a, b in p.ranges])
                  for p in inner.pieces]
        out.append((loss_error, worst, inner.ns_flops, sent[-1], shapes, out_state))
    return out


def _state(model, opt, inner):
    """(Muon's and AdamW's state bytes measured, the matrix elements this rank steps, the
    other elements, padding included)."""
    measured = mt.memory.measure_model_states(model, opt)["optimizer_state"]
    n_matrix = sum(p.hi - p.lo for p in inner.pieces)
    stepped = sum(t.numel() for t in ([f.shard for f in opt.flats] if hasattr(opt, "flats") else
                                      [u.shard for u in getattr(opt, "units", [])]))
    n_rest = stepped - n_matrix if stepped else sum(p.numel() for p in inner.adamw.param_groups[0]
                                                    ["params"])
    return (measured["momentum_buffer"], measured["exp_avg"] + measured["exp_avg_sq"], n_matrix,
            n_rest)


@functools.cache
def _run(world):
    return mt.launch(_train, world, SETTINGS[world], timeout=300)


@pytest.mark.parametrize("world", sorted(SETTINGS))
def test_every_strategy_equals_one_device_muon_float64(world):
    for rank, results in enumerate(_run(world)):
        for setting, (loss_error, (param_error, name), *_) in zip(SETTINGS[world], results,
                                                                   strict=True):
            where = f"rank {rank}, {setting}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"{where}: {name} differs by {param_error:.3g}"


def _one_device_flops(shapes):
    return sum(mt.optim.ns_flops(rows, cols) for rows, cols, *_ in shapes)


def test_newton_schulz_work_duplicated_under_gather_spread_under_owner():
    """dp 2 at ZeRO-1: gather runs every matrix on both ranks; owner splits them, the two
    ranks' FLOPs adding up to one device's, neither rank doing all."""
    run, settings = _run(2), SETTINGS[2]
    gather, owner = settings.index((dict(dp=2), 1, False, "gather", None)), settings.index(
        (dict(dp=2), 1, False, "owner", None))
    whole = _one_device_flops(run[0][gather][4])
    assert [r[gather][2] for r in run] == [whole, whole]
    assert sum(r[owner][2] for r in run) == whole
    assert max(r[owner][2] for r in run) < whole


def test_state_bytes_beside_the_model():
    """Muon's state measured per rank (one momentum per matrix element, AdamW's two per
    other element, ZeRO's padding among them) beside `calc.muon_state_bytes` at ZeRO 0, 1,
    2 and 3 (dp 2, float64: twice its float32 bytes), and summed over the ranks."""
    run, settings = _run(2), SETTINGS[2]
    for i, (_, zero, *_) in enumerate(settings[:5]):  # the dp 2 meshes
        muon, adamw, n_matrix, n_rest = (sum(r[i][5][k] for r in run) for k in range(4))
        assert (muon, adamw) == (8 * n_matrix, 16 * n_rest), settings[i]
        model = mt.calc.muon_state_bytes(n_matrix // 2 if zero == 0 else n_matrix,
                                         n_rest // 2 if zero == 0 else n_rest, dp=2,
                                         zero_stage=zero)["optimizer"]
        assert (muon + adamw) / 2 == 2 * model, settings[i]


def test_bytes_beside_the_model():
    """What each strategy sent (the trace's ring MODEL, mean over ranks) equals
    `calc.muon_comm_bytes`, given where ZeRO's shards cut each matrix."""
    for world, settings in SETTINGS.items():
        run = _run(world)
        for i, (sizes, zero, _, strategy, _) in enumerate(settings):
            measured = sum(r[i][3] for r in run) / len(run)
            model = sum(mt.calc.muon_comm_bytes(r[i][4], strategy, sizes.get("dp", 1),
                                                sizes.get("tp", 1), zero, bytes_per=8)["total"]
                        for r in run) / len(run)
            where = f"{sizes}, ZeRO-{zero}, {strategy}: {measured} bytes, model {model}"
            assert measured == model, where


def test_the_state_saved_and_loaded_steps_on_alike():
    """In one process (axes of size 1): a DistributedMuon whose state is saved after two
    steps, loaded into a fresh one, steps on exactly as the original."""
    import copy
    import types

    from minitp.optim import DistributedMuon
    from minitp.optim.pieces import whole_pieces

    one = types.SimpleNamespace(size=1, rank=0)
    models, optimizers = [], []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(mt.GPT(mt.GPTConfig(**CFG)).double())
        optimizers.append(DistributedMuon(*whole_pieces(models[-1], one, {}), one, one,
                                          "gather", **OPTIONS))
    x = torch.randint(0, 10, (2, 8), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for model, opt in zip(models, optimizers, strict=True):
            if step < 2 and opt is optimizers[1]:
                continue  # the second model sits out: it takes the first's weights and state
            opt.zero_grad()
            model(x, x)[1].backward()
            opt.step()
        if step == 1:
            models[1].load_state_dict(models[0].state_dict())
            # a copy, as a file would be: torch's AdamW loads state tensors without copying
            optimizers[1].load_state_dict(copy.deepcopy(optimizers[0].state_dict()))
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
