"""MoE parallel folding (issue 52, item 4): the experts factor a stage's ranks their own
way (etp × ep × edp = tp × cp × dp), and equal one device in float64.

One launch of 4 ranks trains, beside the plain MoE GPT, one AdamW step (clipped: the
global norm counts folded expert copies once) on each of:

* (dp 2, tp 2, ep 4) folded, no sequence parallelism: each tp rank routes its 1/tp slice;
* (cp 2, tp 2, ep 4) folded, sequence parallelism, a capacity factor;
* (dp 2, tp 2, ep 2, etp 2): each expert split over etp, rows gathered and summed over it;
* (dp 2, tp 2, ep 2) unfolded, no sequence parallelism: today's layout, kept working;
* (pp 2, tp 2, ep 2) folded per stage, sequence parallelism, 2 microbatches, the expert
  bias (the reference steps its own).

The step's loss and grad norm, its gradients and the parameters after it (and the
forward-only loss after it) equal one device's to 1e-10. Measured beside the MODEL: the
rows every rank's experts computed (`expert_parallel.expert_work`) sum to the batch's
routed rows times `rules.expert_compute_copies` (tp for today's layout without SP, 1
folded), and the FLOPs from them to `calc.routed_expert_flops`; etp's gather/scatter
all-to-all bytes in the trace equal `calc.etp_extra_bytes` on the rows each rank held.
"""

import pytest
import torch
from helpers import random_batches, train_side_by_side

import minitp as mt
import minitp.calc as calc
from minitp.expert_parallel import expert_work
from minitp.model.moe import update_expert_bias
from minitp.rules import check_expert_mesh, expert_compute_copies, expert_meshes

TOLERANCE = 1e-10
SMALL = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8, n_experts=4, top_k=2)
BATCH = 8
SETTINGS = {  # name: (mesh sizes, parallelize options, GPTConfig overrides)
    "dp2 tp2 ep4": (dict(dp=2, tp=2, ep=4, fold=True), {}, dict(shared_expert=True)),
    "cp2 tp2 ep4 sp": (dict(cp=2, tp=2, ep=4, fold=True), dict(sequence_parallel=True),
                       dict(capacity_factor=1.0)),
    "dp2 tp2 ep2 etp2": (dict(dp=2, tp=2, ep=2, etp=2), {}, {}),
    "unfolded dp2 tp2 ep2": (dict(dp=2, tp=2, ep=2), {}, {}),
    "pp2 tp2 ep2 sp": (dict(pp=2, tp=2, ep=2, fold=True), dict(sequence_parallel=True),
                       dict(router="sigmoid", balance="bias", bias_update_rate=0.05)),
}


def _record_etp(model, held):
    from minitp.model.moe import moe_layers

    for layer in moe_layers(model):
        run = layer.dispatch.run_local

        def record(rows, per_expert, experts, run=run):
            held.append(rows.shape[0])
            return run(rows, per_expert, experts)
        layer.dispatch.run_local = record


def _train():
    results = {}
    for name, (sizes, options, overrides) in SETTINGS.items():
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**{**SMALL, **overrides})
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, **options)
        held, first = [], {}
        if mesh.etp.size > 1:
            _record_etp(model, held)

        def after(step, events, ref=ref, model=model, first=first):
            update_expert_bias(ref)  # the reference's balancing: its own step's load
            if step:
                return
            grads = model.full_grad_dict()
            first["grad"] = max((grads[n] - p.grad).abs().max().item()
                                for n, p in ref.named_parameters())
            first["etp"] = [(e.label.split(".", 1)[1], e.phase, e.model_bytes)
                            for e in events if "etp" in e.label]

        with expert_work(model) as seen:  # the one step's training forward (not eval's)
            loss_error, (param_error, where), _ = train_side_by_side(
                ref, model, mesh, random_batches(1, cfg, BATCH), after_step=after,
                clip_grad=0.5, microbatches=mesh.pp.size)
        first["rows"], first["flops"] = seen["rows"], seen["flops"]
        results[name] = dict(loss=loss_error, param=param_error, where=where,
                             held=held[:cfg.n_layer], etp_ranks=list(mesh.etp.ranks), **first)
    return results


@pytest.fixture(scope="module")
def runs():
    return mt.launch(_train, 4, timeout=240)


@pytest.mark.ranks
def test_folded_meshes_equal_one_device_in_float64(runs):
    for rank, results in enumerate(runs):
        for name, r in results.items():
            where = f"rank {rank}, {name}"
            assert r["loss"] < TOLERANCE, f"{where}: loss or grad norm differs by {r['loss']:.3g}"
            assert r["grad"] < TOLERANCE, f"{where}: first gradients differ by {r['grad']:.3g}"
            assert r["param"] < TOLERANCE, f"{where}: {r['where']} differs by {r['param']:.3g}"


