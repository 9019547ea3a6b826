"""Muon's step: minitp's one-process `mt.optim.Muon` beside `torch.optim.Muon`, and each
distributed strategy's training step beside AdamW's under ZeRO-1, in one run.

    python bench/muon_step.py                  # CPU: d 128, 4 layers; then 4 ranks (~1 min)
    python bench/muon_step.py --quick          # a few seconds: small shapes, 2 ranks, for the test

Part 1, one process. The hidden matrices of one ``mt.GPT`` (qkv, the attention projection,
the MLP's two: the parameters Muon takes), two copies, the same gradients, stepped by
``torch.optim.Muon`` and by minitp's `Muon` (lr 0.02, torch's defaults otherwise). Like for
like: torch runs Newton–Schulz in bfloat16, so the compared row is minitp's with
``ns_dtype=torch.bfloat16`` (the same arithmetic: one step of each is checked bit for bit
equal before anything is timed). minitp's own default on a float32 model, Newton–Schulz in
float32, is printed beside it (torch has no such option). Only the optimizer step is
timed (the gradients are already there); the rows take turns step by step (round robin) so
that load from other programs falls on all alike; each row's median and best are printed
(on a loaded machine the best of many is the step's own cost). The goal (issue 49): at most
1.1× torch's time.

Part 2, ranks. One `mt.launch` of a GPT on 4 CPU ranks (gloo) under ZeRO-1: AdamW on
``Mesh(dp=4)`` beside Muon's ``gather`` and ``owner`` there, and, since ``tp`` needs tp > 1,
AdamW, ``gather`` and ``tp`` on ``Mesh(dp=2, tp=2)``. Each setting's whole training step
(`mt.train_step`: forward, backward, reduce-scatter, the optimizer, the parameters'
all-gather) and, inside it, the optimizer's step (Muon's exchange and Newton–Schulz, or
AdamW's, then ZeRO-1's all-gather), each step's slowest rank, median and best over the
steps; the settings take turns step by step, each step after a barrier. Newton–Schulz's
FLOPs per rank (counted as they run, the most any rank ran): every rank runs every matrix
under gather, the dp ranks share them under owner. Four ranks share this machine's cores:
compare the rows of one run, not of two.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import minitp as mt
from minitp.optim import Muon, split_parameters

PRESETS = {  # one process: (d_model, n_layer, reps); ranks: (d_model, n_layer, steps, dp)
    "cpu": ((128, 4, 41), (128, 4, 12, 4)),
    "quick": ((32, 1, 2), (16, 1, 1, 2)),
}
LR = 0.02  # Muon's (torch's example); AdamW's below is 1e-3
ROWS = ("torch.optim.Muon (Newton–Schulz in bf16)", "minitp Muon, ns_dtype=bf16",
        "minitp Muon, Newton–Schulz in float32")


# --------------------------------------------------------------------------- one process
def one_process(d: int, n_layer: int, reps: int) -> dict[str, list[float]]:
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(vocab_size=256, seq_len=64, n_layer=n_layer,
                                n_head=max(1, d // 64), d_model=d))
    matrices, _ = split_parameters(model)
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(m.shape, generator=g) for m in matrices]
    copies = [[torch.nn.Parameter(m.detach().clone()) for m in matrices] for _ in ROWS]
    for params in copies:
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad
    optimizers = dict(zip(ROWS, (torch.optim.Muon(copies[0], lr=LR),
                                 Muon(copies[1], lr=LR, ns_dtype=torch.bfloat16),
                                 Muon(copies[2], lr=LR)), strict=True))
    for opt in optimizers.values():
        opt.step()  # the first step: also the momentum buffers made
    if not all(torch.equal(a, b) for a, b in zip(copies[0], copies[1], strict=True)):
        raise SystemExit("minitp's bf16 Muon is not torch's bit for bit: nothing to compare")
    seconds = {row: [] for row in ROWS}
    for _ in range(reps):
        for row, opt in optimizers.items():
            started = time.perf_counter()
            opt.step()
            seconds[row].append(time.perf_counter() - started)
    return seconds


# --------------------------------------------------------------------------- ranks
def settings(dp: int) -> list[tuple[dict, str, str | None]]:
    """(mesh sizes, optimizer, strategy): AdamW first on each mesh, its baseline."""
    wide, split = dict(dp=dp), dict(dp=dp // 2, tp=2)
    return [(wide, "AdamW", None), (wide, "Muon", "gather"), (wide, "Muon", "owner"),
            (split, "AdamW", None), (split, "Muon", "gather"), (split, "Muon", "tp")]


def _setting(cfg, sizes, optimizer, strategy):
    mesh = mt.Mesh(**sizes)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg), mesh, zero_stage=1)
    if optimizer == "AdamW":
        opt = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
    else:
        opt = mt.make_optimizer(model, mesh, "muon", strategy=strategy, lr=LR, adamw_lr=1e-3)
    opt_seconds = []
    step = opt.step

    def timed_step():  # the optimizer's share of `mt.train_step`
        started = time.perf_counter()
        step()
        opt_seconds.append(time.perf_counter() - started)

    opt.step = timed_step
    return model, mesh, opt, opt_seconds


def ranks(cfg, dp: int, batch: int, steps: int) -> dict:
    runs = [_setting(cfg, *s) for s in settings(dp)]
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1),
                           generator=torch.Generator().manual_seed(1))
    data = (tokens[:, :-1], tokens[:, 1:])
    for model, mesh, opt, _ in runs:  # warm-up
        mt.train_step(model, data, mesh, opt)
    seconds = [[] for _ in runs]
    for i in range(steps):
        order = range(len(runs)) if i % 2 == 0 else reversed(range(len(runs)))
        for k in order:
            model, mesh, opt, _ = runs[k]
            dist.barrier()
            started = time.perf_counter()
            mt.train_step(model, data, mesh, opt)
            seconds[k].append(time.perf_counter() - started)
    out = []
    for (_, _, opt, opt_seconds), step_seconds in zip(runs, seconds, strict=True):
        inner = getattr(opt, "inner", opt)
        numbers = torch.tensor([*step_seconds, *opt_seconds[1:],  # not the warm-up's
                                float(getattr(inner, "ns_flops", 0))], dtype=torch.float64)
        dist.all_reduce(numbers, op=dist.ReduceOp.MAX)  # each step's slowest rank; the most
        out.append((numbers[:steps].tolist(), numbers[steps:-1].tolist(),  # FLOPs a rank ran
                    float(numbers[-1])))
    return out


# --------------------------------------------------------------------------- tables
def _ms(seconds: list[float]) -> tuple[float, float]:
    """(median, best) in ms: on a shared, loaded machine another program's burst can slow
    any one step by 100×; the best of many is the step's own cost, the median what a run saw."""
    return statistics.median(seconds) * 1e3, min(seconds) * 1e3


