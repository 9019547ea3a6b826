"""ZeRO stages 1, 2 and 3 over the data-parallel axis (`minitp.data_parallel.zero`): equal to the
plain GPT, mixed with tensor and pipeline parallelism; the model-state bytes each
rank keeps, measured, beside the ZeRO paper's formulas; stage 3's parameters
gathered before each unit's forward and again before its backward; the
gradients' reduce-scatters overlapping backward, stage 3's gathers prefetched;
the bytes a step sends per rank, measured, beside the paper's 2Ψ and 3Ψ.

Budget: three launches of 4 ranks (a sample of the matrix, several cases per
launch); the whole (dp, pp, tp) matrix is tests/test_3d.py's job at stage 0-1.
"""

import gc

import pytest
import torch
from helpers import live_bytes, train_side_by_side
from test_3d import CFG, TOLERANCE, _batches

import minitp as mt
import minitp.calc as calc
from minitp.memory import ActivationLedger, measure_model_states
from minitp.rules import parse_layer_label
from minitp.runtime import io_counters as _io_counters

# (dp, pp, tp, zero_stage, microbatches, sequence_parallel, recompute, schedule, virtual)
CASES = [
    (2, 1, 2, 3, 2, True, None, None, 1),
    (2, 1, 2, 2, 1, True, "selective", None, 1),
    (2, 2, 1, 2, 2, False, None, "1f1b", 1),
    (2, 2, 1, 3, 4, False, "full", "interleaved", 2),
    (4, 1, 1, 3, 1, False, None, None, 1),
    (4, 1, 1, 1, 2, False, "full", None, 1),
]


def _compare(cases, steps=3):
    """Each case: the plain GPT and the ZeRO one trained side by side in float64."""
    results = {}
    for case in cases:
        dp, pp, tp, zero, m, sp, recompute, schedule, v = case
        mesh = mt.Mesh(dp=dp, pp=pp, tp=tp)
        cfg = mt.GPTConfig(**CFG)
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, sequence_parallel=sp, recompute=recompute,
                               virtual_stages=v, zero_stage=zero)
        last_step = []  # the last train_step's events

        def keep(step, events, last_step=last_step):
            last_step[:] = events

        loss_error, worst, _ = train_side_by_side(
            ref, model, mesh, _batches(steps, cfg, batch=dp * 2 * pp), microbatches=m,
            schedule=schedule, after_step=keep)
        results[case] = (loss_error, worst, last_step if zero >= 2 and pp == 1 else None)
    return results


@pytest.fixture(scope="module")
def compare_run():
    return mt.launch(_compare, 4, CASES, timeout=300)


def test_every_stage_equals_plain_gpt_float64(compare_run):
    for rank, results in enumerate(compare_run):
        assert set(results) == set(CASES)
        for case, (loss_error, (param_error, name), _) in results.items():
            assert loss_error < TOLERANCE, f"rank {rank}, {case}: loss differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"rank {rank}, {case}: {name} by {param_error:.3g}"


def _inside(outer, inner) -> bool:
    return outer.start < inner.start and inner.end < outer.end


