"""The pictures of lessons 04, 05 and 07: bytes on the wire per part of the model, activation
memory against t, dropout masks rank by rank, and the memory-time trade-off.

Each function on small synthetic inputs (and `wire_bytes` on a real launched step);
the assertions read the drawn figure back, so a lost bar, point or label fails here.
"""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import minitp as mt  # noqa: E402
from minitp.course import viz  # noqa: E402
from minitp.runtime.trace import Event  # noqa: E402


def ev(op, label, phase, wire, rank=0):
    return Event(rank=rank, op=op, axis="tp", shape=(wire // 4,), dtype="float32",
                 nbytes=wire, model_bytes=wire, start=0.0, end=1e-3, phase=phase, label=label)


def patches(fig, prefix):
    return [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith(prefix)]


def texts(fig, prefix):
    return {t.get_gid(): t.get_text() for t in fig.axes[0].texts
            if (t.get_gid() or "").startswith(prefix)}


# --------------------------------------------------------------------------- wire_bytes
TP = [ev("all_reduce", "embedding", "fwd", 400), ev("all_reduce", "layer0", "fwd", 1000),
      ev("all_reduce", "layer0", "fwd", 1000), ev("all_reduce", "layer0", "bwd", 1000),
      ev("all_reduce", "layer0", "bwd", 1000), ev("all_reduce", "loss", "fwd", 12),
      ev("all_reduce", "layer0", "fwd", 999, rank=1)]  # another rank: not counted
SP = [ev("reduce_scatter", "embedding", "fwd", 200), ev("all_gather", "embedding", "bwd", 200),
      ev("all_gather", "layer0.attn", "fwd", 1000), ev("reduce_scatter", "layer0", "fwd", 1000),
      ev("all_gather", "layer0", "bwd", 1000), ev("reduce_scatter", "layer0", "bwd", 1000),
      ev("all_reduce", "loss", "fwd", 12), ev("all_reduce", "sequence-parallel grads", "bwd", 64)]


def test_wire_bytes_stacks_each_label_and_writes_totals():
    fig = viz.wire_bytes({"TP": TP, "TP + SP": SP})
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["embedding", "layer0", "loss", "sequence-parallel\ngrads"]  # long: wrapped
    steps = np.diff(fig.axes[0].get_yticks())
    assert len(set(steps)) == 1 and np.log2(steps[0]).is_integer()  # 0, 1 KiB, 2 KiB, ...
    totals = texts(fig, "total-")
    assert totals["total-TP-layer0"] == totals["total-TP + SP-layer0"] == viz.human_bytes(2000 * 2)
    assert totals["total-TP-sequence-parallel grads"] == "0"
    assert totals["total-TP + SP-sequence-parallel grads"] == "64 B"
    # layer0 with SP: 4 segments (2 ops x 2 passes; "layer0.attn" counts towards layer0)
    segments = patches(fig, "bar-TP + SP-layer0")
    assert len(segments) == 4 and sum(p.get_height() for p in segments) == 4000
    assert sum(1 for p in segments if p.get_hatch()) == 2  # the backward ones
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert {"all-reduce", "reduce-scatter", "all-gather", "hatched: backward"} <= set(legend)


def test_wire_bytes_chosen_labels_and_bad_input():
    fig = viz.wire_bytes({"TP": TP}, labels=["layer0"], rank=1)
    assert texts(fig, "total-")["total-TP-layer0"] == "999 B"
    with pytest.raises(ValueError):
        viz.wire_bytes({})
    with pytest.raises(ValueError):
        viz.wire_bytes({"TP": TP}, rank=5)


def _step(sequence_parallel):
    mesh = mt.Mesh(tp=mt.world().size)
    torch.manual_seed(0)
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=8)
    model = mt.parallelize(mt.GPT(cfg), mesh, sequence_parallel=sequence_parallel)
    x = torch.randint(0, 16, (2, 8))
    return mt.train_step(model, (x, x), mesh, torch.optim.SGD(model.parameters(), lr=0.1))


