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


def add_impl_flags(parser) -> None:
    a = parser.add_argument
    a("--impl", choices=IMPLS, default="minitp",
      help="minitp's own parallelism (default), or torch's: DTensor tensor parallelism "
           "(parallelize_module), FSDP2 (fully_shard, give --zero-stage 3 with --dp > 1) "
           "and HSDP; needs --pp 1 (docs/torch-parallel.md)")
    a("--hsdp", type=int, default=None, metavar="R",
      help="--impl torch: HSDP, R replicas of dp/R ranks that shard the model inside")


def validate_impl(args, parser) -> None:
    """parser.error (exit 2) on a combination torch's path cannot run."""
    if args.impl != "torch":
        if args.hsdp is not None:
            parser.error("--hsdp needs --impl torch (minitp's own data parallelism has no "
                         "HSDP: use --zero-stage 3 over the whole --dp)")
        return
    given = {"--load": args.load, "--save": args.save, "--pack": args.pack,
             "--clip-grad": args.clip_grad is not None, "--ep": args.ep > 1}
    for flag, on in given.items():
        if on:
            parser.error(f"--impl torch does not do {flag}: {USE_MINITP}")
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