def test_reduce_scatters_overlap_backward_and_stage3_prefetches(compare_run):
    """In the last step's trace (pp = 1 cases): each layer's gradient reduce-scatter
    is still in flight while the layer before it runs its backward, and at stage 3
    the next layer's gather is in flight while this one computes — forward (next
    layer) and backward (previous layer). With tp > 1 the proof is the layer's own
    tensor-parallel collectives, inside the dp op's span; with tp = 1 it is the
    next gather posted before this one is waited."""
    checked = 0
    for rank, results in enumerate(compare_run):
        for case, (_, _, events) in results.items():
            if events is None:
                continue
            dp, _, tp, zero, m = case[:5]
            where = f"rank {rank}, {case}"
            last_b = max((e for e in events if e.op == "compute" and e.phase == "bwd"),
                         key=lambda e: e.end)
            mine = [e for e in events if e.start >= last_b.start]  # the last backward on

            def dp_op(op, unit, phase, pool=mine):
                return [e for e in pool if e.axis == "dp" and e.op == op and e.phase == phase
                        and e.label.endswith(f" {unit}")]

            def tp_in(layer, phase, pool=mine):
                return [e for e in pool if e.axis == "tp" and e.phase == phase
                        and parse_layer_label(e.label) == layer]

            layers = CFG["n_layer"]
            for k in range(1, layers):  # reduce-scatter of layer k spans layer k-1's backward
                (rs,) = dp_op("reduce_scatter", f"blocks.{k}", "bwd")
                assert rs.start < last_b.end, where
                if tp > 1:
                    assert any(_inside(rs, e) for e in tp_in(k - 1, "bwd")), (where, k)
                else:
                    (earlier,) = dp_op("reduce_scatter", f"blocks.{k - 1}", "bwd")
                    assert earlier.start < rs.end, (where, k)  # both in flight at once
            if zero < 3:
                continue  # stage 2 gathers only after the optimizer step: nothing to prefetch
            for k in range(layers - 1):
                # forward: layer k+1's gather travels while layer k computes
                fwd = dp_op("all_gather", f"blocks.{k + 1}", "fwd", events)[-1]
                ahead = dp_op("all_gather", f"blocks.{k}", "fwd", events)[-1]
                assert fwd.start < ahead.end, (where, k)  # posted before this one's wait
                # backward: layer k's gather travels while layer k+1 computes
                (bwd,) = dp_op("all_gather", f"blocks.{k}", "bwd")
                (later,) = dp_op("all_gather", f"blocks.{k + 1}", "bwd")
                assert bwd.start < later.end, (where, k)
                if tp > 1:
                    assert any(_inside(fwd, e) for e in tp_in(k, "fwd", events)), (where, k)
                    assert any(_inside(bwd, e) for e in tp_in(k + 1, "bwd")), (where, k)
        checked += sum(events is not None for _, _, events in results.values())
    assert checked == 3 * 4  # the three pp = 1 cases at stages 2-3, on every rank


# --------------------------------------------------------------------------- bytes
MEMORY_CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=6)


def _state_bytes(dp):
    """Per stage: measure_model_states and the live bytes after two steps, Ψ (this
    rank's parameters), Ψ padded as the stage shards it, and the trace of a step."""
    mesh = mt.Mesh(dp=dp)
    cfg = mt.GPTConfig(**MEMORY_CFG)
    x = torch.randint(0, 16, (2 * dp, 8), generator=torch.Generator().manual_seed(1))
    out, activations = {}, {}
    for stage in range(4):
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, zero_stage=stage)
        optimizer = mt.make_optimizer(model, mesh, torch.optim.Adam, lr=1e-3)
        for _ in range(2):
            mt.trace.clear()
            mt.train_step(model, (x, x.roll(-1, 1)), mesh, optimizer)
        events = mt.trace.events()
        gc.collect()
        units = [(u.name, u.padded) for u in getattr(model, "zero_units", [])]
        padded = (optimizer.padded if stage == 1
                  else sum(p for _, p in units) or ref.num_parameters())
        out[stage] = (measure_model_states(model, optimizer), live_bytes(model, optimizer),
                      ref.num_parameters(), padded, units, events)
        with ActivationLedger(model) as ledger:  # stage 3's gathered weights are not activations
            model(x[:2], x[:2])
        activations[stage] = ledger.total_bytes
    assert len(set(activations.values())) == 1, activations
    return out


