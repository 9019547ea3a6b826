"""Lab: explore a run you will never launch on a laptop — memory per GPU and step time.

    from minitp.course.labs.explorer import explore, explorer_widget, figure
    e = explore("gpt3-175b", n_gpus=1024, gpu="a100-80gb", pp=16, tp=8, sp=True,
                microbatches=192)        # dp = 1024 / (16·8) = 8, global batch 8·1·192
    e.memory, e.time, e.fits             # bytes by kind, seconds by part, True
    print(e)                             # a readable summary
    figure(e)                            # both as stacked bars
    w = explorer_widget(); w             # sliders and dropdowns; w.result is the latest `explore`

Everything here is `minitp.calc`, so every number is a MODEL (the papers'
formulas), none measured: `explore` checks the configuration, calls
`calc.memory_per_gpu` and `calc.step_time`, and keeps their answers; the
widget only turns its controls into `explore`'s arguments. So the tests (and
lesson 17) check the numbers by calling `calc` directly, and drive the widget
in code: ``w.controls["tp"].value = 16``, then read ``w.result``.

Layout: a plain VBox, since a CSS grid's per-child placement (``grid_column``) is
not applied by every front end: the controls wrap in a row (each 230 px), then the
summary (an Output, its lines at most `SUMMARY_WIDTH` characters, so none wraps
down to a 1024-px JupyterLab window), then the figure, an Image as wide as the
notebook (drawn at 960 px, scaled to the width). Displayed, the widget also
carries a PNG of its figure and its summary as text, so a notebook opened
without running it (or on GitHub) shows the picture rather than a repr.

(The explorer is two modules read side by side: exploration.py, `explore` and its
numbers, and explorer_ui.py, the widget that is only a view of it; this one is where
both are imported from.)
"""

from __future__ import annotations

from .exploration import GPUS, MODELS, SUMMARY_WIDTH, Exploration, explore, figure
from .explorer_ui import CONTROLS, DEFAULTS, Explorer, explorer_widget

__all__ = ["CONTROLS", "DEFAULTS", "GPUS", "MODELS", "SUMMARY_WIDTH", "Exploration", "Explorer",
           "explore", "explorer_widget", "figure"]
