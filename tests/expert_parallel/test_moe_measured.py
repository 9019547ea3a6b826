"""Expert parallelism measured beside `minitp.calc` (issue 23, item 5).

One launch of 4 ranks runs one train_step of a tiny MoE GPT (float64, dropless) on three
meshes — dp=4 (ep=1), dp=4 ep=4, and dp=2 tp=2 ep=2 — and records, per rank, the rows
each MoE layer sent each expert, the trace's all-to-all events and the model states:

* the all-to-all bytes the trace's model counts equal `calc.moe_all_to_all_bytes_from_counts`
  on the counts that run sent, event by event (dispatch and combine, forward and backward,
  and the counts table); the OS counter's measured bytes are that plus one header per
  peer (the same header tests/runtime/test_comm.py finds for every all-to-all message);
* the model-state bytes equal `calc.model_state_bytes(..., expert_params=, ep=)`: the
  experts' parameters, gradients and Adam moments shrink with ep.
"""

from __future__ import annotations

import pytest
import torch

import minitp as mt
import minitp.calc as calc
from minitp import memory
from minitp.model.moe import moe_layers

CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8, n_experts=4,
           shared_expert=True)
MESHES = {"ep1": dict(dp=4, ep=1), "ep4": dict(dp=4, ep=4), "tp2-ep2": dict(dp=2, tp=2, ep=2)}
BATCH = 8


def _run(mesh_kw):
    mesh = mt.Mesh(**mesh_kw)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg).double(), mesh)
    sent = []  # per MoE layer, in forward order: this rank's rows per expert
    for layer in moe_layers(model):
        run = layer.dispatch.run_experts

        def record(rows, counts, experts, run=run):
            sent.append(counts.tolist())
            return run(rows, counts, experts)
        layer.dispatch.run_experts = record
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=g)
    y = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=g)
    mt.trace.clear()
    mt.train_step(model, (x, y), mesh, optimizer)
    events = [(e.label, e.phase, e.model_bytes, e.sent_bytes)
              for e in mt.trace.events() if e.op == "all_to_all"]
    return {"ep_ranks": list(mesh.ep.ranks), "ep_rank": mesh.ep.rank, "sent": sent,
            "events": events, "states": memory.measure_model_states(model, optimizer),
            "params": sum(p.numel() for p in model.parameters()),
            "tensors": len(list(model.parameters()))}


def _measure():
    return {name: _run(kw) for name, kw in MESHES.items()}


@pytest.fixture(scope="module")
def runs():
    return list(mt.launch(_measure, 4, timeout=120))


@pytest.mark.parametrize("name", ["ep4", "tp2-ep2"])
def test_all_to_all_bytes_equal_the_model_on_the_counts_sent(runs, name):
    E, row_bytes = CFG["n_experts"], CFG["d_model"] * 8  # float64 rows of d values
    headers = set()
    for rank, found in enumerate(runs):
        r = found[name]
        ep, local = len(r["ep_ranks"]), E // len(r["ep_ranks"])
        assert r["sent"] and len(r["sent"]) == CFG["n_layer"]
        for layer in range(CFG["n_layer"]):
            # the ep×ep table: rows ep rank i sent to ep rank j (its experts' counts summed)
            table = [[sum(runs[g][name]["sent"][layer][j * local:(j + 1) * local])
                      for j in range(ep)] for g in r["ep_ranks"]]
            model = calc.moe_all_to_all_bytes_from_counts(table, row_bytes, r["ep_rank"], E)
            events = {(label.split(".", 1)[1], phase): (m, s)
                      for label, phase, m, s in r["events"] if label.startswith(f"layer{layer}.")}
            measured = {key: m for key, (m, _) in events.items()}
            # backward: each gradient goes back the way its row came (the splits swapped)
            assert measured == {("moe counts", "fwd"): model["counts"],
                                ("moe dispatch", "fwd"): model["dispatch"],
                                ("moe combine", "fwd"): model["combine"],
                                ("moe combine", "bwd"): model["dispatch"],
                                ("moe dispatch", "bwd"): model["combine"]}, (rank, layer)
            assert sum(measured.values()) == model["per_layer_step"]
            for m, s in events.values():  # the OS counter: + one header per peer
                assert s is not None and (s - m) % (ep - 1) == 0
                headers.add((s - m) // (ep - 1))
    assert len(headers) == 1 and 0 < headers.pop() <= 256, headers


@pytest.mark.parametrize("name", list(MESHES))
def test_model_states_equal_the_calculator_with_ep(runs, name):
    cfg, kw = mt.GPTConfig(**CFG), MESHES[name]
    tp, ep, dp = kw.get("tp", 1), kw["ep"], kw["dp"]
    whole = calc.params_per_stage(cfg, tp)[0]  # as one device holds it (per tp rank)
    experts = calc.expert_params_per_stage(cfg)[0]
    assert experts == calc.moe_params(cfg)["experts"]
    # float64 throughout: "adam-fp32" (4, 4, 8) bytes per parameter, times 8/4
    expected = {k: v * 2 for k, v in calc.model_state_bytes(
        whole, dp, 0, "adam-fp32", expert_params=experts, ep=ep).items()}
    for rank, found in enumerate(runs):
        r = found[name]
        assert r["params"] == calc.params_per_rank(cfg, tp, ep=ep) == whole - experts \
            + experts // ep, rank
        states = r["states"]
        assert states["parameters"] == expected["parameters"], rank
        assert states["gradients"] == expected["gradients"], rank
        moments = states["optimizer_state"]["exp_avg"] + states["optimizer_state"]["exp_avg_sq"]
        assert moments == expected["optimizer"], rank
        assert states["optimizer_state"]["step"] == 4 * r["tensors"], rank  # torch's step
    # the experts' share shrinks with ep: ep=4 holds 3/4 of them fewer than ep=1
    gone = runs[0]["ep1"]["states"]["parameters"] - runs[0]["ep4"]["states"]["parameters"]
    assert gone == 8 * experts * 3 // 4
