"""Lesson 17's pictures: `viz.memory_and_time` and `viz.plan_candidates` draw the numbers
they are given (bars and points found by their gid)."""

from __future__ import annotations

import pytest

import minitp as mt
import minitp.calc as calc
from minitp.course import viz

GiB = 2**30


def test_memory_and_time_stacks_every_part():
    memory = {"a": {"parameters": 2 * GiB, "gradients": 4 * GiB, "optimizer": 12 * GiB,
                    "activations": 30 * GiB, "total": 48 * GiB},
              "b": {"parameters": GiB, "gradients": GiB, "optimizer": GiB, "activations": GiB}}
    time = {"a": {"compute": 20.0, "tp": 2.0, "pp": 0.1, "dp": 0.2, "bubble": 1.5, "total": 23.8},
            "b": {"compute": 1.0, "tp": 0.0, "pp": 0.0, "dp": 0.0, "bubble": 0.0}}
    fig = viz.memory_and_time(memory, time, capacity=80 * GiB, limit=72 * GiB, title="t")
    ax_mem, ax_time = fig.axes
    bars = {p.get_gid(): p for p in ax_mem.patches}
    assert bars["memory-a-optimizer"].get_height() == pytest.approx(12)
    assert bars["memory-a-activations"].get_y() == pytest.approx(18)  # stacked on the others
    assert "memory-a-total" not in bars
    bars = {p.get_gid(): p for p in ax_time.patches}
    assert bars["time-a-bubble"].get_y() == pytest.approx(22.3)
    assert bars["time-b-compute"].get_height() == pytest.approx(1.0)
    assert {line.get_gid() for line in ax_mem.lines} == {"line-GPU memory", "line-usable"}
    texts = [t.get_text() for t in ax_mem.texts]
    assert "48.0" in texts and "usable 72" in texts
    assert [t.get_text() for t in ax_time.get_xticklabels()] == ["a", "b"]
    no_lines = viz.memory_and_time({"a": memory["a"]}, {"a": time["a"]})
    assert not no_lines.axes[0].lines
    with pytest.raises(ValueError, match="same settings"):
        viz.memory_and_time(memory, {"a": time["a"]})


def test_plan_candidates_draws_every_fit():
    cfg = mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=24, n_head=24, d_model=2304)
    plan = calc.plan(cfg, calc.A100_80GB, global_batch=64, n_gpus=16)
    other = plan.candidates[-1]
    fig = viz.plan_candidates(plan, highlight={"slowest": other})
    ax = fig.axes[0]
    drawn = sum(len(c.get_offsets()) for c in ax.collections
                if c.get_gid() and c.get_gid().startswith("tp"))
    assert drawn == len(plan.candidates)
    (best,) = [c for c in ax.collections if c.get_gid() == "best"]
    assert tuple(best.get_offsets()[0]) == pytest.approx(
        (plan.best.memory["total"] / GiB, plan.best.time.total))
    assert any(c.get_gid() == "highlight-slowest" for c in ax.collections)
    with pytest.raises(ValueError, match="no configuration fits"):
        viz.plan_candidates(calc.plan(mt.GPTConfig(vocab_size=51200, seq_len=2048, n_layer=96,
                                                   n_head=96, d_model=12288),
                                      calc.A100_80GB, global_batch=8, n_gpus=8))
