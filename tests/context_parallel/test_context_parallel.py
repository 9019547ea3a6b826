"""Context parallelism (ring attention) equals one device.

* the load-balanced split and its inverse (no processes);
* ring attention alone against the plain causal attention core, outputs and
  q/k/v gradients, cp 2 and 4, float64 — and the ring's messages counted from
  the trace: per call and rank, forward 2(cp−1) K/V sends, backward 2(cp−1) K/V
  sends and 2·cp dK/dV sends (the accumulator's cp hops, the last one home);
* the whole GPT against the plain GPT — the loss of every step, every gradient
  of the first step, every parameter after 3 AdamW steps, float64 to 1e-10 —
  for cp 2 (also with ZeRO-1 over cp), cp 4 with full recomputation, cp×tp
  with sequence parallelism and selective recomputation, dp×cp with ZeRO-3, and
  8 ranks of dp×pp×cp and pp×cp×tp (sequence parallel, ZeRO-2 sharded over cp
  alone); gradients compared where they are whole (without ZeRO). The trace of
  a GPT step shows each layer's K/V sends, and their bytes are the calculator's
  model (`calc.cp_comm_bytes`);
* the activations each rank keeps per layer (the ledger, measured) fall as 1/cp.

The batch has ignored targets spread unevenly over the sequence chunks, so a
loss averaged per cp rank (a mean of means) would differ from one device's.
"""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
from helpers import train_side_by_side

import minitp as mt
from minitp import context_parallel as cpar
from minitp.model import AttentionCore
from minitp.rules import check_context_split, cp_chunks
from minitp.sharding.plan import apply_plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

TOLERANCE = 1e-10
CFG = dict(vocab_size=10, seq_len=16, n_layer=2, n_head=4, d_model=16)


# --------------------------------------------------------------------------- the split
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_split_holds_chunks_i_and_2cp_minus_1_minus_i_and_merge_inverts_it(cp):
    t = torch.arange(2 * 4 * cp * 3).reshape(2, 4 * cp, 3)  # (B, T, C), 2 tokens a chunk
    parts = []
    for rank in range(cp):
        axis = mt.Axis("cp", tuple(range(cp)), rank)
        part = cpar.split_sequence(t, axis)
        early, late = cp_chunks(rank, cp)
        assert (early, late) == (rank, 2 * cp - 1 - rank)
        if cp > 1:
            assert torch.equal(part, torch.cat([t[:, 2 * early:2 * early + 2],
                                                t[:, 2 * late:2 * late + 2]], dim=1))
            positions = cpar.global_positions(part.shape[1], axis)
            assert torch.equal(part[0, :, 0], t[0, positions, 0])
        parts.append(part)
    assert torch.equal(cpar.merge_sequence(parts), t)
    # every rank gets the same causal work: the number of (query, key) pairs it keeps
    work = [sum(int(p) + 1 for p in cpar.global_positions(2 * 4, mt.Axis("cp", tuple(
        range(cp)), r))) for r in range(cp)] if cp > 1 else [0]
    assert len(set(work)) == 1


