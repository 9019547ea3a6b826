"""The pictures of lesson 16: `viz.step_split`, `viz.scaling_efficiency`, `viz.speedup`.

As in test_viz.py, the assertions read the drawn figure back (its patches,
lines and texts, found by gid), so a picture that loses a bar, a point or a
ceiling fails here.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import pytest  # noqa: E402

from minitp.course import viz  # noqa: E402


def by_gid(fig, prefix, kind="patches"):
    found = []
    for ax in fig.axes:
        found += [a for a in getattr(ax, kind) if (a.get_gid() or "").startswith(prefix)]
    return found


def text(fig, gid):
    found = [t.get_text() for ax in fig.axes for t in ax.texts if t.get_gid() == gid]
    assert len(found) == 1, f"{gid}: {found}"
    return found[0]


# --------------------------------------------------------------------------- step_split
PANELS = {
    "weak": {"t=1": {"compute": 0.060, "waiting": 0.0, "transfer": 0.0},
             "t=2": {"compute": 0.060, "waiting": 0.010, "transfer": 0.030}},
    "strong": {"t=1": {"compute": 0.060, "waiting": 0.0, "transfer": 0.0},
               "t=2": {"compute": 0.030, "waiting": 0.0, "transfer": 0.030}},
}


def test_step_split_stacks_every_part_and_writes_the_share():
    fig = viz.step_split(PANELS)
    assert len(fig.axes) == 2
    for panel, bars in PANELS.items():
        for label, split in bars.items():
            bottom = 0.0
            for part, seconds in split.items():
                (bar,) = by_gid(fig, f"part-{panel}-{label}-{part}")
                assert bar.get_y() == pytest.approx(bottom)
                assert bar.get_height() == pytest.approx(seconds)
                bottom += seconds
    assert text(fig, "share-weak-t=2").endswith("40% comm.")
    assert text(fig, "share-weak-t=2").startswith("100 ms")
    assert text(fig, "share-strong-t=2").endswith("50% comm.")
    assert text(fig, "share-weak-t=1").endswith("0% comm.")
    (compute,) = by_gid(fig, "part-weak-t=1-compute")
    (transfer,) = by_gid(fig, "part-weak-t=2-transfer")
    (waiting,) = by_gid(fig, "part-weak-t=2-waiting")
    assert mcolors.to_hex(compute.get_facecolor()) == viz.COMPUTE_COLOR.lower()
    assert mcolors.to_hex(transfer.get_facecolor()) == viz.SPLIT_COLORS["transfer"].lower()
    assert mcolors.to_hex(waiting.get_facecolor()) == viz.SPLIT_COLORS["waiting"].lower()


def test_step_split_refuses_empty_and_negative():
    with pytest.raises(ValueError):
        viz.step_split({})
    with pytest.raises(ValueError, match="negative"):
        viz.step_split({"p": {"t=1": {"compute": -1.0}}})


# --------------------------------------------------------------------------- scaling_efficiency
def test_scaling_efficiency_pairs_a_prediction_with_its_published_number():
    fig = viz.scaling_efficiency(
        {"V100": {1: 1.0, 2: 0.97, 8: 0.88}, "H100": {1: 1.0, 8: 0.69}},
        published={"V100": {2: 0.96, 8: 0.77}})
    ax = fig.axes[0]
    (line,) = by_gid(fig, "series-V100", "lines")
    assert list(line.get_xdata()) == [1, 2, 8]
    assert list(line.get_ydata()) == pytest.approx([100, 97, 88])
    (published,) = by_gid(fig, "published-V100", "lines")
    assert list(published.get_ydata()) == pytest.approx([96, 77])
    assert line.get_color() == published.get_color()  # one setting, one colour
    (other,) = by_gid(fig, "series-H100", "lines")
    assert other.get_color() != line.get_color()
    assert text(fig, "value-V100-8") == "77%"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["V100: predicted", "H100: predicted", "V100: published"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "8"]


def test_scaling_efficiency_needs_something():
    with pytest.raises(ValueError):
        viz.scaling_efficiency({})


# --------------------------------------------------------------------------- speedup
def test_speedup_draws_the_law_its_ceiling_and_the_points():
    fig = viz.speedup({"re-run": 0.28}, points={"re-run": {1: 1.0, 4: 1.88, 8: 1.92},
                                                "ours": {1: 1.0, 2: 0.8, 4: 0.3}},
                      lines={"model": {1: 1.0, 8: 3.9}})
    ax = fig.axes[0]
    (law,) = by_gid(fig, "law-re-run", "lines")
    xs, ys = law.get_xdata(), law.get_ydata()
    assert xs[0] == pytest.approx(2) and xs[-1] == pytest.approx(8)
    assert ys == pytest.approx(1 / (0.28 + 1 / xs))
    (ceiling,) = by_gid(fig, "ceiling-re-run", "lines")
    assert ceiling.get_ydata()[0] == pytest.approx(1 / 0.28)
    assert text(fig, "ceiling-text-re-run") == "ceiling 1/c = 3.6"
    (points,) = by_gid(fig, "points-re-run", "lines")
    assert points.get_color() == law.get_color()
    assert list(points.get_ydata()) == pytest.approx([1.0, 1.88, 1.92])
    assert by_gid(fig, "line-model", "lines")
    low, high = ax.get_ylim()
    assert low <= 0.3 and high >= 8  # every point is inside the axes


def test_speedup_leaves_out_a_ceiling_above_the_axes():
    fig = viz.speedup({"tiny overhead": 0.01})
    assert not by_gid(fig, "ceiling-tiny", "lines")


def test_speedup_refuses_nonsense():
    with pytest.raises(ValueError):
        viz.speedup()
    with pytest.raises(ValueError, match="positive"):
        viz.speedup({"x": 0.0})
