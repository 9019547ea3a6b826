"""minitp.course.labs.serving_roofline: lesson 18's figure keeps the GPU model and this
machine's measurement on panels of their own, and every point label readable."""

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import minitp.calc as calc
from minitp.course.labs.serving_roofline import roofline

MEASURED = {1: {1: 223.0, 4: 668.0, 16: 2357.0, 64: 5595.0}, 2: {1: 30.0, 4: 129.0}}


@pytest.fixture(scope="module")
def fig():
    return roofline(MEASURED)


def test_the_model_and_the_measurement_never_share_a_panel(fig):
    _, model, measured = fig.axes
    assert [line.get_label() for line in measured.lines] == [
        "MEASURED here, tp=1", "MEASURED here, tp=2"]
    assert all(line.get_label().startswith("MODEL") for line in model.lines)
    # the model in its own units, not scaled to meet the measured tp=1 at B=1
    step = calc.decode_step_time(calc.LLAMA3_8B, calc.H100_80GB, 1, 1)
    assert model.lines[0].get_ydata()[0] == pytest.approx(step.tokens_per_second)
    assert "MEASURED" in measured.get_ylabel() and "MODEL" in model.get_ylabel()


def test_every_point_is_labelled_once_and_no_label_covers_another(fig):
    left = fig.axes[0]
    canvas = FigureCanvasAgg(fig)  # the notebook's renderer: the PNG it shows
    canvas.draw()
    renderer = canvas.get_renderer()
    for series in ("context1", "context4096"):
        named = [t.get_text() for t in left.texts if t.get_gid() == f"label-{series}"]
        batches = [b for text in named for b in text.removeprefix("B=").split(", ")]
        assert sorted(map(int, batches)) == [1, 4, 16, 64, 256, 1024], series
    boxes = [t.get_window_extent(renderer) for t in left.texts]
    inside = left.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, left.texts[i].get_text()
        assert inside.y0 <= box.y0 and box.y1 <= inside.y1, left.texts[i].get_text()
        for j in range(i):
            assert not box.overlaps(boxes[j]), (left.texts[i].get_text(),
                                                left.texts[j].get_text())


def test_no_measurement_is_one_clear_line():
    with pytest.raises(ValueError, match="measured must hold tokens per second"):
        roofline({})