def test_the_rules_refuse_what_cannot_be_split():
    with pytest.raises(ValueError, match=r"2\*cp=8"):
        check_context_split(12, 4)
    with pytest.raises(ValueError, match="cp\\*tp"):
        check_context_split(24, 2, tp=5, sequence_parallel=True)
    cfg = mt.GPTConfig(**CFG, dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        mt.check_parallel_config(cfg, cp=2)
    mt.check_parallel_config(cfg, cp=1)  # without cp, dropout is fine
    with pytest.raises(ValueError, match="dp\\*pp\\*cp\\*tp"):
        mt.check_parallel_config(mt.GPTConfig(**CFG), cp=2, tp=2, world_size=8)
    with pytest.raises(ValueError, match="2\\*cp"):
        cpar.split_sequence(torch.zeros(1, 6), mt.Axis("cp", (0, 1), 0))


# --------------------------------------------------------------------------- ring attention
def _ring_alone():
    """On 4 ranks: cp=4, and cp=2 (two rings, dp=2). Errors against the plain core
    and the ring's sends per phase and label."""
    out = {}
    for sizes in ({"dp": 2, "cp": 2}, {"cp": 4}):
        mesh = mt.Mesh(**sizes)
        cp = mesh.cp
        torch.manual_seed(0)
        B, H, T, D = 2, 3, 16, 4
        q, k, v, g = (torch.randn(B, H, T, D, dtype=torch.float64, device=mt.device())
                      for _ in range(4))
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        AttentionCore(0.0)(*ref).backward(g)
        expected = AttentionCore(0.0)(q, k, v)
        mine = [cpar.split_sequence(t, cp, dim=2).requires_grad_() for t in (q, k, v)]
        before = len(mt.trace.events())
        with mt.trace.label("layer0"):
            y = cpar.ring_attention(*mine, cp)
        y.backward(cpar.split_sequence(g, cp, dim=2))
        sends = {}
        for e in mt.trace.events()[before:]:
            if e.op == "send":
                assert e.axis == "cp", e  # the ring's bytes are cp's, not the pipeline's
                key = (e.phase, e.label)
                sends[key] = sends.get(key, 0) + 1
        errors = [(cpar.gather_sequence(y.detach(), cp, dim=2) - expected).abs().max().item()]
        errors += [(cpar.gather_sequence(m.grad, cp, dim=2) - r.grad).abs().max().item()
                   for m, r in zip(mine, ref, strict=True)]
        out[cp.size] = (errors, sends)
    return out


def test_ring_attention_equals_causal_attention_and_sends_what_it_says():
    run = mt.launch(_ring_alone, 4, timeout=60)
    for rank, result in enumerate(run):
        for cp, (errors, sends) in result.items():
            assert max(errors) < TOLERANCE, (rank, cp, errors)
            assert sends == {("fwd", "layer0.ring K/V"): 2 * (cp - 1),
                             ("bwd", "layer0.ring K/V"): 2 * (cp - 1),
                             ("bwd", "layer0.ring dK/dV"): 2 * cp}, (rank, cp, sends)


# --------------------------------------------------------------------------- the GPT
def _batches(steps, cfg, batch):
    """`steps` global batches (x, y); ignored targets unevenly over the chunks, so
    unevenly over cp ranks and dp slices."""
    xy = torch.randint(0, cfg.vocab_size, (steps, 2, batch, cfg.seq_len),
                       generator=torch.Generator().manual_seed(1))
    xy[:, 1, 0, :5] = -100
    xy[:, 1, -1, -3:] = -100
    return [(x.to(mt.device()), y.to(mt.device())) for x, y in xy]


def _compare(configs, steps=3):
    """On every rank, for each (mesh sizes, parallelize kwargs, microbatches): the
    plain GPT and the parallel one trained side by side on the same batches."""
    results = []
    for sizes, kwargs, m in configs:
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**CFG)
        torch.manual_seed(0)
        ref = mt.GPT(cfg).to(device=mt.device(), dtype=torch.float64)
        model = mt.parallelize(ref, mesh, **kwargs)
        first = {"sends": {}, "bytes": 0, "grad_error": None}  # what the first step did

        def record(step, events, first=first, kwargs=kwargs, ref=ref, model=model):
            if step:
                return
            for e in events:
                if e.op == "send" and "ring" in e.label:
                    key = (e.phase, e.label)
                    first["sends"][key] = first["sends"].get(key, 0) + 1
                    first["bytes"] += e.nbytes
            if not kwargs.get("zero_stage"):  # whole gradients (ZeRO reduces them apart)
                grads = model.full_grad_dict()
                first["grad_error"] = max(((grads[n] - p.grad).abs().max().item(), n)
                                          for n, p in ref.named_parameters())

        loss_error, param_error, _ = train_side_by_side(
            ref, model, mesh, _batches(steps, cfg, batch=2 * sizes.get("dp", 1)),
            microbatches=m, after_step=record)
        results.append((loss_error, first["grad_error"], param_error, first["sends"],
                        first["bytes"]))
    return results