@pytest.mark.ranks
def test_expert_work_measured_equals_the_model(runs):
    cfg = mt.GPTConfig(**SMALL)
    hidden, layers = 4 * cfg.d_model, cfg.n_layer
    for name, (sizes, options, overrides) in SETTINGS.items():
        if overrides.get("capacity_factor"):
            continue  # drops: fewer rows than routed
        rows = sum(r[name]["rows"] for r in runs)
        flops = sum(r[name]["flops"] for r in runs)
        fold = "etp" in sizes or sizes.get("fold", False)
        copies = expert_compute_copies(sizes["tp"], options.get("sequence_parallel", False),
                                       fold)
        assert copies == (1 if fold else 2), name
        etp = sizes.get("etp", 1)  # each etp rank runs every row on its slice of the width
        assert rows == BATCH * cfg.seq_len * cfg.top_k * copies * layers * etp, name
        model = calc.routed_expert_flops(BATCH * cfg.seq_len, cfg.top_k, cfg.d_model, hidden,
                                         sizes["tp"], options.get("sequence_parallel", False),
                                         fold)
        assert 3 * flops == model["flops"] * layers, name  # forward: 1/3 of 6 per weight


@pytest.mark.ranks
def test_etp_bytes_in_the_trace_equal_the_model(runs):
    name, d = "dp2 tp2 ep2 etp2", SMALL["d_model"]
    for rank, results in enumerate(runs):
        r = results[name]
        assert len(r["held"]) == SMALL["n_layer"] and r["etp"], f"rank {rank}: no etp traffic"

        def traced(suffix, phase, r=r):
            return sum(b for label, p, b in r["etp"] if label.endswith(suffix) and p == phase)
        mine = sum(r["held"])  # rows the ep dispatch left here, both layers
        theirs = sum(sum(runs[g][name]["held"]) for g in r["etp_ranks"]) - mine
        model = calc.etp_extra_bytes(mine, 1, d, 2, local_experts=2, bytes_per_element=8)
        others = calc.etp_extra_bytes(theirs, 1, d, 2, bytes_per_element=8)  # etp 2: 1 other
        # forward: my rows out to the other etp rank, then the partials of its rows back
        assert traced("etp gather", "fwd") == model["gather"], f"rank {rank}"
        assert traced("etp scatter", "fwd") == others["scatter"], f"rank {rank}"
        # backward: each the other's adjoint, the same bytes the other way
        assert traced("etp scatter", "bwd") == model["scatter"], f"rank {rank}"
        assert traced("etp gather", "bwd") == others["gather"], f"rank {rank}"
        assert traced("etp counts", "fwd") == SMALL["n_layer"] * model["counts"], f"rank {rank}"


def test_the_rule_says_which_expert_meshes_a_stage_allows():
    assert expert_meshes(2, 1, 2) == [(1, 1, False), (2, 1, False), (1, 1, True),
                                      (2, 1, True), (4, 1, True), (1, 2, True), (2, 2, True),
                                      (1, 4, True)]
    check_expert_mesh(4, dp=2, cp=1, tp=2, fold=True)  # ep spans tp: allowed folded
    with pytest.raises(ValueError, match="fold=True"):
        check_expert_mesh(4, dp=2, cp=1, tp=2)
    with pytest.raises(ValueError, match="ep\\*etp=4\\*2=8 does not divide"):
        check_expert_mesh(4, dp=2, cp=1, tp=2, etp=2)
    groups = mt.layout(dp=2, tp=2, ep=2, etp=2)
    assert groups["etp"] == [[0, 1], [2, 3]] and groups["ep"] == [[0, 2], [1, 3]]
    assert mt.layout(cp=2, tp=2, ep=4, fold=True)["ep"] == [[0, 1, 2, 3]]


def test_folding_bytes_at_deepseek_v3_shapes_are_the_model():
    """MODEL at DeepSeek-V3's shapes (`calc.DEEPSEEK_V3`, arXiv 2412.19437 §4.2): 64 ranks
    as EP 64 or as ep 8 × etp 8, 4096 routed tokens a rank, bf16. The same weights and
    GEMM work a rank; etp's gather and scatter make the bytes (7/8 + 7)/(63/64) = 8 times."""
    v3, tokens, row = calc.DEEPSEEK_V3, 4096, 7168 * 2
    r = calc.fold_vs_etp(v3, tokens, 64, 8)
    assert r["folded"]["expert_weights"] == r["etp"]["expert_weights"] == 3 * 7168 * 2048 * 4
    assert (r["folded"]["gemm_hidden"], r["etp"]["gemm_hidden"]) == (2048, 256)
    assert r["etp"]["etp"] == 4 * 7 * tokens * 8 * row + 7 * 32 * 8  # rows, and counts
    assert r["folded"]["ep"] == 4 * tokens * 8 * 63 // 64 * row + 63 * 4 * 8
    assert abs(r["ratio"] - 8) < 1e-5
