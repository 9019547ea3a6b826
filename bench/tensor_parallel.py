"""Tensor-parallel step time: minitp beside PyTorch's DTensor tensor parallelism, one run.

What is compared. The stack of transformer blocks of one plain ``mt.GPT`` (same
seed, same weights on every rank), forward and backward, split two ways over
the same gloo process group of ``tp`` CPU ranks:

* minitp: ``mt.parallelize(ref, mt.Mesh(tp=tp), sequence_parallel=sp)``, whose
  blocks use ColumnParallelLinear / RowParallelLinear (Megatron's f and g, or
  with SP all-gather / reduce-scatter) — we run ``model.blocks``;
* DTensor: a deep copy of ``ref.blocks`` given to
  ``torch.distributed.tensor.parallel.parallelize_module`` on a 1-D
  ``init_device_mesh("cpu", (tp,))`` with the plan that torchtitan uses for
  Llama: attn.qkv and mlp.fc ``ColwiseParallel``, attn.proj and mlp.proj
  ``RowwiseParallel``; with SP also ``SequenceParallel`` on ln1 / ln2,
  ``PrepareModuleInput(Shard(1) -> Replicate())`` on attn and mlp (the all-gather),
  and ``RowwiseParallel(output_layouts=Shard(1))`` (the reduce-scatter).

One timed step, either side: clear the gradients; a (B, T, C) float32 input
(with SP: this rank's (B, T/t, C) sequence shard) that requires grad goes
through all blocks; ``out.backward(g)`` with a fixed random g of the output's
shape; then every gradient is made complete. The collectives are the same on
both sides (counted with torch.profiler): per layer, without SP 2 all-reduces
forward and 2 backward; with SP 2 all-gathers and 2 reduce-scatters forward and
the same backward. Completing the gradients differs by design: under SP minitp
sums its partial gradients (LayerNorms, and row-parallel biases, which it adds
after the reduce-scatter) in one flattened all-reduce,
``ParallelGPT.sync_partial_grads``, as ``mt.train_step`` does; DTensor leaves
the LayerNorm gradients ``Partial`` (its row biases are added before the
reduce-scatter, so their gradients come out whole) and we call
``grad.redistribute(param.placements)`` on each: 4 small all-reduces per layer.
minitp records its trace events as it always does; that cost is included.
Dropout is 0 (the two libraries draw masks differently, so with dropout the
outputs could not be checked equal).

Why only the blocks. That is where both libraries apply the same Megatron
plan, and so where they do the same arithmetic and move the same bytes. The
embedding, tied output projection and loss are not comparable: minitp's are
vocab-parallel with a tied weight and a loss that never gathers the logits;
DTensor would need a different plan there (``loss_parallel``, an untied
output), so a difference would measure the plan, not the implementation.
No optimizer step: it is the same elementwise work on the same shards on both
sides, plus DTensor dispatch, and it does not involve tensor parallelism.

Why it is fair. Before timing, both sides run one step on the same input and
must agree with each other (outputs, input gradient, every parameter gradient,
shard by shard), and their outputs and input gradients with the plain
single-device blocks', to float32 rounding; the bench stops if they do not.
Then both sides run in the same processes, interleaved (minitp, DTensor,
DTensor, minitp, ...), each step started after a barrier, so that load from
other programs on a shared machine falls on both alike. A step's time is the
slowest rank's; we report each side's median.

How to read the ratio: minitp ms / DTensor ms per step. Below 1.0 minitp is
faster, above 1.0 slower; the goal in issue 3 is <= 1.0 at tp = 2 and 4.
"pairs q1-q3" is the interquartile range of the ratios of each step's back-to-back
pair (a gauge of the noise); "max rel diff" the worst disagreement found by the
check, relative to the tensor's largest entry.

    python bench/tensor_parallel.py                       # tp 2 and 4, SP off and on
    python bench/tensor_parallel.py --tp 2 --steps 40 --d-model 512 --n-head 8
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import torch.distributed as dist

import minitp as mt


def _dtensor_blocks(blocks, tp: int, sequence_parallel: bool):
    """PyTorch's own TP of a deep copy of `blocks`, with torchtitan's plan for Llama blocks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    device_mesh = init_device_mesh("cpu", (tp,))
    blocks = copy.deepcopy(blocks)
    for block in blocks:
        plan = {"attn.qkv": ColwiseParallel(), "mlp.fc": ColwiseParallel()}
        if sequence_parallel:
            gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({
                "ln1": SequenceParallel(),
                "attn": PrepareModuleInput(**gather),
                "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                "ln2": SequenceParallel(),
                "mlp": PrepareModuleInput(**gather),
                "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
            })
        else:
            plan.update({"attn.proj": RowwiseParallel(), "mlp.proj": RowwiseParallel()})
        parallelize_module(block, device_mesh, plan)
    return blocks


