"""The command line's optimizer flags: --optimizer adam|muon, --muon-strategy gather|owner|tp
(`minitp.optim`, docs/muon.md).

`add_optim_flags(parser)` adds them; `validate_optim(args, parser)` refuses, in one line
(exit 2) before any process starts, what Muon cannot pair with; `make(...)` is the optimizer
a rank steps (`load_options`: the one --load resumes) and `one_process(ref, args)` --check's,
the same optimizer on one process.

One --lr serves both halves of Muon+AdamW: Muon's update is scaled by Moonlight's
0.2·√max(A, B) ("match_rms_adamw", Liu et al. 2025, arXiv 2502.16982 §2.2), which gives it
AdamW's update size, so the learning-rate schedule applies to every group alike. No weight
decay on either half, as the Adam runs here have none: AdamW over the rest is then Adam.
"""

from __future__ import annotations

import torch

from .. import checkpoint
from ..optim import STRATEGIES

OPTIMIZERS = ("adam", "muon")


def add_optim_flags(parser) -> None:
    a = parser.add_argument
    a("--optimizer", choices=OPTIMIZERS, default="adam",
      help="adam (default), or muon: Muon for the blocks' linear weights (Newton-Schulz on "
           "each whole matrix), AdamW (no weight decay) for the rest, one --lr for both "
           "(Moonlight's scaling; docs/muon.md)")
    a("--muon-strategy", choices=STRATEGIES, default=None,
      help="with --optimizer muon, how a rank reaches each whole matrix: gather (all-gather "
           "over dp, default), owner (a home rank per matrix, one all-to-all there and back) "
           "or tp (Newton-Schulz split over tp, needs --tp > 1)")


def muon_options(args) -> dict:
    """The options `mt.make_optimizer(..., "muon")` and `muon_with_adamw` both take."""
    return dict(lr=args.lr, adjust_lr_fn="match_rms_adamw", weight_decay=0.0,
                adamw_weight_decay=0.0)


def validate_optim(args, parser) -> None:
    """parser.error (one line, exit 2) on a combination Muon cannot run here, or a --load
    whose optimizer state is another optimizer's; sets --muon-strategy left out to gather
    under --optimizer muon. Runs after `validate_save` (args.load: the checkpoint meant)."""
    if args.load:
        try:
            meta = checkpoint.read_meta(args.load)
        except (OSError, ValueError):
            meta = None  # refused next, in `validate`'s own words
        # a sharded checkpoint (no "has_optimizer") always holds the optimizer's elements
        saved = meta and meta.get("has_optimizer", True) and meta["extra"].get("optimizer",
                                                                              "adam")
        if saved and saved != args.optimizer:  # checkpoints before the flag: Adam's
            parser.error(f"--load {args.load}: the checkpoint holds {saved}'s optimizer "
                         f"state, which --optimizer {args.optimizer} cannot resume from")
    if args.optimizer != "muon":
        if args.muon_strategy is not None:
            parser.error(f"--muon-strategy {args.muon_strategy} needs --optimizer muon")
        return
    args.muon_strategy = args.muon_strategy or "gather"
    if args.muon_strategy == "tp" and args.tp == 1:
        parser.error("--muon-strategy tp splits Newton-Schulz over the tp ranks: it needs "
                     "--tp > 1 (use gather or owner)")
    refused = {  # why each: the library refuses it, or it would change what Muon steps
        "--save-every": (args.save_every is not None, "sharded saves of Muon's state are not "
                         "written yet (--save alone writes a dense checkpoint)"),
        "--dtype bfloat16": (args.dtype == "bfloat16", "a mixed-precision Muon is not "
                             "supported yet (use float32 or float64)"),
        "--impl torch": (args.impl == "torch", "torch's path here steps torch's Adam"),
        "--fp8": (args.fp8 is not None, "FP8's linear layers are not the matrices Muon "
                  "takes yet"),
    }
    for flag, (given, why) in refused.items():
        if given:
            parser.error(f"--optimizer muon with {flag}: {why}")


def make(args, model, mesh, make_optimizer, adam_factory):
    """The optimizer this rank steps: Adam through `make_optimizer` (over ZeRO's shards or
    the parameters), or Muon+AdamW by `mt.make_optimizer(model, mesh, "muon", strategy=...)`."""
    if args.optimizer == "muon":
        return make_optimizer(model, mesh, "muon", strategy=args.muon_strategy,
                              **muon_options(args))
    return make_optimizer(model, mesh, adam_factory)


def load_options(args, adam_factory) -> dict:
    """`checkpoint.load`'s keyword for the optimizer the checkpoint's state goes into."""
    if args.optimizer == "muon":
        return dict(muon=dict(strategy=args.muon_strategy, **muon_options(args)))
    return dict(optimizer_factory=adam_factory)


def one_process(ref, args):
    """--check's optimizer: the same one, over the one-process model."""
    if args.optimizer == "muon":
        from ..optim import muon_with_adamw

        return muon_with_adamw(ref, **muon_options(args))
    return torch.optim.Adam(ref.parameters(), lr=args.lr)
