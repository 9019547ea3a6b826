"""The command line's FP8 flags: --fp8 SCALING, --fp8-local-scales, --fp8-all-gather
(`minitp.fp8`).

`add_fp8_flags(parser)` adds them, `validate_fp8(args, parser, cfg)` refuses what they cannot
pair with in one line (exit 2) before any process starts; `plan_options(args)` is what a
rank passes to `mt.parallelize`; `one_process(ref, args)` and `forward_backward(…)` make
--check's one-process run the one-process FP8 run (`minitp.fp8.reference`: the same
microbatches, one after another).
"""

from __future__ import annotations

import sys

from ..fp8.apply import LOCAL_SCALES_WARNING
from ..fp8.convert import convert
from ..fp8.reference import accumulate
from ..rules.fp8_groups import SCALINGS, check_fp8_blocks, check_fp8_config, check_fp8_model


def add_fp8_flags(parser) -> None:
    a = parser.add_argument
    a("--fp8", choices=SCALINGS, default=None,
      help="the blocks' linear layers in FP8, emulated exactly (docs/fp8.md): tensorwise "
           "(this step's amax) and delayed (an amax history), e4m3 forward and e5m2 gradients; "
           "rowwise (torchao's: one power-of-two scale a row, e4m3 throughout, the backward "
           "cast again); mxfp8 and nvfp4 (Blackwell's block scales: 32 e4m3 values an e8m0 "
           "scale; 16 e2m1 values an e4m3 scale under a tensor scale); --check compares with "
           "the one-process FP8 run")
    a("--fp8-local-scales", action="store_true",
      help="with --fp8: each rank scales its piece of a split tensor by its own amax — the "
           "trap, on purpose (a warning says so; --check --dtype float64 shows the drift)")
    a("--fp8-all-gather", action="store_true",
      help="with --fp8 tensorwise --zero-stage 3: ZeRO-3 gathers the weights in 8 bits with "
           "their scale (about half of bf16's bytes)")


def validate_fp8(args, parser, cfg) -> None:
    """parser.error (one line, exit 2) for a combination FP8 cannot run."""
    if args.fp8 is None and not (args.fp8_local_scales or args.fp8_all_gather):
        return
    if args.fp8 is None:
        parser.error(f"--fp8-{'local-scales' if args.fp8_local_scales else 'all-gather'} "
                     "needs --fp8 (a scaling)")
    dtype = args.dtype if args.dtype != "float64" else None
    try:
        check_fp8_config(args.fp8, args.fp8_local_scales, param_dtype=dtype,
                         tp_overlap=args.tp_overlap and args.sp and args.tp > 1,
                         recompute=args.recompute, all_gather=args.fp8_all_gather,
                         zero_stage=args.zero_stage)
        check_fp8_model(cfg, args.tp)
        tokens = args.batch_size // (args.dp * args.microbatches) * cfg.seq_len // args.cp
        check_fp8_blocks(cfg, args.fp8, args.tp, args.cp, tokens)
    except ValueError as exc:
        parser.error(f"--fp8: {exc}")
    if args.pack:
        parser.error("--fp8 with --pack: the one-process FP8 run does not take packed "
                     "documents yet")
    if args.load:
        parser.error("--fp8 with --load: a resumed run is not made FP8 yet (and checkpoints "
                     "do not hold delayed scaling's amax histories)")
    if args.fp8_local_scales:
        sys.stderr.write(f"warning: {LOCAL_SCALES_WARNING}\n")


def plan_options(args) -> dict:
    """`mt.parallelize`'s FP8 options from the flags."""
    return dict(fp8=args.fp8, fp8_local_scales=args.fp8_local_scales,
                fp8_all_gather=args.fp8_all_gather)


def one_process(ref, args):
    """--check's plain model, made FP8 when the run is (`minitp.fp8.convert`)."""
    return ref if args.fp8 is None else convert(ref, args.fp8)


def forward_backward(ref, args, x, y, positions=None) -> float:
    """--check's forward and backward of one batch: the whole batch at once, or under --fp8
    the microbatches the ranks cast together (`minitp.fp8.accumulate`)."""
    if args.fp8 is not None:
        return accumulate(ref, (x, y), args.dp, args.microbatches)
    _, loss = ref(x, y, positions=positions)
    loss.backward()
    return float(loss.detach())