def test_wire_bytes_says_model_or_measured():
    fig = viz.wire_bytes({"TP": TP})  # synthetic events carry no measurement
    assert "ring model" in fig.axes[0].get_ylabel()
    with pytest.raises(ValueError, match="no measured bytes"):
        viz.wire_bytes({"TP": TP}, source="measured")
    measured = [dataclasses.replace(e, sent_bytes=e.model_bytes + 40) for e in TP]
    fig = viz.wire_bytes({"TP": measured})
    assert "measured" in fig.axes[0].get_ylabel()
    assert texts(fig, "total-")["total-TP-embedding"] == "440 B"
    fig = viz.wire_bytes({"TP": measured}, source="model")
    assert texts(fig, "total-")["total-TP-embedding"] == "400 B"


def test_wire_bytes_of_real_steps_equal_per_layer():
    runs = {"TP": mt.launch(_step, 2, False), "TP + SP": mt.launch(_step, 2, True)}
    fig = viz.wire_bytes(runs, source="model")  # the ring model: SP moves TP's bytes
    totals = texts(fig, "total-")
    assert totals["total-TP-layer0"] == totals["total-TP + SP-layer0"] != "0"
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[:2] == ["embedding", "layer0"] and "sequence-parallel\ngrads" in ticks


# --------------------------------------------------------------------------- memory_vs_t
def test_memory_vs_t_draws_measured_points_and_formula_lines():
    fig = viz.memory_vs_t([1, 2, 4], {"TP": [100, 70, 55], "TP + SP": [100, 50, 25]},
                          {"TP": [90, 65, 52]})
    lines = {line.get_gid(): line for line in fig.axes[0].lines}
    assert set(lines) == {"measured-TP", "measured-TP + SP", "formula-TP"}
    assert list(lines["measured-TP + SP"].get_ydata()) == [100, 50, 25]
    assert list(lines["formula-TP"].get_xdata()) == [1, 2, 4]
    assert lines["measured-TP"].get_color() == lines["formula-TP"].get_color()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "4"]
    with pytest.raises(ValueError):
        viz.memory_vs_t([1, 2], {"TP": [1, 2, 3]})


# --------------------------------------------------------------------------- masks
def test_masks_one_image_per_rank_and_panel_with_a_verdict():
    same = np.array([[True, False], [False, True]])
    fig = viz.masks({"replicated": [same, same.copy()],
                     "sharded": [torch.tensor([[True, True]]), torch.tensor([[False, True]])]})
    assert len(fig.axes) == 4  # 2 ranks x 2 panels
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["replicated\n(the same on every rank)",
                      "sharded\n(different on every rank)"]
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 4
    assert np.array_equal(images[0].get_array(), same)
    with pytest.raises(ValueError):
        viz.masks({})


# --------------------------------------------------------------------------- tradeoff
def test_tradeoff_places_every_setting_of_every_series():
    points = {"this run": {"TP": (1.0, 1.0), "full": (0.1, 1.33)},
              "paper": {"TP": (1.0, 1.0), "full": (0.08, 1.39), "SP": (0.67, 0.97)}}
    fig = viz.tradeoff(points, baseline="TP")
    ax = fig.axes[0]
    offsets = {c.get_gid(): tuple(c.get_offsets()[0]) for c in ax.collections}
    assert offsets["point-paper-full"] == pytest.approx((0.08, 1.39))
    assert offsets["point-this run-TP"] == (1.0, 1.0)
    assert len(offsets) == 5
    labels = {t.get_gid(): t.get_text() for t in ax.texts}
    assert labels == {"text-TP": "TP", "text-full": "full", "text-SP": "SP"}  # each named once
    assert ax.texts[0].xy == (1.0, 1.0)  # beside the first series' point
    assert "TP" in ax.get_xlabel() and "TP" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["this run", "paper"]
    joined = [line for line in ax.lines if len(line.get_xdata()) == 2]
    assert len(joined) == 2  # TP and full appear in both series
    with pytest.raises(ValueError):
        viz.tradeoff({})