def _dtype_formula(psi, padded, n, stage, e):
    """What a rank keeps in one dtype of e bytes with Adam (two moments): the paper's
    (2 + 2 + K)Ψ becomes (e + e + 2e)Ψ, each term divided by N once its stage
    shards it (over Ψ padded to N equal slices), plus the shard a sharded optimizer
    steps — its own copy of this rank's 1/N of the parameters (the paper counts
    that "master" copy inside K): the model's only copy at stage 3, one more at
    stages 1 and 2, where stage 1 also keeps the shard's reduce-scattered gradient."""
    shard = e * padded // n
    if stage == 0:
        return {"parameters": e * psi, "gradients": e * psi, "optimizer": 2 * e * psi}
    return {"parameters": (e * psi if stage < 3 else 0) + shard,
            "gradients": (e * psi + shard if stage == 1 else shard),
            "optimizer": 2 * shard}


def _paper(psi, padded, n, stage, e):
    """Rajbhandari et al. 2020, §5: (2+2+K)Ψ, (2+2+K/N)Ψ, (2+(2+K)/N)Ψ, (2+2+K)Ψ/N,
    from `minitp.calc` (fp32 Adam: 4 + 4 + 8, scaled to e bytes), its 1/N terms
    over the padded Ψ that the shards really split."""
    whole = calc.model_state_bytes(psi, n, 0, "adam-fp32")
    split = calc.model_state_bytes(padded, n, stage, "adam-fp32")
    sharded = {"optimizer": stage >= 1, "gradients": stage >= 2, "parameters": stage >= 3}
    return sum((split if sharded[k] else whole)[k] for k in sharded) * e // 4


N = 4  # dp


@pytest.fixture(scope="module")
def state_run():
    return mt.launch(_state_bytes, N, N, timeout=120)


def test_model_state_bytes_per_stage_beside_the_paper(state_run):
    """Measured (measure_model_states, and independently every storage reachable from
    the model and optimizer between steps) equals the dtype's formula exactly, and
    the paper's formula plus the named gap: 2eΨ/N at stage 1 (shard copy and its
    gradient), eΨ/N at stage 2 (shard copy), nothing at stages 0 and 3."""
    n, e = N, 8  # float64
    for rank, by_stage in enumerate(state_run):
        for stage, (states, live, psi, padded, units, _) in by_stage.items():
            expected = _dtype_formula(psi, padded, n, stage, e)
            where = f"rank {rank}, stage {stage}"
            assert states["total"] == live, where  # nothing else alive: no gathered leftovers
            assert states["parameters"] == expected["parameters"], where
            assert states["gradients"] == expected["gradients"], where
            moments = sum(v for k, v in states["optimizer_state"].items() if k != "step")
            assert moments == expected["optimizer"], where
            assert padded - psi < n * max(1, len(units)), where  # padding: < N per unit
            measured = states["total"] - states["optimizer_state"].get("step", 0)
            gap = {0: 0, 1: 2 * e * padded // n, 2: e * padded // n, 3: 0}[stage]
            assert measured == _paper(psi, padded, n, stage, e) + gap, where


def test_stage3_gathers_each_unit_before_forward_and_again_before_backward(state_run):
    for by_stage in state_run:
        _, _, _, _, units, events = by_stage[3]
        zero = [e for e in events if "zero " in e.label]
        for name, padded in units:
            mine = [e for e in zero if e.label.endswith(f" {name}")]
            uses = 2 if name == "wte" else 1  # the tied embedding: lookup and output head
            gathers = [e.phase for e in mine if e.op == "all_gather"]
            assert gathers.count("fwd") == uses and gathers.count("bwd") == uses, (name, gathers)
            scatters = [e for e in mine if e.op == "reduce_scatter"]
            assert len(scatters) == uses and all(e.phase == "bwd" for e in scatters), name
            assert all(e.nbytes == padded * 8 for e in mine), name
        assert not [e for e in events if e.axis == "dp" and e.op == "all_reduce"
                    and e.label != "batch loss"]


# --------------------------------------------------------------------------- wire bytes
WIRE_CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=4, d_model=128)  # Ψ ≈ 400k


