"""viz.tradeoff_panels: a paper's times, FLOPs and CPU times on separate, labelled panels."""

import pytest

from minitp.course import viz


def test_tradeoff_panels_keeps_each_source_on_its_own_axes():
    panels = {
        "paper": {"points": {"TP": (1.0, 1.0), "full": (0.08, 1.39)},
                  "x": "memory (Table 2)", "y": "time (Table 4)"},
        "this run, CPU": {"points": {"TP": (1.0, 1.0), "full": (0.06, 1.6), "SP": (0.8, 1.5)},
                          "x": "memory (measured)", "y": "time (measured, CPU)"},
    }
    fig = viz.tradeoff_panels(panels, title="trade-off")
    paper, cpu = fig.axes
    assert paper.get_ylabel() == "time (Table 4)" and cpu.get_ylabel() == "time (measured, CPU)"
    assert paper.get_title(loc="left") == "paper"
    offsets = {c.get_gid(): tuple(c.get_offsets()[0]) for ax in fig.axes for c in ax.collections}
    assert offsets["point-paper-full"] == pytest.approx((0.08, 1.39))
    assert offsets["point-this run, CPU-SP"] == pytest.approx((0.8, 1.5))
    assert len([g for g in offsets if g.startswith("point-paper-")]) == 2  # nothing leaks across
    assert not any(ax.texts for ax in fig.axes)  # names in the legend: no labels to overlap
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["TP", "full", "SP"]  # every setting once, in order of appearance
    colours = {c.get_gid(): tuple(c.get_facecolor()[0]) for ax in fig.axes for c in ax.collections}
    assert colours["point-paper-full"] == colours["point-this run, CPU-full"]
    with pytest.raises(ValueError):
        viz.tradeoff_panels({})
    with pytest.raises(ValueError):
        viz.tradeoff_panels({"empty": {"points": {}}})
