"""The explorer's widget (lesson 17): sliders and dropdowns whose values become
`explore`'s arguments, its summary and its figure below them. The widget is only a view
of `explore` (exploration.py): its controls name `explore`'s arguments one for one.
"""

from __future__ import annotations

import base64
import contextlib
import io

import ipywidgets as widgets

from ...calc.network.cluster import GiB
from .exploration import GPUS, MODELS, Exploration, explore, figure

# The controls, in the order they are the widget's children (the output area is last).
CONTROLS = ("model", "gpu", "gpu_memory", "n_gpus", "dp", "pp", "tp", "sp", "recompute",
            "micro_batch", "microbatches")
DEFAULTS = {"model": "gpt3-175b", "gpu": "a100-80gb", "gpu_memory": 80, "n_gpus": 1024,
            "dp": None, "pp": 16, "tp": 8, "sp": True, "recompute": None, "micro_batch": 1,
            "microbatches": 192}
_COUNTS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
           1536, 2048, 3072, 4096]


# Dropdown values that stand for None: ipywidgets treats a value of None as "nothing
# selected" and shows a blank box, so "auto" and "none" are values of their own.
_AUTO, _NONE = "auto", "none"


def _controls() -> dict:
    style, wide = {"description_width": "initial"}, widgets.Layout(width="230px")

    def dropdown(description, options):
        # (label, value) pairs throughout: a bare list mixing pairs and numbers is
        # read by ipywidgets as labels, and a pair would show as its repr.
        options = [o if isinstance(o, tuple) else (str(o), o) for o in options]
        return widgets.Dropdown(options=options, description=description, style=style,
                                layout=wide)

    return {
        "model": dropdown("model", [(label, key) for key, (label, _) in MODELS.items()]),
        "gpu": dropdown("GPU", [(c.name, key) for key, c in GPUS.items()]),
        "gpu_memory": widgets.IntSlider(min=8, max=192, step=1, description="GiB per GPU",
                                        style=style, layout=wide),
        "n_gpus": dropdown("GPUs", _COUNTS),
        "dp": dropdown("dp", [("auto: GPUs/(pp·tp)", _AUTO)] + _COUNTS),
        "pp": dropdown("pp", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 35, 48, 64, 96, 128]),
        "tp": dropdown("tp", [1, 2, 4, 8, 16, 32, 64]),
        "sp": widgets.Checkbox(description="sequence parallel", style=style, layout=wide,
                               indent=False),
        "recompute": dropdown("recompute", [("none", _NONE), ("selective", "selective"),
                                            ("full", "full")]),
        "micro_batch": dropdown("micro-batch b", [1, 2, 4, 8, 16]),
        "microbatches": widgets.IntSlider(min=1, max=1024, step=1, description="microbatches m",
                                          style=style, layout=wide),
    }


# A control's value <-> explore's argument: only dp and recompute differ (None).
_TO_WIDGET = {"dp": {None: _AUTO}, "recompute": {None: _NONE}}
_FROM_WIDGET = {"dp": {_AUTO: None}, "recompute": {_NONE: None}}


