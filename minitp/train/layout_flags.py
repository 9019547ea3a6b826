"""`python -m minitp.train --pipeline-layout`: which layers each pipeline stage holds, when
--n-layer does not cut evenly into --pp × --virtual-stages (`minitp.rules.layouts`,
docs/pipeline-layouts.md):

    python -m minitp.train --dp 1 --pp 2 --tp 2 --n-layer 5 --pipeline-layout "Et*3|ttL"

``--pipeline-layout auto`` takes `minitp.calc.pipeline_layout`'s choice (a model: the layout
whose slowest stage has the fewest training FLOPs per token); the run's metrics.json records
the layout chosen in its args.

Refused before any process starts (exit 2, one line) where the layout cannot run: a layer
dropped or repeated, a stage count other than --pp × --virtual-stages, a symbol minitp does
not read, or torch's path (--impl torch has no pipeline).
"""

from __future__ import annotations

from ..rules.layouts import layout_stages

HELP = ("which layers each of the --pp x --virtual-stages stages holds, in model order, as "
        "Megatron-LM writes it: E the embedding, t a layer, L the head, | between stages, "
        "t*3 and (tt|)*2 repeat; e.g. 'Et*3|ttL' puts 3 layers and the embedding on the first "
        "of 2 stages, 2 and the head on the second; auto: minitp.calc.pipeline_layout's "
        "choice, the slowest stage's FLOPs least (default: n-layer/stages each)")


def add_layout_flag(parser) -> None:
    parser.add_argument("--pipeline-layout", metavar="LAYOUT", default=None, help=HELP)


def validate_layout(args, cfg, parser) -> None:
    """parser.error (exit 2) on a layout the run cannot use; the ranks then trust it."""
    if args.pipeline_layout is None:
        return
    if args.impl == "torch":
        parser.error("--pipeline-layout needs --impl minitp: torch's path here has no pipeline")
    if args.pipeline_layout == "auto":  # the model's choice, before the ranks need it
        from ..calc.planning.pipeline_layout import pipeline_layout

        args.pipeline_layout = pipeline_layout(cfg, args.pp, args.virtual_stages).layout
    try:
        layout_stages(args.pipeline_layout, cfg.n_layer, args.pp, args.virtual_stages)
    except ValueError as exc:
        parser.error(f"--pipeline-layout: {exc}")


def layers_per_rank_bound(args, n_layer: int) -> int:
    """The layers the busiest pipeline rank holds, as an n_layer the even-split memory model
    (`minitp.calc.memory_per_gpu`) reads: every rank charged as that one (an upper bound)."""
    layout = getattr(args, "pipeline_layout", None)
    if layout is None:  # the even split, already checked to divide
        return n_layer
    stages, v = layout_stages(layout, n_layer, args.pp, args.virtual_stages), args.virtual_stages
    most = max(sum(len(stages[k * args.pp + r]) for k in range(v)) for r in range(args.pp))
    return -(-most // v) * v * args.pp  # a multiple of pp·v, as the model needs
