"""One training step: minitp's ZeRO-3 beside PyTorch's FSDP2 on the same model, in one run.

What is compared. One plain ``mt.GPT`` (same seed, same weights on every rank), trained on
``--dp`` data-parallel CPU ranks (gloo) two ways in the same processes:

* minitp: ``mt.parallelize(ref, mt.Mesh(dp=dp), zero_stage=3)`` stepped by ``mt.train_step``
  with ``mt.make_optimizer(..., torch.optim.AdamW)`` — units (embedding, positions, each
  block, final norm) flattened, gathered around use, gradients reduce-scattered;
* torch: ``mt.torch_parallel.parallelize(ref, mesh)`` — FSDP2's ``fully_shard`` on each
  block and on the root — stepped by ``mt.torch_parallel.train_step`` with
  ``torch.optim.AdamW(model.parameters())``.

One timed step, either side: zero the gradients, forward, loss, backward (with the
sharded collectives), AdamW step, the batch's loss all-reduced over dp. float32.

Why it is fair. Both start from the same weights; the first step's losses must agree to
float32 rounding, or the bench stops. Then the sides take turns step by step (minitp,
torch, torch, minitp, ...), each step started after a barrier, so that load from other
programs on a shared machine falls on both alike. A step's time is the slowest rank's;
each side's median is reported. minitp's first step checks that the ranks' calls agree
(`mt.comm.checks`); the timed steps run without that exchange.

How to read the ratio: minitp ms / torch ms per step; above 1.0 minitp is slower. The
goal (issue 40): within 1.1× either way.

    python bench/fsdp_step.py                         # dp 4, 4 layers, d 128, s 128
    python bench/fsdp_step.py --dp 2 --steps 30 --d-model 256
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import minitp as mt
import minitp.torch_parallel as tpar


def _sides(cfg, dp):
    mesh = mt.Mesh(dp=dp)
    torch.manual_seed(0)
    ref = mt.GPT(cfg)
    ours = mt.parallelize(ref, mesh, zero_stage=3)
    our_opt = mt.make_optimizer(ours, mesh, torch.optim.AdamW, lr=1e-3)
    theirs = tpar.parallelize(ref, mesh)
    their_opt = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    return {"minitp": lambda b: mt.train_step(ours, b, mesh, our_opt),
            "torch": lambda b: tpar.train_step(theirs, b, their_opt)}


def _run(cfg, dp, batch, steps):
    sides = _sides(cfg, dp)
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1),
                           generator=torch.Generator().manual_seed(1))
    data = (tokens[:, :-1], tokens[:, 1:])
    with mt.comm.checks(True):
        first = {name: step(data) for name, step in sides.items()}
    if abs(first["minitp"] - first["torch"]) > 1e-5 * abs(first["torch"]):
        raise SystemExit(f"the first step's losses disagree: {first}")
    times = {name: [] for name in sides}
    with mt.comm.checks(False):
        for i in range(steps):
            for name in (("minitp", "torch") if i % 2 == 0 else ("torch", "minitp")):
                dist.barrier()
                started = time.perf_counter()
                sides[name](data)
                times[name].append(time.perf_counter() - started)
    slowest = torch.tensor([times["minitp"], times["torch"]], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"minitp": slowest[0].tolist(), "torch": slowest[1].tolist(), "first": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    cfg = mt.GPTConfig(vocab_size=args.vocab, seq_len=args.seq_len, n_layer=args.n_layer,
                       n_head=args.n_head, d_model=args.d_model)
    result = mt.launch(_run, args.dp, cfg, args.dp, args.batch, args.steps, timeout=600)[0]
    ours, theirs = statistics.median(result["minitp"]), statistics.median(result["torch"])
    pairs = sorted(a / b for a, b in zip(result["minitp"], result["torch"], strict=True))
    q1, q3 = pairs[len(pairs) // 4], pairs[(3 * len(pairs)) // 4]
    print(f"dp={args.dp} layers={args.n_layer} d={args.d_model} s={args.seq_len} "
          f"batch={args.batch} vocab={args.vocab}, {args.steps} steps each, float32")
    print(f"first step's loss: minitp {result['first']['minitp']:.6f}, "
          f"torch {result['first']['torch']:.6f}")
    print(f"minitp ZeRO-3 {ours * 1e3:.1f} ms, torch FSDP2 {theirs * 1e3:.1f} ms, "
          f"ratio {ours / theirs:.2f} (pairs q1-q3 {q1:.2f}-{q3:.2f}; > 1: minitp slower)")


if __name__ == "__main__":
    main()