class Explorer(widgets.VBox):
    """The explorer: the controls (``controls``, one per `CONTROLS` entry, in that
    order, wrapping in a row), then the summary or the error (``output``), then the
    figure (``image``, hidden while there is none), each as wide as the notebook.

    ``result``: the latest `Exploration` (None while the controls make no valid
    run; ``error`` then says why). ``figure``: the latest figure. ``controls``:
    name -> widget. ``set(tp=16, pp=4)`` changes several controls, then updates once.
    """

    def __init__(self, draw: bool = True, **values):
        self.controls = _controls()
        self.output = widgets.Output(layout=widgets.Layout(width="100%"))
        self.image = widgets.Image(format="png", layout=widgets.Layout(
            width="100%", height="auto", display="none"))
        self.result: Exploration | None = None
        self.error: str | None = None
        self.figure = None
        self._png: str | None = None
        self.draw = draw
        self._holding = False
        box = widgets.HBox([self.controls[k] for k in CONTROLS],
                           layout=widgets.Layout(flex_flow="row wrap", width="100%",
                                                 grid_gap="4px 8px"))
        super().__init__(children=[box, self.output, self.image],
                         layout=widgets.Layout(width="100%"))
        if "gpu" in values and "gpu_memory" not in values and values["gpu"] in GPUS:
            values["gpu_memory"] = round(GPUS[values["gpu"]].memory / GiB)
        self.set(**{**DEFAULTS, **values})
        for key in CONTROLS:
            self.controls[key].observe(self._changed, names="value")

    def values(self) -> dict:
        """The controls' values, as `explore`'s keyword arguments."""
        return {key: _FROM_WIDGET.get(key, {}).get(self.controls[key].value,
                                                   self.controls[key].value)
                for key in CONTROLS}

    @contextlib.contextmanager
    def hold(self):
        """Change several controls inside; the result is computed once, at the end."""
        was, self._holding = self._holding, True
        try:
            yield self
        finally:
            self._holding = was
            if not was:
                self.update()

    def set(self, **values) -> Explorer:
        unknown = set(values) - set(CONTROLS)
        if unknown:
            raise ValueError(f"no control named {', '.join(sorted(unknown))}; the controls: "
                             f"{', '.join(CONTROLS)}")
        with self.hold():
            for key in CONTROLS:  # in this order: a new GPU first, then a memory given with it
                if key in values:
                    value = values[key]
                    self.controls[key].value = _TO_WIDGET.get(key, {}).get(value, value)
        return self

    def _changed(self, change) -> None:
        if change["owner"] is self.controls["gpu"]:
            with self.hold():  # a new GPU brings its own memory
                self.controls["gpu_memory"].value = round(GPUS[change["new"]].memory / GiB)
        elif not self._holding:
            self.update()

    def update(self) -> None:
        """Recompute ``result`` from the controls and redraw the output area."""
        try:
            self.result, self.error = explore(**self.values()), None
        except ValueError as exc:
            self.result, self.error = None, str(exc)
        self.figure = self._png = None
        if self.result is None:
            self.output.outputs = ({"output_type": "stream", "name": "stderr",
                                    "text": f"Not a valid run: {self.error}\n"},)
        else:
            self.output.outputs = ({"output_type": "stream", "name": "stdout",
                                    "text": self.result.summary() + "\n"},)
        if self.draw and self.result is not None:
            # 8 inches at 120 dpi: 960 px, about the widest the notebook shows it (a
            # 1440-px window), so it is scaled down more often than up
            self.figure = figure(self.result, width=8.0)
            buffer = io.BytesIO()
            self.figure.savefig(buffer, format="png", dpi=120)
            self.image.value = buffer.getvalue()
            self._png = base64.b64encode(self.image.value).decode()
        if self._png is None:
            self.image.value = b""  # no stale picture kept (nor saved with the notebook)
        self.image.layout.display = None if self._png else "none"

    def __repr__(self) -> str:
        return f"Explorer: {self.result.summary() if self.result else self.error}"

    def _repr_mimebundle_(self, **kwargs):
        """The live widget, plus a PNG of its figure and its summary as text: a front
        end with no widget manager (GitHub, a notebook opened before it is run)
        shows the picture of the state the widget was displayed in."""
        data = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = repr(self)
        if self._png is not None:
            data["image/png"] = self._png
        return data


def explorer_widget(draw: bool = True, **values) -> Explorer:
    """The interactive explorer (ipywidgets), its controls set to `DEFAULTS` updated by
    ``values``: GPT-3 175B on 1024 A100s, dp auto, pp 16, tp 8, sp, 192 microbatches.
    ``draw=False`` skips the figure (faster, for tests)."""
    return Explorer(draw=draw, **values)