def print_one_process(times: dict[str, list[float]], d: int, n_layer: int, reps: int) -> None:
    print(f"\nPart 1, one process: the hidden matrices of a GPT (d {d}, {n_layer} layers), "
          f"the optimizer step only, {reps} steps each (MEASURED)\n")
    print("| optimizer | median | × torch | best | × torch |")
    print("| --- | --- | --- | --- | --- |")
    base = _ms(times[ROWS[0]])
    for row, t in times.items():
        median, best = _ms(t)
        print(f"| {row} | {median:.2f} ms | {median / base[0]:.2f} | {best:.2f} ms "
              f"| {best / base[1]:.2f} |")
    median, best = _ms(times[ROWS[1]])
    print(f"\nminitp / torch, like for like (Newton–Schulz in bf16): {best / base[1]:.2f} best, "
          f"{median / base[0]:.2f} median (goal: ≤ 1.1)")


def print_ranks(rows: list, d: int, n_layer: int, steps: int, dp: int) -> None:
    print(f"\nPart 2, {dp} CPU ranks, ZeRO-1: a GPT (d {d}, {n_layer} layers), {steps} steps "
          f"each, each step's slowest rank (MEASURED)\n")
    print("| mesh | optimizer | train step, median | best | × AdamW (best) | optimizer step, "
          "median | best | × AdamW (best) | Newton–Schulz MFLOP per rank |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base = None
    for (sizes, optimizer, strategy), (step, opt, flops) in zip(settings(dp), rows, strict=True):
        step, opt = _ms(step), _ms(opt)
        if optimizer == "AdamW":
            base = (step[1], opt[1])
        mesh = " × ".join(f"{k} {v}" for k, v in sizes.items())
        name = f"Muon, {strategy}" if strategy else optimizer
        print(f"| {mesh} | {name} | {step[0]:.1f} ms | {step[1]:.1f} ms | {step[1] / base[0]:.2f} "
              f"| {opt[0]:.2f} ms | {opt[1]:.2f} ms | {opt[1] / base[1]:.2f} | {flops / 1e6:.1f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, 2 ranks")
    args = parser.parse_args(argv)
    (d1, layers1, reps), (d2, layers2, steps, dp) = PRESETS["quick" if args.quick else "cpu"]
    print(f"torch {torch.__version__}, float32, {torch.get_num_threads()} threads")
    print_one_process(one_process(d1, layers1, reps), d1, layers1, reps)
    cfg = mt.GPTConfig(vocab_size=256, seq_len=32, n_layer=layers2, n_head=4, d_model=d2)
    rows = mt.launch(ranks, dp, cfg, dp, 8, steps, timeout=600)[0]
    print_ranks(rows, d2, layers2, steps, dp)


if __name__ == "__main__":
    main()
