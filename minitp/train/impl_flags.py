"""``--impl torch [--hsdp R]``: the same run with PyTorch's own parallelism
(`minitp.torch_parallel`: DTensor tensor parallelism, FSDP2, HSDP) in minitp's place.

`add_impl_flags` adds the two flags; `validate_impl` refuses, in one line before any
process starts, what torch's path here cannot do, naming what to use instead (the rules
are `minitp.rules.torch_parallel`'s); `impl_functions` gives each rank the three calls
`minitp.train.rank` makes — parallelize, make the optimizer, step — for the chosen path.
"""

from __future__ import annotations

from ..rules.torch_parallel import (
    USE_MINITP,
    check_torch_mesh,
    check_torch_model,
    check_torch_options,
)

IMPLS = ("minitp", "torch")


class LeftOut(int):
    """--zero-stage's default: 0 wherever it is read before `validate_impl` (memory_needed on
    parsed flags, say), but known there as left out, which a given 0 is not."""


ZERO_STAGE_LEFT_OUT = LeftOut(0)


def add_impl_flags(parser) -> None:
    a = parser.add_argument
    a("--impl", choices=IMPLS, default="minitp",
      help="minitp's own parallelism (default), or torch's: DTensor tensor parallelism "
           "(parallelize_module), FSDP2 (fully_shard: --dp > 1 shards as --zero-stage 3, "
           "the default there) and HSDP; needs --pp 1 (docs/torch-parallel.md)")
    a("--hsdp", type=int, default=None, metavar="R",
      help="--impl torch: HSDP, R replicas of dp/R ranks that shard the model inside")


def validate_impl(args, parser) -> None:
    """parser.error (exit 2) on a combination torch's path cannot run. Sets --zero-stage
    left out: 0 (minitp's plain data parallelism), or under --impl torch with --dp > 1, 3.

    Why 3 there: torch's data parallelism here is FSDP2, which has no stage 0, and a user
    who asks for torch's path over dp ranks expects it to run, not to be told a flag; the
    numbers are the same (FSDP2's sharding changes where tensors live, not the loss).
    A stage given (0, 1 or 2) is refused, naming what torch would use for it."""
    if isinstance(args.zero_stage, LeftOut):  # a plain int from here on (metrics.json's)
        args.zero_stage = 3 if args.impl == "torch" and args.dp > 1 else 0
    if args.impl != "torch":
        if args.hsdp is not None:
            parser.error("--hsdp needs --impl torch (minitp's own data parallelism has no "
                         "HSDP: use --zero-stage 3 over the whole --dp)")
        return
    given = {"--load": args.load, "--save": args.save, "--pack": args.pack,
             "--clip-grad": args.clip_grad is not None, "--ep": args.ep > 1,
             "--etp": args.etp > 1, "--fold": args.fold,
             "--fp8": args.fp8 is not None,  # torch's modules would run in full precision
             "--trace-out": args.trace_out is not None}  # torch's collectives are not traced
    for flag, on in given.items():
        if on:
            parser.error(f"--impl torch does not do {flag}: {USE_MINITP}")
    if args.dp > 1 and args.zero_stage != 3:
        parser.error(f"--impl torch --zero-stage {args.zero_stage}: torch's data parallelism "
                     "here is FSDP2 (fully_shard), which shards as --zero-stage 3 does (its "
                     "default over --dp > 1); stage 0 would be torch's replicate (DDP), and "
                     f"neither it nor 1-2 is wired here: leave --zero-stage out, or {USE_MINITP}")
    experts = args.experts or 0
    try:
        check_torch_mesh(args.dp, args.pp, args.cp, args.tp, args.hsdp)
        check_torch_model(experts, 1 if args.arch == "vlm" else 0,
                          None if args.arch in (None, "gpt2") else "llama",
                          "gelu" if args.arch in (None, "gpt2") else "swiglu")
        check_torch_options(args.dp, args.zero_stage, args.recompute, args.tp_overlap,
                            "bfloat16" if args.dtype == "bfloat16" else None)
    except ValueError as exc:
        parser.error(f"--impl torch: {exc}")


def impl_functions(args, parallelize, make_optimizer, train_step):
    """(parallelize, make_optimizer, train_step) with minitp's signatures: minitp's own,
    given, or torch's path behind them."""
    if args.impl != "torch":
        return parallelize, make_optimizer, train_step
    from .. import torch_parallel

    def torch_parallelize(ref, mesh, sequence_parallel=False, **_plan):  # validated above
        model = torch_parallel.parallelize(ref, mesh, sequence_parallel=sequence_parallel,
                                           hsdp=args.hsdp)
        model.zero_stage = 0  # minitp's own ZeRO hooks: none (FSDP2 shards the parameters)
        model.full_state_dict = lambda: torch_parallel.full_state_dict(model)
        return model

    def torch_optimizer(model, mesh, factory):
        return factory(list(model.parameters()))

    def torch_step(model, batch, mesh, optimizer, microbatches=1, **_options):
        return torch_parallel.train_step(model, batch, optimizer, microbatches=microbatches)

    return torch_parallelize, torch_optimizer, torch_step
