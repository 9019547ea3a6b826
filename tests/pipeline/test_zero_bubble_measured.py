"""The zero-bubble schedules' bubbles measured on real ranks against the paper's formulas,
with the unit-cost model: every forward, every B and every W of a stage is given the same
cost by a sleep (as lesson 09 sets its costs; a whole backward sleeps B + W), so the trace
measures the order, the waits and the idle, and the formulas (Qi et al. 2024, with
F = B = W) predict them. p = 4, m = 8:

* 1F1B: idle (p−1)(F+B+W), bubble (p−1)/m = 0.375 of the busy time;
* ZB-H1: idle (p−1)(F+B−W), bubble (p−1)/(3m) = 0.125;
* ZB-H2: no idle inside any rank's span (its stages start and end p−1 units apart).

What the unit-cost model leaves out, on two shared CPU cores: each unit's real compute on
top of its sleep, the latency of every message between stages, and a sleeping rank woken
late. They only add idle; the tolerance below (+0.1 of the busy time over the formula)
is that margin, and the schedules' order between them is asserted strictly. Two runs on
the 2-core machine (2026-11-26) measured 1F1B 0.40–0.44, ZB-H1 0.12–0.16 and ZB-H2's
inner idle 0.01–0.04 of the busy time.
"""

import time

import torch

import minitp as mt
from minitp.course.viz.pipeline import pipeline_units
from minitp.rules import parse_unit_label

UNIT = 0.02  # SET: seconds of sleep per forward, per B and per W of one stage
P, M = 4, 8
CFG = dict(vocab_size=16, seq_len=8, n_layer=4, n_head=2, d_model=8)
MARGIN = 0.1


def _timed(schedule):
    import minitp.weight_grad as weight_grad

    mesh = mt.Mesh(pp=P)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)), mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randint(0, 16, (M, 8))
    mt.train_step(model, (x, x), mesh, optimizer, schedule=schedule, microbatches=M)  # warm
    split = schedule.startswith("zb")
    run = weight_grad.DeferredWeightGrads.run

    def sleepy_run(self):  # W: one unit
        time.sleep(UNIT)
        run(self)

    weight_grad.DeferredWeightGrads.run = sleepy_run
    for chunk in model.chunks:
        def after_forward(_, __, output):
            time.sleep(UNIT)  # F: one unit
            out, loss = output
            # B: one unit, or B + W for a whole backward
            (loss if loss is not None else out).register_hook(
                lambda grad: time.sleep(UNIT if split else 2 * UNIT))

        chunk.register_forward_hook(after_forward)
    mt.trace.clear()
    mt.train_step(model, (x, x), mesh, optimizer, schedule=schedule, microbatches=M)
    return [e for e in mt.trace.events() if e.op == "compute"]


def _bubbles(events):
    """(global, inner) per rank: idle / busy within the span of every rank's units, and
    within this rank's own first to last unit."""
    units = pipeline_units(events)
    start, end = min(e.start for e in units), max(e.end for e in units)
    out = []
    for r in sorted({e.rank for e in units}):
        mine = [e for e in units if e.rank == r]
        busy = sum(e.end - e.start for e in mine)
        inner = max(e.end for e in mine) - min(e.start for e in mine) - busy
        out.append(((end - start - busy) / busy, inner / busy))
    return out


def _run_all():
    return {s: _timed(s) for s in ("1f1b", "zb-h1", "zb-h2")}


def test_measured_bubbles_match_the_unit_cost_formulas():
    run = mt.launch(_run_all, P, timeout=120)
    measured = {s: _bubbles([e for rank in run for e in rank[s]]) for s in run[0]}
    kinds = {s: {parse_unit_label(e.label)[0] for rank in run for e in pipeline_units(rank[s])}
             for s in run[0]}
    assert kinds == {"1f1b": {"F", "B"}, "zb-h1": {"F", "B", "W"}, "zb-h2": {"F", "B", "W"}}
    one_f_one_b = max(g for g, _ in measured["1f1b"])
    h1 = max(g for g, _ in measured["zb-h1"])
    h2_inner = max(i for _, i in measured["zb-h2"])
    report = f"measured: 1F1B {one_f_one_b:.3f}, ZB-H1 {h1:.3f}, ZB-H2 inner {h2_inner:.3f}"
    assert (P - 1) / M - 0.02 <= one_f_one_b <= (P - 1) / M + MARGIN, report
    assert (P - 1) / (3 * M) - 0.02 <= h1 <= (P - 1) / (3 * M) + MARGIN, report
    assert h2_inner <= MARGIN, report
    assert h1 < one_f_one_b and h2_inner < h1, report