def _check(run, configs):
    for rank, results in enumerate(run):
        for (sizes, kwargs, m), (loss_error, grad_error, param_error, sends, sent) in zip(
                configs, results, strict=True):
            where = f"rank {rank}, {sizes}, {kwargs}, microbatches={m}"
            assert loss_error < TOLERANCE, f"{where}: loss differs by {loss_error:.3g}"
            if grad_error is not None:
                assert grad_error[0] < TOLERANCE, f"{where}: grad of {grad_error[1]} differs"
            assert param_error[0] < TOLERANCE, f"{where}: {param_error[1]} differs"
            # the ring's K/V sends of each layer this rank holds, per microbatch
            cp, pp = sizes["cp"], sizes.get("pp", 1)
            layers = range(CFG["n_layer"]) if pp == 1 else [
                i for i in range(CFG["n_layer"])
                if i // (CFG["n_layer"] // pp) == rank // (len(run) // pp)]
            expected = {}
            for i in layers:
                expected[("fwd", f"layer{i}.ring K/V")] = 2 * (cp - 1) * m
                expected[("bwd", f"layer{i}.ring K/V")] = 2 * (cp - 1) * m
                expected[("bwd", f"layer{i}.ring dK/dV")] = 2 * cp * m
            recompute = kwargs.get("recompute") is not None
            if recompute:  # the recomputed forward sends its K/V again, in backward
                for i in layers:
                    expected[("bwd", f"layer{i}.ring K/V")] += 2 * (cp - 1) * m
            assert sends == expected, f"{where}: ring sends {sends}"
            if not recompute:  # the calculator's model counts the same messages
                rows = 2 // m  # each dp rank's 2 rows, in m microbatches
                model = mt.calc.cp_comm_bytes(mt.GPTConfig(**CFG), rows, cp, sizes.get("tp", 1),
                                              bytes_per_value=8)
                assert sent == model * m * len(layers), (where, sent, model)


SMALL = [({"cp": 2}, {}, 1), ({"cp": 2}, {"zero_stage": 1}, 2)] + [
    ({"cp": 4}, {"recompute": "full"}, 2),
    ({"cp": 2, "tp": 2}, {"sequence_parallel": True, "recompute": "selective"}, 1),
    ({"dp": 2, "cp": 2}, {"zero_stage": 3}, 1),
]
LARGE = [({"dp": 2, "pp": 2, "cp": 2}, {}, 2),
         ({"pp": 2, "cp": 2, "tp": 2}, {"sequence_parallel": True, "zero_stage": 2}, 2)]


@pytest.mark.parametrize("world", [2, 4])
def test_gpt_equals_plain_gpt(world):
    configs = [c for c in SMALL if _world(c[0]) == world]
    _check(mt.launch(_compare, world, configs, timeout=120), configs)


def test_8_ranks_dp_pp_cp_and_pp_cp_tp_equal_plain_gpt():
    _check(mt.launch(_compare, 8, LARGE, timeout=240), LARGE)


def _world(sizes):
    n = 1
    for v in sizes.values():
        n *= v
    return n


# --------------------------------------------------------------------------- memory
def _ledger_bytes():
    """Per-layer bytes autograd keeps on this rank for one forward, with the ring
    core at cp 1 (no communication), 2 and 4, on the same global batch."""
    from minitp.context_parallel import CONTEXT_PARALLEL_PLAN
    out = {}
    for sizes in ({"dp": 4}, {"dp": 2, "cp": 2}, {"cp": 4}):
        mesh = mt.Mesh(**sizes)
        torch.manual_seed(0)
        cfg = mt.GPTConfig(**{**CFG, "seq_len": 32})
        model = copy.deepcopy(mt.GPT(cfg)).to(device=mt.device(), dtype=torch.float64)
        apply_plan(model, CONTEXT_PARALLEL_PLAN, (mesh.cp, model))
        x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), device=mt.device())
        with mt.memory.ActivationLedger(model) as ledger:
            model(cpar.split_sequence(x, mesh.cp), cpar.split_sequence(x, mesh.cp))
        core = sum(e.nbytes for e in ledger.layer("layer0") if e.module.endswith("attn.core"))
        out[mesh.cp.size] = (ledger.per_layer()["layer0"], core)
    return out


def test_activation_bytes_per_rank_fall_as_one_over_cp():
    run = mt.launch(_ledger_bytes, 4, timeout=60)
    for result in run:
        layer1, core1 = result[1]
        assert core1 > 0
        for cp in (2, 4):
            layer, core = result[cp]
            assert layer * cp == layer1, (cp, layer, layer1)
            assert core * cp == core1, (cp, core, core1)