def _wire_bytes(dp):
    """Per stage, one measured step at m = 1 on dp ranks only:
    what this process wrote during the step (the kernel's counter: every byte gloo
    sent, headers included), the dp events' ring-model bytes, split by op, Ψ, and
    the tied embedding's share of Ψ."""
    mesh = mt.Mesh(dp=dp)
    cfg = mt.GPTConfig(**WIRE_CFG)
    x = torch.randint(0, cfg.vocab_size, (dp, cfg.seq_len),
                      generator=torch.Generator().manual_seed(2))
    out = {}
    for stage in range(4):
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, zero_stage=stage)
        optimizer = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
        mt.trace.clear()
        before = _io_counters.written()
        with mt.comm.checks(False):  # the step's own bytes, not the calls' bookkeeping exchange
            mt.train_step(model, (x, x.roll(-1, 1)), mesh, optimizer)
        sent = _io_counters.written() - before
        ring = {}
        for e in mt.trace.events():
            if e.axis == "dp":
                key = "loss" if e.label == "batch loss" else e.op
                ring[key] = ring.get(key, 0) + e.model_bytes
        out[stage] = (sent, ring, ref.num_parameters(), ref.wte.weight.numel())
    return out


@pytest.mark.skipif(not _io_counters.available(),
                    reason="no /proc/self/io: a step's sent bytes cannot be measured here")
def test_wire_bytes_per_step_beside_the_paper():
    """The ZeRO paper (§7): data parallelism moves 2Ψ per rank per step (a
    reduce-scatter and an all-gather, each Ψ), so do stages 1 and 2; stage 3 moves
    3Ψ (parameters gathered for forward and again for backward, gradients
    reduce-scattered), 1.5x stage 0's. Per rank, in bytes, on a ring: (N-1)/N·e·Ψ each
    (the paper rounds (N-1)/N to 1).

    Measured here (a whole step's writes; per-event ``sent_bytes`` is None where
    ops overlap, which at stages 0, 2 and 3 they now do): the ring model of the
    step's events, doubled for each reduce-scatter because gloo's reduce-scatter
    sends an all-reduce's bytes (tests/runtime/test_wire_bytes.py, lesson 05). So beside
    the paper, on gloo: stage 0 1.0x; stages 1-2 1.5x (2Ψ of reduce-scatter + Ψ of
    all-gather, for the paper's 2Ψ); stage 3 4/3x (Ψ + Ψ + 2Ψ for 3Ψ). On NCCL,
    whose reduce-scatter is a ring, the model says 1.0x at every stage. And the
    tied embedding counts twice at stage 3 (gathered, and reduced, for the lookup
    and again for the output head), plus each unit's padding to N: below 1% here.
    (Measured, torch 2.13 gloo, N = 4, float64, stages 0-3: 1.002x, 1.501x, 1.503x,
    1.343x the paper; headers 0.04-0.2% of the bytes.)"""
    n, e = 4, 8
    run = mt.launch(_wire_bytes, n, n, timeout=120)
    for rank, by_stage in enumerate(run):
        for stage, (sent, ring, psi, psi_wte) in by_stage.items():
            where = f"rank {rank}, stage {stage}: {ring}, sent {sent}"
            paper = (2 if stage < 3 else 3) * psi * e * (n - 1) // n
            model = sum(ring.values())
            gloo = model + ring.get("reduce_scatter", 0)  # gloo's reduce-scatter: twice
            assert abs(sent - gloo) < 0.01 * gloo, where  # measured = gloo's bytes, headers
            twice = psi_wte / psi if stage == 3 else 0  # the head's second use of wte
            assert abs(model / paper - (1 + twice)) < 0.01, where  # padding only
            on_gloo = {0: 1.0, 1: 1.5, 2: 1.5, 3: 4 / 3}[stage]
            assert abs(sent / paper - on_gloo * (1 + twice)) < 0.02, where
