"""``python -m minitp.debug diverge <minitp.train flags>``: the first module of that run's
first step that departs from one device's (`minitp.debug.first_divergence`).

The flags are `python -m minitp.train`'s (its parser and every check of it, `--help` lists
them), with ``--tolerance`` added; the step is the run's first (its batch, its seed's weights),
in float64 whatever ``--dtype`` says; the flags of later steps (``--steps``, ``--lr``, evaluation,
the sample) change nothing in it. What cannot be compared is refused in one line, exit code 2,
before any process starts: a tolerance below float64's noise, a mesh the model cannot split,
bf16 mixed precision, ``--impl torch``, ``--load``, ``--save``. The last line printed is one JSON
object: ``{"module", "rank", "phase", "tensor", "difference"}``, ``module`` null where nothing
departs (the exit code is 0 either way: the run itself worked).
"""

from __future__ import annotations

import json
import math
import sys

from ..rules import placement_of
from ..train.flags import build_parser, sizes_text, validate
from ..train.fp8_flags import plan_options as fp8_plan
from ..train.machine import uses_mixed_precision
from ..train.rank import batch_of
from .divergence import NOISE, check_divergence_input, first_divergence

NOTHING = {"module": None, "rank": None, "phase": None, "tensor": None, "difference": None}


def _parser():
    parser = build_parser()
    parser.prog = "python -m minitp.debug diverge"
    parser.description = ("The first module of a minitp.train run's first step that departs "
                          "from one device's, in float64. The flags are minitp.train's.")
    parser.add_argument("--tolerance", type=float, default=1e-9,
                        help="the largest absolute difference that is not a departure "
                             f"(float64; at least {NOISE:g})")
    return parser


def _refuse_before_validation(args, parser) -> None:
    if not (math.isfinite(args.tolerance) and args.tolerance >= NOISE):
        parser.error(f"--tolerance {args.tolerance!r}: it must be a number of at least "
                     f"float64's noise, {NOISE:g} (below it every module would depart)")
    if getattr(args, "impl", "minitp") == "torch":
        parser.error("--impl torch: PyTorch's modules are not minitp's, so their results "
                     "have no plain-model names to compare by")
    if args.load or args.save:
        parser.error(f"--{'load' if args.load else 'save'}: the finder compares a fresh model's "
                     "first step and writes no checkpoint")
    if uses_mixed_precision(args):
        parser.error("--dtype bfloat16: the finder compares in float64 (bf16 departs from one "
                     "device by its own rounding)")


def diverge(argv) -> dict:
    """The command (without its name): prints a line of text, then the JSON; returns it."""
    parser = _parser()
    args = parser.parse_args(argv)
    _refuse_before_validation(args, parser)
    cfg, train_tokens, _, _ = validate(args, parser)
    sizes = dict(dp=args.dp, pp=args.pp, cp=args.cp, tp=args.tp, ep=args.ep)
    options = dict(sequence_parallel=args.sp, recompute=args.recompute,
                   virtual_stages=args.virtual_stages, zero_stage=args.zero_stage,
                   tp_overlap=args.tp_overlap and args.sp and args.tp > 1,
                   placement=placement_of(args.schedule), vision_layout=args.vision_layout,
                   cp_comm=args.cp_comm, cp_a2a_size=args.cp_a2a_size,
                   pipeline_layout=args.pipeline_layout, **fp8_plan(args))
    batch = batch_of(args, cfg, train_tokens, 0)
    try:
        check_divergence_input(cfg, sizes, args.tolerance, args.microbatches,
                               batch[0].shape[0], options, args.schedule, packed=len(batch) == 3)
    except ValueError as exc:
        parser.error(str(exc))
    found = first_divergence(cfg, sizes, batch=batch, tolerance=args.tolerance,
                             microbatches=args.microbatches, schedule=args.schedule,
                             seed=args.seed, timeout=args.timeout, **options)
    where = sizes_text(args)
    if found is None:
        print(f"{where}: no module departs from one device by more than {args.tolerance:g}")
        summary = dict(NOTHING)
    else:
        print(f"{where}: {found.module} departs first, on rank {found.rank}, in {found.phase} "
              f"({found.tensor}, by {found.difference:.3g})")
        summary = found.summary()
    print(json.dumps(summary), flush=True)
    return summary


COMMANDS = {"diverge": diverge}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(f"usage: python -m minitp.debug {{{','.join(COMMANDS)}}} ... "
                         f"(got {argv[0] if argv else 'nothing'!r})\n")
        raise SystemExit(2)
    return COMMANDS[argv[0]](argv[1:])
