"""mt.viz.pipeline_gantt: one box per forward/backward unit, idle shaded, bubble in the title."""

import pytest
import torch

import minitp as mt
from minitp.course.viz.pipeline import pipeline_units
from minitp.runtime.trace import Event


def _unit(rank, label, start, end, phase):
    return Event(rank=rank, op="compute", axis="", shape=(), dtype="", nbytes=0, model_bytes=0,
                 start=start, end=end, phase=phase, label=label)


def _gpipe_on_paper(p=2, m=2):
    """Events of a GPipe step with unit-length ticks, from the schedule's own clock."""
    events = []
    for r in range(p):
        for i in range(m):
            events.append(_unit(r, f"F{i}", r + i, r + i + 1, "fwd"))
            b = m + p - 1 + (p - 1 - r) + i
            events.append(_unit(r, f"B{i}", b, b + 1, "bwd"))
    return events


def test_bubble_of_a_gpipe_step_is_the_formula():
    p, m = 2, 2
    assert mt.viz.pipeline_bubble(_gpipe_on_paper(p, m)) == pytest.approx((p - 1) / m)


def test_gantt_draws_one_box_per_unit_and_prints_the_bubble():
    events = _gpipe_on_paper(2, 2)
    noise = _unit(0, "embedding grads", 9, 10, "bwd")  # not a unit: ignored
    fig = mt.viz.pipeline_gantt(events + [noise], title="GPipe")
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if p.get_gid()]
    assert sorted(b.get_gid() for b in boxes) == sorted(e.label for e in events)
    assert "measured bubble 50.0%" in ax.get_title(loc="left")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]


def test_gantt_of_a_real_1f1b_run():
    def step():
        mesh = mt.Mesh(pp=2)
        model = mt.parallelize(mt.GPT(mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=2,
                                                   n_head=2, d_model=8)), mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randint(0, 16, (4, 8))
        return mt.train_step(model, (x, x), mesh, opt, schedule="1f1b", microbatches=4)

    run = mt.launch(step, 2, timeout=60)
    units = pipeline_units(run)
    assert len(units) == 2 * 4 * 2
    fig = mt.viz.pipeline_gantt(run)
    assert "bubble" in fig.axes[0].get_title(loc="left")


def test_gantt_without_units_raises():
    with pytest.raises(ValueError, match="no forward/backward units"):
        mt.viz.pipeline_gantt([])