# --------------------------------------------------------------------------- the calculator
def test_calc_divides_the_sequence_terms_by_cp_and_shards_zero_over_dp_cp():
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=8192, n_layer=8, n_head=32, d_model=4096)
    for recompute in (None, "selective", "full"):
        one = mt.calc.activation_bytes_per_layer(cfg, 1, 4, True, recompute)
        assert mt.calc.activation_bytes_per_layer(cfg, 1, 4, True, recompute, cp=4) == one / 4
    plain = mt.calc.memory_per_gpu(cfg, 1, dp=2, tp=4, sp=True, zero_stage=1)
    with_cp = mt.calc.memory_per_gpu(cfg, 1, dp=2, tp=4, sp=True, zero_stage=1, cp=2)
    assert with_cp["activations"] == plain["activations"] / 2
    assert with_cp["optimizer"] == plain["optimizer"] / 2  # sharded over dp·cp = 4
    assert with_cp["parameters"] == plain["parameters"]
    # the ring's bytes: 2(3c−2) messages of one rank's K or V, b·(s/c)·h/t values each
    assert mt.calc.cp_comm_bytes(cfg, 1, 1) == 0
    assert mt.calc.cp_comm_bytes(cfg, 2, 4, tp=2) == 2 * 10 * 2 * (8192 // 4) * 4096 // 2 * 2
    both = mt.calc.comm_bytes(cfg, 1, dp=2, tp=4, cp=2)
    assert both["cp"] == mt.calc.cp_comm_bytes(cfg, 1, 2, 4)
    assert both["tp"] == mt.calc.comm_bytes(cfg, 1, dp=2, tp=4)["tp"] / 2
    assert "cp" not in mt.calc.comm_bytes(cfg, 1, dp=2, tp=4)


def test_step_time_and_planner_take_cp():
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=16384, n_layer=32, n_head=32, d_model=4096)
    plain = mt.calc.step_time(cfg, mt.calc.A100_80GB, dp=2, tp=8, micro_batch=1)
    ring = mt.calc.step_time(cfg, mt.calc.A100_80GB, dp=2, tp=8, cp=2, micro_batch=1)
    assert "cp" not in plain.as_dict() and ring.as_dict()["cp"] > 0
    assert ring.compute == pytest.approx(plain.compute / 2)  # twice the GPUs
    assert ring.total == pytest.approx(sum(v for k, v in ring.as_dict().items() if k != "total"))
    found = mt.calc.plan(cfg, mt.calc.A100_80GB, global_batch=16, n_gpus=32, cp=2,
                         micro_batches=(1,), recompute=("selective",))
    assert found.candidates and all(c.cp == 2 and c.dp * c.pp * c.tp * 2 == 32
                                    for c in found.candidates)
    assert "cp=2" in str(found.best) and "cp groups span" in found.explain()
    with pytest.raises(ValueError, match="cp=3"):
        mt.calc.plan(cfg, mt.calc.A100_80GB, global_batch=16, n_gpus=32, cp=3)


def test_cli_refuses_a_cp_the_sequence_cannot_take(capsys):
    from minitp import train

    with pytest.raises(SystemExit) as exit_:  # refused before any process starts
        train.main(["--cp", "3", "--dp", "1", "--pp", "1", "--tp", "1"])
    assert exit_.value.code == 2
    assert "seq_len=64 is not divisible by 2*cp=6" in capsys.readouterr().err


# --------------------------------------------------------------------------- checkpoints
def _save_at_cp2_then_dense(directory):
    device = mt.device()
    mesh = mt.Mesh(dp=1, pp=1, tp=1, cp=2)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)).to(device).double(), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, CFG["vocab_size"], (2, CFG["seq_len"]), device=device)
    mt.train_step(model, (x, x), mesh, opt)
    mt.checkpoint.save(model, directory, step=1, optimizer=opt)
    return model.full_state_dict()


def _load_at_cp1(directory):
    mesh = mt.Mesh(dp=1, pp=1, tp=2)
    model, _, meta = mt.checkpoint.load(directory, mesh, sequence_parallel=True)
    return model.full_state_dict(), meta["topology"]


def test_a_checkpoint_saved_at_cp_2_records_it_and_loads_at_cp_1(tmp_path):
    directory = str(tmp_path / "ckpt")
    saved = mt.launch(_save_at_cp2_then_dense, 2, directory, timeout=60)[0]
    loaded, topology = mt.launch(_load_at_cp1, 2, directory, timeout=60)[0]
    assert topology["cp"] == 2 and topology["dp"] == topology["tp"] == 1
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