def _complete_dtensor_grads(blocks) -> None:
    """Sum the Partial gradients (SequenceParallel's LayerNorms) so every grad is whole."""
    from torch.distributed.tensor import DTensor

    for p in blocks.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=p.placements)


def _local_grad(p) -> torch.Tensor:
    g = p.grad
    return g.to_local() if hasattr(g, "to_local") else g


def _max_diff(a, b) -> float:
    """Largest difference, relative to b's largest entry (absolute below 1)."""
    a, b = a.detach(), b.detach()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1.0)).item()


def _make_step(blocks, params, finish, x, g):
    """One forward + backward of `blocks` on x; returns (out, input grad)."""

    def step():
        for p in params:
            p.grad = None
        h = x.detach().requires_grad_()
        inp = h
        for block in blocks:
            h = block(h)
        h.backward(g)
        finish()
        return h, inp.grad

    return step


def _compare(cfg_kw, tp, sequence_parallel, batch, steps, warmup, seed):
    """On every rank: build both sides, check they agree, time them interleaved."""
    cfg = mt.GPTConfig(**cfg_kw)
    mesh = mt.Mesh(tp=tp)
    rank = mesh.tp.rank
    torch.manual_seed(seed)
    ref = mt.GPT(cfg)
    ours = mt.parallelize(ref, mesh, sequence_parallel=sequence_parallel)
    theirs = _dtensor_blocks(ref.blocks, tp, sequence_parallel)

    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, cfg.seq_len, cfg.d_model, generator=generator)
    g = torch.randn(batch, cfg.seq_len, cfg.d_model, generator=generator)

    def mine(t):  # what this rank holds of a (B, T, C) activation
        return t.chunk(tp, dim=1)[rank].contiguous() if sequence_parallel else t

    step_ours = _make_step(ours.blocks, list(ours.blocks.parameters()),
                           ours.sync_partial_grads, mine(x), mine(g))
    step_theirs = _make_step(theirs, list(theirs.parameters()),
                             lambda: _complete_dtensor_grads(theirs), mine(x), mine(g))

    # -- the two compute the same thing (and equal the plain blocks) --------------------
    with mt.trace.paused():
        out_o, xg_o = step_ours()
        out_t, xg_t = step_theirs()
    dense_x = x.clone().requires_grad_()
    h = dense_x
    for block in ref.blocks:
        h = block(h)
    h.backward(g)
    errors = {
        "output": _max_diff(out_o, out_t),
        "input grad": _max_diff(xg_o, xg_t),
        "output vs plain": max(_max_diff(out_o, mine(h)), _max_diff(out_t, mine(h))),
        "input grad vs plain": max(_max_diff(xg_o, mine(dense_x.grad)),
                                   _max_diff(xg_t, mine(dense_x.grad))),
    }
    theirs_params = dict(theirs.named_parameters())
    worst = (0.0, "")
    for name, p in ours.blocks.named_parameters():
        worst = max(worst, (_max_diff(p.grad, _local_grad(theirs_params[name])), name))
    errors["param grad"] = worst[0]
    errors["param grad (worst)"] = worst[1]

    # -- timing: warm up, then interleave, each step started together -------------------
    sides = {"minitp": step_ours, "DTensor": step_theirs}
    for _ in range(warmup):
        for step in sides.values():
            step()
    times = {name: [] for name in sides}
    for i in range(steps):
        order = ("minitp", "DTensor") if i % 2 == 0 else ("DTensor", "minitp")
        for name in order:
            dist.barrier()  # not minitp.runtime.comm: the bench's own sync stays out of the trace
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    mt.trace.clear()  # minitp recorded its collectives as it always does; don't ship them
    # A step takes as long as its slowest rank.
    stacked = torch.tensor([times["minitp"], times["DTensor"]], dtype=torch.float64)
    dist.all_reduce(stacked, op=dist.ReduceOp.MAX)
    return {"errors": errors, "minitp": stacked[0].tolist(), "DTensor": stacked[1].tolist()}


