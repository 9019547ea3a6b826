"""The pictures: each function on small synthetic inputs and on a real launched run.

The assertions read the drawn figure back (its patches, texts and lines), so a
picture that loses a bar, a label or a fitted number fails here.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import minitp as mt  # noqa: E402
from minitp.course import viz  # noqa: E402
from minitp.runtime.trace import Event  # noqa: E402


def ev(rank, op, start, end, phase="fwd", nbytes=1024, label="", peer=None):
    """A synthetic Event (times in seconds)."""
    return Event(rank=rank, op=op, axis="tp" if op != "compute" else "", shape=(nbytes // 4,),
                 dtype="float32", nbytes=nbytes if op != "compute" else 0,
                 model_bytes=nbytes if op != "compute" else 0, start=start, end=end,
                 phase=phase, label=label, peer=peer)


def bars(fig, rank):
    return [p for p in fig.axes[0].patches if p.get_gid() == f"rank{rank}"]


def texts(fig, gid_prefix=""):
    return [t.get_text() for t in fig.axes[0].texts if (t.get_gid() or "").startswith(gid_prefix)]


def legend_labels(fig):
    legend = fig.axes[0].get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


# --------------------------------------------------------------------------- units
@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (16, "16 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (49152, "48 KiB"), (8 << 20, "8 MiB"), (3 << 30, "3 GiB"), (200 * 1024, "200 KiB"),
])
def test_human_bytes(n, text):
    assert viz.human_bytes(n) == text


@pytest.mark.parametrize("s, text", [
    (2.5, "2.5 s"), (0.0035, "3.5 ms"), (42e-6, "42 µs"), (850e-9, "850 ns"), (0.120, "120 ms"),
])
def test_human_seconds(s, text):
    assert viz.human_seconds(s) == text


# --------------------------------------------------------------------------- timeline
def synthetic_trace():
    return [
        ev(0, "compute", 0.000, 0.010, label="attn"),
        ev(0, "all_reduce", 0.010, 0.020, nbytes=4096),
        ev(0, "all_reduce", 0.030, 0.040, phase="bwd", nbytes=4096),
        ev(1, "compute", 0.000, 0.012, label="attn"),
        ev(1, "all_reduce", 0.012, 0.020, nbytes=4096),
        ev(1, "all_reduce", 0.030, 0.040, phase="bwd", nbytes=4096),
        # a sendrecv: a send and a receive that overlap on rank 2
        ev(2, "send", 0.005, 0.015, peer=0),
        ev(2, "recv", 0.005, 0.016, peer=1, nbytes=1024),
    ]


def test_timeline_one_bar_per_event_per_rank():
    trace = synthetic_trace()
    fig = viz.timeline(trace)
    for rank in (0, 1, 2):
        assert len(bars(fig, rank)) == sum(e.rank == rank for e in trace)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert "ms" in ax.get_xlabel()


def test_timeline_labels_say_op_and_bytes():
    fig = viz.timeline(synthetic_trace(), width=14)
    labels = texts(fig, "label-rank0")
    assert "attn" in labels
    assert "all-reduce tp 4 KiB" in labels  # op, axis and size (these events have no layer)
    assert any(t.startswith("send→0") for t in texts(fig, "label-rank2"))
    assert any(t.startswith("recv←1") for t in texts(fig, "label-rank2"))


def test_timeline_colours_by_phase_with_compute_neutral():
    fig = viz.timeline(synthetic_trace())  # has backward events: "auto" colours by phase
    assert legend_labels(fig) == ["compute", "forward", "backward", "neither"][:3]
    colour = {round(p.get_x(), 6): mcolors.to_hex(p.get_facecolor()) for p in bars(fig, 0)}
    region = next(p for p in bars(fig, 0) if round(p.get_x(), 6) == 0.0)
    assert mcolors.to_hex(region.get_edgecolor()) == viz.COMPUTE_COLOR.lower()  # its outline
    assert colour[10.0] == viz.PHASE_COLORS["fwd"].lower()
    assert colour[30.0] == viz.PHASE_COLORS["bwd"].lower()


def test_timeline_outside_either_pass_and_colour_by_op():
    trace = [ev(0, "broadcast", 0.0, 0.001, phase=""), ev(1, "broadcast", 0.0, 0.001, phase="")]
    assert "outside forward/backward" in legend_labels(viz.timeline(trace, color_by="phase"))
    by_op = viz.timeline(synthetic_trace(), color_by="op")
    assert set(legend_labels(by_op)) == {"compute", "all-reduce", "send", "recv"}
    with pytest.raises(ValueError, match="color_by"):
        viz.timeline(trace, color_by="rank")


def test_timeline_stacks_overlapping_events():
    fig = viz.timeline(synthetic_trace())
    send, recv = sorted(bars(fig, 2), key=lambda p: p.get_y())
    assert send.get_y() + send.get_height() <= recv.get_y() + 1e-9  # one above the other
    assert send.get_height() < 0.5  # each in half of the rank's row


def test_timeline_of_a_real_run():
    def work():
        world = mt.world()
        with mt.trace.region("prepare"):
            x = torch.ones(256) * world.rank
        y = mt.comm.all_reduce(x, world)
        z = mt.comm.all_gather(y, world)
        buffer = torch.empty_like(x)
        mt.comm.sendrecv(x, world.next, buffer, world.prev)
        return z.sum().item()

    run = mt.launch(work, 3)
    fig = viz.timeline(run)
    for rank in range(3):
        mine = [e for e in run.trace if e.rank == rank]
        assert len(mine) == 5  # compute, all-reduce, all-gather, send, recv
        assert len(bars(fig, rank)) == len(mine)
    # no backward pass in this run, so "auto" colours by op
    assert set(legend_labels(fig)) == {"compute", "all-reduce", "all-gather", "send", "recv"}
    assert "3 ranks" in fig.axes[0].get_title(loc="left")
    assert plt.get_fignums() == []  # nothing left open in pyplot


def test_timeline_rejects_nothing_to_draw():
    with pytest.raises(ValueError):
        viz.timeline([])


# --------------------------------------------------------------------------- before / after
def cell_patches(fig, gid):
    return [p for p in fig.axes[0].patches if p.get_gid() == gid]


def test_before_after_all_gather_colours_each_piece_by_its_rank():
    before = [np.array([10.0 * (r + 1), 10.0 * (r + 1) + 1]) for r in range(3)]
    after = [np.concatenate(before)] * 3
    fig = viz.before_after(before, after, op="all-gather")
    for r in range(3):
        assert len(cell_patches(fig, f"before{r}")) == 2
        assert len(cell_patches(fig, f"after{r}")) == 6
    # after: cells 0-1 in rank 0's tint, 2-3 rank 1's, 4-5 rank 2's
    cells = sorted(cell_patches(fig, "after1"), key=lambda p: p.get_x())
    for j, cell in enumerate(cells):
        tint = viz._tint(viz.rank_color(j // 2))
        assert mcolors.to_hex(cell.get_facecolor()) == mcolors.to_hex(tint)
    values = texts(fig, "after2")
    assert values == ["10", "11", "20", "21", "30", "31"]
    assert {"before", "after", "all-gather"} <= set(t.get_text() for t in fig.axes[0].texts)
    assert "rank 2's data" in legend_labels(fig)


def test_before_after_marks_sums_with_a_strip_of_contributors():
    before = [torch.arange(4.0) + 10 * (r + 1) for r in range(4)]
    total = sum(before)
    after = [total.clone() for _ in range(4)]
    fig = viz.before_after(before, after, op="all-reduce")
    strips = [p for p in fig.axes[0].patches if p.get_gid() == "after0-strip"]
    assert len(strips) == 4 * 4  # 4 cells, each with one segment per rank
    assert texts(fig, "after3") == ["100", "104", "108", "112"]
    assert any("sum" in label for label in legend_labels(fig))


def test_before_after_2d_none_and_explicit_origin():
    before = [np.arange(6.0).reshape(2, 3), None]
    after = [np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(2, 3)]
    origin = [np.zeros((2, 3), dtype=int), [[0, 0, 0], [None, None, None]]]
    fig = viz.before_after(before, after, op="send 0→1", origin=origin)
    assert len(cell_patches(fig, "before0")) == 6
    assert "(nothing yet)" in texts(fig, "before1")
    row = sorted(cell_patches(fig, "after1"), key=lambda p: (p.get_y(), p.get_x()))
    assert mcolors.to_hex(row[0].get_facecolor()) == mcolors.to_hex(viz._tint(viz.rank_color(0)))
    assert mcolors.to_hex(row[5].get_facecolor()) == "#ffffff"  # origin None: left white


def test_before_after_of_a_real_reduce_scatter():
    def work():
        world = mt.world()
        x = torch.arange(4.0) + 10 * (world.rank + 1)
        return x, mt.comm.reduce_scatter(x, world)

    run = mt.launch(work, 2)
    before, after = [r[0] for r in run], [r[1] for r in run]
    fig = viz.before_after(before, after, op="reduce-scatter")
    assert texts(fig, "after0") == ["30", "32"] and texts(fig, "after1") == ["34", "36"]
    assert len([p for p in fig.axes[0].patches if p.get_gid() == "after1-strip"]) == 2 * 2


def test_before_after_checks_its_input():
    with pytest.raises(ValueError, match="ranks"):
        viz.before_after([np.ones(2)], [np.ones(2), np.ones(2)])
    with pytest.raises(ValueError, match="1-D or 2-D"):
        viz.before_after([np.ones((2, 2, 2))], [np.ones(2)])


def test_before_after_formats_non_integers():
    fig = viz.before_after([np.array([0.5, 1.25])], [np.array([0.5, 1.25])])
    assert texts(fig, "before0") == ["0.5", "1.25"]


# --------------------------------------------------------------------------- bandwidth
def test_fit_alpha_beta_recovers_an_exact_model():
    sizes = 2.0 ** np.arange(10, 24)
    fit = viz.fit_alpha_beta(sizes, 50e-6 + sizes * 2e-9)
    assert fit.alpha == pytest.approx(50e-6, rel=1e-9)
    assert fit.beta == pytest.approx(2e-9, rel=1e-9)
    assert fit.bandwidth == pytest.approx(5e8)
    assert "α = 50 µs" in str(fit) and "β = 2 ns/B" in str(fit)


def test_fit_alpha_beta_needs_pairs():
    with pytest.raises(ValueError):
        viz.fit_alpha_beta([1024], [1e-4])


def test_bandwidth_draws_points_fit_and_numbers():
    sizes = 2.0 ** np.arange(10, 24, 2)
    rng = np.random.default_rng(0)
    t2 = (40e-6 + sizes * 1e-9) * (1 + 0.05 * rng.random(sizes.size))
    t4 = (90e-6 + sizes * 1.5e-9) * (1 + 0.05 * rng.random(sizes.size))
    fig = viz.bandwidth(sizes, {"world 2": t2, "world 4": t4})
    ax = fig.axes[0]
    gids = {line.get_gid(): line for line in ax.get_lines()}
    assert set(gids) == {"points-world 2", "fit-world 2", "points-world 4", "fit-world 4"}
    assert np.allclose(gids["points-world 4"].get_ydata(), t4)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = legend_labels(fig)
    fit2 = viz.fit_alpha_beta(sizes, t2)
    assert f"world 2: fit {fit2}" in labels
    assert sum("α =" in label for label in labels) == 2


def test_bandwidth_with_a_given_fit_or_none():
    sizes = [1024, 4096, 16384]
    given = viz.AlphaBeta(1e-4, 1e-9)
    fig = viz.bandwidth(sizes, [1e-4, 1.1e-4, 1.2e-4], fit=given, label="mine")
    fit_line = [line for line in fig.axes[0].get_lines() if line.get_gid() == "fit-mine"][0]
    assert np.allclose(fit_line.get_ydata(), given.predict(fit_line.get_xdata()))
    fig = viz.bandwidth(sizes, [1e-4, 1.1e-4, 1.2e-4], fit=False)
    assert [line.get_gid() for line in fig.axes[0].get_lines()] == ["points-measured"]


def test_an_all_to_all_has_its_own_colour_and_name():
    fig = viz.timeline([ev(0, "all_to_all", 0.0, 0.002), ev(1, "all_to_all", 0.0, 0.002)],
                       color_by="op")
    assert legend_labels(fig) == ["all-to-all"]
    (bar,) = bars(fig, 0)
    assert mcolors.to_hex(bar.get_facecolor()) == viz.OP_COLORS["all_to_all"].lower()
