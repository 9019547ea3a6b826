"""minitp.calc against minitp's own measurements (issue 5, item 3).

Real launches of a small GPT at tp = 2 and 4; the calculator must give exactly
what they measure:

* parameters per rank = the parallelized model's parameters on every rank, and
  model-state bytes = what `minitp.memory.measure_model_states` reads from the
  tensors after an Adam step (with Adam's step counters, 4 bytes per parameter
  tensor, as the one documented difference);
* tensor-parallel bytes per layer per microbatch = the wire bytes of the trace's
  events labelled "layerK" (summed over a step, divided by its microbatches), with
  ``bytes_per_value`` read from the trace's dtype; pipeline bytes per stage boundary
  and data-parallel gradient bytes likewise equal the trace's sends on real 3D runs;
* activation bytes per layer = the ActivationLedger's (`minitp.course.labs.activations.
  activation_table`) minus exactly the gap that lab documents item by item
  (`GAP_ITEMS`);
* the bubble: `calc.bubble` against the trace of real pipelined runs is
  tests/pipeline/test_pipeline.py::test_measured_bubble_matches_theory (within 10%); here,
  `calc.bubble`, the first stage's microbatches in flight and `step_time`'s
  bubble against hand-built GPipe, 1F1B and interleaved 1F1B schedules replayed
  as trace events, where the match is exact.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import minitp as mt
import minitp.calc as calc
from minitp import memory
from minitp.course.labs.activations import GAP_ITEMS, activation_table
from minitp.rules import layer_label
from minitp.runtime.trace import Event

CFG = dict(vocab_size=10, seq_len=8, n_layer=2, n_head=4, d_model=16)  # vocab: 3, 4 don't divide
BATCH, MICROBATCHES = 4, 2
TP_SETTINGS = {  # name -> (sequence_parallel, recompute)
    "tp": (False, None), "tp+sp": (True, None), "tp+selective": (False, "selective"),
    "tp+sp+selective": (True, "selective"), "tp+full": (False, "full"),
    "tp+sp+full": (True, "full"),
}
DTYPES = {2: torch.bfloat16, 4: torch.float64}  # the trace's dtype sets the bytes per value


def _bytes_per_value(dtype_name: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


# --------------------------------------------------------------------------- one launch per t
def _measure(tp, dtype):
    """On every rank: parameters of several shards, model states after an Adam step,
    and one train_step per TP_SETTINGS entry, each under a trace label of its name."""
    mesh = mt.Mesh(tp=tp)
    out = {"params": {}}
    for bias in (True, False):
        model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG, bias=bias)), mesh)
        out["params"][bias] = sum(p.numel() for p in model.parameters())
    cfg = mt.GPTConfig(**CFG)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=generator)
    y = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len), generator=generator)
    for name, (sp, recompute) in TP_SETTINGS.items():
        torch.manual_seed(0)
        model = mt.parallelize(mt.GPT(cfg).to(dtype), mesh, sequence_parallel=sp,
                               recompute=recompute)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        with mt.trace.label(name):
            mt.train_step(model, (x, y), mesh, optimizer, microbatches=MICROBATCHES)
        if name == "tp":
            out["states"] = memory.measure_model_states(model, optimizer)
            out["tensors"] = len(list(model.parameters()))
            out["element_size"] = next(model.parameters()).element_size()
    return out


@pytest.fixture(scope="module")
def runs():
    return {tp: mt.launch(_measure, tp, tp, DTYPES[tp], timeout=120) for tp in DTYPES}


@pytest.mark.parametrize("tp", list(DTYPES))
def test_params_per_rank_equal_the_shards(runs, tp):
    for bias in (True, False):
        cfg = mt.GPTConfig(**CFG, bias=bias)
        expected = calc.params_per_rank(cfg, tp=tp)
        assert [r["params"][bias] for r in runs[tp]] == [expected] * tp, f"bias={bias}"


@pytest.mark.parametrize("tp", list(DTYPES))
def test_model_states_equal_the_tensors(runs, tp):
    n = calc.params_per_rank(mt.GPTConfig(**CFG), tp=tp)
    for rank, r in enumerate(runs[tp]):
        e, states = r["element_size"], r["states"]
        # Everything in one dtype of e bytes: parameters e, gradients e, Adam's two moments
        # 2e per parameter ("adam-fp32" is this layout for e = 4).
        expected = {k: v * e // 4 for k, v in calc.model_state_bytes(n, optimizer="adam-fp32")
                    .items()}
        assert states["parameters"] == expected["parameters"], rank
        assert states["gradients"] == expected["gradients"], rank
        moments = states["optimizer_state"]["exp_avg"] + states["optimizer_state"]["exp_avg_sq"]
        assert moments == expected["optimizer"], rank
        # the documented difference: torch's Adam keeps a float32 step count per tensor
        assert states["optimizer_state"]["step"] == 4 * r["tensors"], rank
        assert states["optimizer"] == expected["optimizer"] + 4 * r["tensors"], rank


def _layer_events(run, setting: str, layer: int, rank: int):
    return [e for e in run.trace if e.rank == rank and e.label == f"{setting}.{layer_label(layer)}"]


def _check_tp_bytes(run, tp, setting, early_stop):
    sp, recompute = TP_SETTINGS[setting]
    cfg = mt.GPTConfig(**CFG)
    for rank in range(tp):
        for layer in range(cfg.n_layer):
            events = _layer_events(run, setting, layer, rank)
            assert events, (setting, rank, layer)
            (dtype,) = {e.dtype for e in events}
            per_microbatch = Fraction(sum(e.model_bytes for e in events), MICROBATCHES)
            expected = calc.tp_comm_bytes(cfg, BATCH // MICROBATCHES, tp, recompute,
                                          _bytes_per_value(dtype), early_stop=early_stop, sp=sp)
            assert per_microbatch == expected, (setting, rank, layer)
            ops = {e.op for e in events}
            assert ops == ({"all_gather", "reduce_scatter"} if sp else {"all_reduce"})


@pytest.mark.parametrize("tp", list(DTYPES))
@pytest.mark.parametrize("setting", ["tp", "tp+sp", "tp+selective", "tp+sp+selective"])
def test_tp_bytes_per_layer_equal_the_trace(runs, tp, setting):
    # Narayanan et al. §3.3: 8bsh(t−1)/t values per layer per microbatch; with sequence
    # parallelism the same bytes as all-gathers and reduce-scatters.
    _check_tp_bytes(runs[tp], tp, setting, early_stop=False)


@pytest.mark.parametrize("tp", list(DTYPES))
def test_tp_bytes_with_full_recompute(runs, tp):
    # torch's checkpoint stops early: the recomputed forward repeats 1 of the 2 all-reduces
    # (calc's early_stop=True: 5 all-reduces' worth, not Megatron-LM's 6).
    _check_tp_bytes(runs[tp], tp, "tp+full", early_stop=True)
    with pytest.raises(AssertionError):  # and Megatron-LM's count is not what minitp sends
        _check_tp_bytes(runs[tp], tp, "tp+full", early_stop=False)


@pytest.mark.parametrize("tp", list(DTYPES))
def test_tp_bytes_with_sequence_parallel_full_recompute(runs, tp):
    _check_tp_bytes(runs[tp], tp, "tp+sp+full", early_stop=True)


def test_tp_plus_sp_full_recompute_sends_five_and_a_half(runs):
    # under SP, early-stopping recomputation repeats all-gather, reduce-scatter, all-gather
    cfg = mt.GPTConfig(**CFG)
    for tp, run in runs.items():
        for layer in range(cfg.n_layer):
            events = _layer_events(run, "tp+sp+full", layer, 0)
            one = calc.ring_wire_bytes("all_reduce", BATCH // MICROBATCHES * cfg.seq_len
                                       * cfg.d_model * _bytes_per_value(events[0].dtype), tp)
            sent = Fraction(sum(e.model_bytes for e in events), MICROBATCHES)
            assert sent == Fraction(11, 2) * one


# --------------------------------------------------------------------------- activations
ACTIVATION_CFG = mt.GPTConfig(vocab_size=16, seq_len=16, n_layer=2, n_head=4, d_model=32,
                              dropout=0.1)  # dropout > 0: Table 2 counts its masks


def test_activation_bytes_equal_the_ledger_less_the_documented_gap():
    b, cfg = 2, ACTIVATION_CFG
    table = activation_table(cfg, b, tp_sizes=(1, 2, 4))
    settings = {"none": (False, None), **TP_SETTINGS}
    settings["full"] = settings.pop("tp+full")
    del settings["tp+sp+full"]
    seen = set()
    for row in table.rows:
        sp, recompute = settings[row["setting"]]
        t = row["t"]
        predicted = calc.activation_bytes_per_layer(cfg, b, t, sp, recompute)
        assert row["formula"] == predicted, row["setting"]
        # measured = Korthikanti's formula + every item of the gap the lab names, exactly
        assert set(row["explained"]) == set(GAP_ITEMS)
        assert row["measured"] == predicted + sum(row["explained"].values()), row["setting"]
        assert row["unexplained"] == 0, row
        # the whole model: l layers of it (one stage, so activation_bytes is l per-layer values)
        ledger = table.ledgers[(row["setting"], t)]
        layers = ledger.per_layer()
        assert list(layers) == [layer_label(k) for k in range(cfg.n_layer)]
        assert sum(layers.values()) == (calc.activation_bytes(cfg, b, t, sp, recompute)
                                        + cfg.n_layer * sum(row["explained"].values()))
        seen.add((row["setting"], t))
    assert {s for s, _ in seen} == set(settings) and {t for _, t in seen} == {1, 2, 4}


# --------------------------------------------------------------------------- the bubble
# Hand-built schedules: for each stage, its operations in order, ("F" | "B", microbatch,
# model chunk). Forward takes 1 unit, backward 2 (a backward is twice its forward's FLOPs).
def gpipe(p, m):
    """All forwards, then all backwards (Huang et al. 2019)."""
    return [[("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)] for _ in range(p)]


def one_f_one_b(p, m):
    """PipeDream-Flush (Narayanan et al. 2021, Fig. 4 top): stage s warms up with
    p − s − 1 forwards, then alternates one forward and one backward, then drains."""
    stages = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [("F", i, 0) for i in range(warm)]
        forward, backward = warm, 0
        while forward < m:
            ops += [("F", forward, 0), ("B", backward, 0)]
            forward, backward = forward + 1, backward + 1
        stages.append(ops + [("B", i, 0) for i in range(backward, m)])
    return stages


def interleaved(p, m, v):
    """Interleaved 1F1B (Narayanan et al. 2021, Fig. 4 bottom), in Megatron-LM's order:
    forward k runs chunk (k // p) mod v of microbatch p·(k // pv) + k mod p; backwards
    take the chunks in reverse; stage s warms up with 2(p − s − 1) + (v − 1)p forwards."""
    assert m % p == 0, "Megatron-LM's interleaved schedule needs m to be a multiple of p"

    def op(kind, k):
        chunk = (k // p) % v
        return (kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    stages = []
    for s in range(p):
        total = m * v
        warm = min(2 * (p - s - 1) + (v - 1) * p, total)
        ops = [op("F", k) for k in range(warm)]
        forward, backward = warm, 0
        while forward < total:
            ops += [op("F", forward), op("B", backward)]
            forward, backward = forward + 1, backward + 1
        stages.append(ops + [op("B", k) for k in range(backward, total)])
    return stages


def replay(schedule, v=1, forward=Fraction(1), backward=Fraction(2)):
    """Run a schedule: each operation starts when its stage is free and its input has
    arrived (forward: the previous stage's forward of that microbatch and chunk, or
    the last stage's previous chunk; backward: the next stage's, or the first stage's
    next chunk, or the last forward). Returns the trace: one compute Event per operation."""
    p = len(schedule)
    done, position, clock, events = {}, [0] * p, [Fraction(0)] * p, []

    def needs(kind, i, chunk, s):
        if kind == "F":
            return (("F", i, chunk, s - 1) if s else
                    ("F", i, chunk - 1, p - 1) if chunk else None)
        return (("B", i, chunk, s + 1) if s < p - 1 else
                ("B", i, chunk + 1, 0) if chunk < v - 1 else ("F", i, chunk, p - 1))

    progress = True
    while progress:
        progress = False
        for s in range(p):
            while position[s] < len(schedule[s]):
                kind, i, chunk = schedule[s][position[s]]
                wait = needs(kind, i, chunk, s)
                if wait is not None and wait not in done:
                    break
                start = max(clock[s], done[wait] if wait else 0)
                clock[s] = done[(kind, i, chunk, s)] = start + (forward if kind == "F"
                                                                else backward) / v
                events.append(Event(rank=s, op="compute", axis="", shape=(), dtype="",
                                    nbytes=0, model_bytes=0, start=start, end=clock[s],
                                    phase="fwd" if kind == "F" else "bwd",
                                    label=f"microbatch{i}.chunk{chunk}"))
                position[s] += 1
                progress = True
    assert position == [len(ops) for ops in schedule], "the schedule deadlocks"
    return sorted(events, key=lambda e: (e.start, e.rank))


def bubble_from_trace(events):
    """Idle time over busy time, read from compute events: (makespan − busy)/busy on
    every stage (the same on all when the stages are equal)."""
    makespan = max(e.end for e in events) - min(e.start for e in events)
    per_stage = {}
    for e in events:
        per_stage[e.rank] = per_stage.get(e.rank, 0) + (e.end - e.start)
    (fraction,) = {(makespan - busy) / busy for busy in per_stage.values()}
    return fraction


def peak_in_flight(events, rank=0):
    """The most forwards on `rank` whose backward has not run yet."""
    held = peak = 0
    for e in events:
        if e.rank == rank:
            held += 1 if e.phase == "fwd" else -1
            peak = max(peak, held)
    return peak


def test_hand_built_schedules_are_what_the_papers_draw():
    # p = 2, m = 3, written out by hand
    assert one_f_one_b(2, 3) == [
        [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("B", 2, 0)],
        [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0)],
    ]
    # interleaved, p = 2, m = 2, v = 2: stage 0 runs both chunks of both microbatches
    # forward before its first backward (2(p−1) + (v−1)p = 4 warm-up forwards)
    assert interleaved(2, 2, 2)[0] == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("B", 0, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0),
    ]
    for schedule in (gpipe(4, 6), one_f_one_b(4, 6), interleaved(4, 8, 2)):
        for ops in schedule:  # every stage runs every operation exactly once
            assert len(set(ops)) == len(ops)


@pytest.mark.parametrize("p, m", [(1, 4), (2, 4), (4, 8), (8, 8), (8, 3), (4, 16)])
def test_bubble_gpipe_and_1f1b(p, m):
    for schedule in (gpipe(p, m), one_f_one_b(p, m)):
        # calc returns the nearest float of the same fraction: exactly equal
        assert float(bubble_from_trace(replay(schedule))) == calc.bubble(p, m)


@pytest.mark.parametrize("p, m, v", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (8, 16, 2), (4, 4, 4)])
def test_bubble_interleaved(p, m, v):
    assert float(bubble_from_trace(replay(interleaved(p, m, v), v))) == calc.bubble(p, m, v)


@pytest.mark.parametrize("p, m", [(4, 8), (4, 2), (8, 8)])
def test_microbatches_in_flight(p, m):
    # the first stage's peak is what calc.activation_bytes multiplies by
    assert peak_in_flight(replay(one_f_one_b(p, m))) == calc.microbatches_in_flight(p, m)
    assert peak_in_flight(replay(gpipe(p, m))) == calc.microbatches_in_flight(p, m, "gpipe")


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 3)])
def test_interleaved_first_stage_activations(p, v):
    # chunks in flight on stage 0 × l/(pv) layers each = calc's l(1 + (p−1)/(pv)) layers
    layers, m = p * v * 2, 2 * p
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=layers, n_head=2, d_model=8)
    chunks = peak_in_flight(replay(interleaved(p, m, v), v))
    per_layer = calc.activation_bytes_per_layer(cfg, 1)
    assert calc.activation_bytes(cfg, 1, pp=p, virtual=v, microbatches=m) == (
        per_layer * chunks * Fraction(layers, p * v))


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (2, 6, 1)])
def test_step_time_bubble_is_the_replayed_schedules(p, m, v):
    # With free communication, step_time = compute + bubble = the schedule's makespan when
    # each microbatch's forward and backward take step_time's compute / m, split 1 : 2.
    free = calc.Cluster("free links", 8, 312e12, 80 * 2**30, float("inf"), float("inf"), 0, 0)
    cfg = mt.GPTConfig(vocab_size=64, seq_len=32, n_layer=p * v * 2, n_head=4, d_model=64)
    t = calc.step_time(cfg, free, pp=p, global_batch=m, virtual=v)
    assert t.tp == t.pp == t.dp == 0
    schedule = interleaved(p, m, v) if v > 1 else one_f_one_b(p, m)
    unit = Fraction(t.compute) / m / 3
    events = replay(schedule, v, forward=unit, backward=2 * unit)
    makespan = max(e.end for e in events)
    assert float(makespan) == pytest.approx(t.compute + t.bubble, rel=1e-12)


# --------------------------------------------------------------------------- pp and dp bytes
PP_DP_BATCH, PP_DP_MICROBATCHES = 8, 2


def _pp_dp_bytes(dp, pp, tp, sequence_parallel):
    mesh = mt.Mesh(dp=dp, pp=pp, tp=tp)
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=2, n_head=4, d_model=16)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg).double(), mesh, sequence_parallel=sequence_parallel)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 16, (PP_DP_BATCH, 8), generator=generator)
    mt.trace.clear()
    mt.train_step(model, (x, x.roll(-1, 1)), mesh, optimizer, microbatches=PP_DP_MICROBATCHES)
    events = mt.trace.events()
    pipeline = [e for e in events if e.label == "pipeline" and e.op == "send"]
    return {
        "stage": mesh.pp.rank,
        "activations sent": sum(e.model_bytes for e in pipeline if e.phase == "fwd"),
        "gradients sent": sum(e.model_bytes for e in pipeline if e.phase == "bwd"),
        "dp sent": sum(e.model_bytes for e in events if e.label.startswith("dp grads")),
        "local parameters": sum(p.numel() for p in model.parameters()),
        "cfg": cfg,
    }


@pytest.mark.parametrize("dp, pp, tp, sp", [(2, 2, 1, False), (1, 2, 2, True)])
def test_pp_and_dp_bytes_equal_the_trace(dp, pp, tp, sp):
    # Narayanan et al. §3.3: bsh values per stage boundary per microbatch, each way
    # (1/t of them per rank under sequence parallelism); data parallelism all-reduces
    # every local gradient once: 2(d-1)/d of their bytes. float64: 8 bytes a value.
    run = mt.launch(_pp_dp_bytes, dp * pp * tp, dp, pp, tp, sp, timeout=120)
    micro_batch = PP_DP_BATCH // (dp * PP_DP_MICROBATCHES)
    for rank, got in enumerate(run):
        boundary = calc.pp_comm_bytes(got["cfg"], micro_batch, tp, sp, bytes_per_value=8)
        first, last = got["stage"] == 0, got["stage"] == pp - 1
        assert got["activations sent"] == (0 if last else PP_DP_MICROBATCHES * boundary), rank
        assert got["gradients sent"] == (0 if first else PP_DP_MICROBATCHES * boundary), rank
        expected_dp = calc.dp_comm_bytes(got["local parameters"], dp, bytes_per_value=8)
        assert got["dp sent"] == expected_dp, rank