def _bench_tp(tp, sps, cfg_kw, batch, steps, warmup, seed):
    """Everything for one tp size, in one launch: each SP setting in turn."""
    return {sp: _compare(cfg_kw, tp, sp, batch, steps, warmup, seed) for sp in sps}


# float32, relative to the largest entry of each tensor: the shards sum dot products
# in a different order than one device does; measured worst cases are ~3e-7 (the
# table's last column).
TOLERANCE = 1e-5


class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    pass


def main(argv=None) -> None:
    first, *rest = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        description=first, epilog="\n\n".join(rest[-2:]),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4], help="tensor-parallel sizes")
    parser.add_argument("--sp", choices=["off", "on"], nargs="+", default=["off", "on"],
                        help="sequence parallelism settings to run")
    parser.add_argument("--steps", type=int, default=16,
                        help="timed steps per side (interleaved)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    parser.add_argument("--d-model", type=int, default=256, help="hidden size h")
    parser.add_argument("--n-head", type=int, default=4, help="attention heads (tp divides it)")
    parser.add_argument("--n-layer", type=int, default=4, help="transformer blocks")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")

    cfg_kw = dict(vocab_size=256, seq_len=args.seq_len, n_layer=args.n_layer,
                  n_head=args.n_head, d_model=args.d_model, dropout=0.0)
    sps = [s == "on" for s in args.sp]
    for tp in args.tp:  # a bad size fails here, before any process starts
        for sp in sps:
            mt.check_parallel_config(mt.GPTConfig(**cfg_kw), tp=tp, sequence_parallel=sp)

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"torch {torch.__version__}, gloo on CPU, {cores} cores; blocks of "
          f"d_model={args.d_model} n_head={args.n_head} n_layer={args.n_layer}, "
          f"batch={args.batch} x seq_len={args.seq_len}; {args.steps} timed steps per side "
          f"after {args.warmup} warm-up")
    rows = []
    started = time.perf_counter()
    for tp in args.tp:
        run = mt.launch(_bench_tp, tp, tp, sps, cfg_kw, args.batch, args.steps, args.warmup,
                        args.seed, timeout=600)
        for sp in sps:
            result = run[0][sp]
            errors = result["errors"]
            numeric = {k: v for k, v in errors.items() if isinstance(v, float)}
            worst = max(numeric.values())
            if worst > TOLERANCE:
                raise SystemExit(f"tp={tp} sp={sp}: minitp and DTensor disagree: {errors}")
            ours, theirs = result["minitp"], result["DTensor"]
            # Each step's pair ran back to back, under the same outside load.
            pairs = sorted(o / t for o, t in zip(ours, theirs, strict=True))
            q1, _, q3 = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs * 3
            rows.append((tp, "on" if sp else "off", statistics.median(ours) * 1e3,
                         statistics.median(theirs) * 1e3,
                         statistics.median(ours) / statistics.median(theirs),
                         f"{q1:.2f}-{q3:.2f}", worst))

    header = ("tp", "sp", "minitp ms", "DTensor ms", "ratio", "pairs q1-q3", "max rel diff")
    widths = (3, 3, 9, 10, 6, 11, 12)
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for tp, sp, ours_ms, theirs_ms, ratio, pairs, worst in rows:
        cells = (tp, sp, f"{ours_ms:.1f}", f"{theirs_ms:.1f}", f"{ratio:.2f}x", pairs,
                 f"{worst:.1g}")
        print(" | ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    print(f"ratio = minitp / DTensor median step time (< 1: minitp faster); "
          f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
