"""minitp's MoE layer beside a Mixtral-style loop over experts, and an expert-parallel
step's time split into compute and all-to-all, in one run.

    python bench/moe_layer.py                  # CPU: 4096 tokens, d 256, E 8 and 32 (~1 min)
    python bench/moe_layer.py --preset gpu     # a GPU: 16384 tokens, d 1024, E 8 and 64
    python bench/moe_layer.py --quick          # a few seconds: small shapes, for the test

Part 1, one process. One forward + backward of `minitp.model.moe.MoE` (dropless, top-2,
softmax router, balance "none", so no auxiliary loss) beside a peer written the way
popular implementations write it: Hugging Face transformers' `MixtralSparseMoeBlock`
(src/transformers/models/mixtral/modeling_mixtral.py) loops over the experts, finds
each one's tokens with `torch.where` and adds its weighted output back with
`index_add_`; each expert is its own pair of `nn.Linear`. The peer gets a copy of
minitp's router and the experts' weights, so both compute the same routing and the same
outputs (checked before anything is timed): the comparison is the dispatch only —
minitp sorts the assignments by expert once (`permute`), runs the experts on contiguous
runs of rows, and un-permutes with one `index_add`. The input's gradient is computed too,
as in a model. The two take turns step by step (round robin); the figure is the median.
Peak memory: on a GPU `torch.cuda.max_memory_allocated` over three steps, both layers and
the input already built; on the CPU the growth of a fresh process's peak resident set
(VmHWM) over the same three steps, each row in a process of its own (as
bench/gpt_step.py measures), with glibc's mmap threshold fixed at 64 KiB so that a freed
tensor's pages go back to the system: glibc's own threshold rises as large blocks are
freed, its heap then keeps them, and the peak swings by tens of MiB from run to run
(`--glibc-default-heap` measures it so).
The goal (issue 23): at most 1.1× the peer's time and peak memory.

Part 2, expert parallelism. One `mt.launch` of a small MoE GPT on `Mesh(dp=4, ep=4)`
(gloo, 4 ranks on this machine's CPU), a few `mt.train_step`s; from each rank's trace the
step's wall time, the time inside all-to-alls (the "moe counts", "moe dispatch" and "moe
combine" events, forward and backward), the other collectives (the data-parallel
all-reduces), and the rest, called compute here. Beside it, a MODEL of those
all-to-alls: their number × α + bytes × β, the bytes from `mt.calc.moe_all_to_all_bytes`
(uniform routing; the trace's own ``model_bytes`` printed beside), α and β fitted in the
same launch to all-to-alls of known sizes on the same ranks (per size the slowest rank's
median). Four ranks share this machine's cores, so the measured all-to-all time also
holds waiting for the slowest rank: compare the columns of one run, not of two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn

import minitp as mt
from minitp.model.moe import MoE
from minitp.runtime._device import synchronize

PRESETS = {  # (tokens, d_model, experts to try, repetitions)
    "cpu": (4096, 256, (8, 32), 9),
    "gpu": (16384, 1024, (8, 64), 20),
    "quick": (512, 64, (4,), 3),
}
ROWS = ("peer (loop over experts)", "minitp MoE")


# --------------------------------------------------------------------------- the peer
class PeerMoE(nn.Module):
    """Mixtral's loop over experts (transformers' MixtralSparseMoeBlock), GELU MLPs."""

    def __init__(self, router: nn.Module, experts: list[nn.Module]):
        super().__init__()
        self.router = router
        self.experts = nn.ModuleList(experts)

    def forward(self, x):
        B, T, C = x.shape
        tokens = x.reshape(B * T, C)
        topk_idx, gates, _ = self.router(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            idx, slot = torch.where(topk_idx == e)
            if idx.numel() == 0:
                continue
            out.index_add_(0, idx, expert(tokens[idx]) * gates[idx, slot, None])
        return out.view(B, T, C)


def _peer_expert(ex, e: int) -> nn.Module:
    d, hidden = ex.fc_weight.shape[1:]
    fc, proj = nn.Linear(d, hidden), nn.Linear(hidden, d)
    with torch.no_grad():
        fc.weight.copy_(ex.fc_weight[e].T)
        fc.bias.copy_(ex.fc_bias[e])
        proj.weight.copy_(ex.proj_weight[e].T)
        proj.bias.copy_(ex.proj_bias[e])
    return nn.Sequential(fc, nn.GELU(), proj)


def build(row: str, d: int, E: int, device) -> nn.Module:
    torch.manual_seed(0)
    cfg = mt.GPTConfig(d_model=d, n_head=1, n_experts=E, top_k=2, balance="none")
    moe = MoE(cfg)
    if row == ROWS[0]:
        router = MoE(cfg).router  # a fresh module, then minitp's weights
        router.load_state_dict(moe.router.state_dict())
        moe = PeerMoE(router, [_peer_expert(moe.experts, e) for e in range(E)])
    return moe.to(device).train()


def inputs(tokens: int, d: int, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens // 256 or 1, min(tokens, 256), d, generator=g)
    grad = torch.randn(x.shape, generator=g)
    return x.to(device).requires_grad_(), grad.to(device)


def step(layer, x, grad):
    layer.zero_grad(set_to_none=True)
    x.grad = None
    layer(x).backward(grad)


def check_equal(layers, x, grad) -> None:
    """The same outputs and gradients (float32 rounding) before anything is timed."""
    outs = []
    for layer in layers.values():
        step(layer, x, grad)
        outs.append((layer(x).detach(), x.grad.clone(), layer.router.gate.weight.grad.clone()))
    for a, b in zip(*outs, strict=True):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise SystemExit(f"the rows disagree before timing: {(a - b).abs().max():.2e}")


def time_rows(d, E, tokens, reps, device) -> dict[str, float]:
    layers = {row: build(row, d, E, device) for row in ROWS}
    x, grad = inputs(tokens, d, device)
    check_equal(layers, x, grad)
    for layer in layers.values():  # warm-up
        step(layer, x, grad)
    seconds = {row: [] for row in ROWS}
    for _ in range(reps):
        for row, layer in layers.items():
            synchronize(device)
            start = time.perf_counter()
            step(layer, x, grad)
            synchronize(device)
            seconds[row].append(time.perf_counter() - start)
    return {row: statistics.median(t) for row, t in seconds.items()}


def _peak_resident_bytes() -> int:
    """This process's peak resident set (VmHWM), which starts afresh at exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory needs Linux")


def peak_bytes(row, d, E, tokens, device) -> int:
    """Peak memory of three forward + backward steps of `row`, both layers and the input
    already built (so that memory freed while building is the same for both)."""
    layers = {r: build(r, d, E, device) for r in ROWS}  # both kept alive
    layer = layers[row]
    x, grad = inputs(tokens, d, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _peak_resident_bytes()
    for _ in range(3):
        step(layer, x, grad)
    synchronize(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() - before
    return _peak_resident_bytes() - before


def peak_bytes_in_a_fresh_process(row, d, E, tokens, glibc_default: bool) -> int:
    """glibc's heap keeps freed blocks below its mmap threshold, a threshold it raises
    as large blocks are freed: the peak resident set then swings by tens of MiB from run
    to run. Fixed at 64 KiB, every tensor's pages go back to the OS when it is freed,
    and the peak is that of the tensors (`--glibc-default-heap`: as glibc leaves it)."""
    env = dict(os.environ) if glibc_default else {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, __file__, "--measure-peak", row, "--shape",
                          f"{d},{E},{tokens}"], capture_output=True, text=True, timeout=600,
                         check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


def part1(preset: str, device, glibc_default: bool) -> list[str]:
    tokens, d, experts, reps = PRESETS[preset]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"Part 1: one MoE layer, forward + backward, float32; {tokens} tokens, d {d}, "
          f"top-2, dropless; {name}, torch {torch.__version__}; median of {reps}, round robin",
          flush=True)
    print(f"| E | {ROWS[0]} | {ROWS[1]} | time ×peer | peak, peer | peak, minitp "
          "| peak ×peer |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for E in experts:
        seconds = time_rows(d, E, tokens, reps, device)
        peaks = {row: (peak_bytes(row, d, E, tokens, device) if device.type == "cuda"
                       else peak_bytes_in_a_fresh_process(row, d, E, tokens, glibc_default))
                 for row in ROWS}
        peer, mine = ROWS
        t, m = seconds[mine] / seconds[peer], peaks[mine] / max(peaks[peer], 1)
        print(f"| {E} | {seconds[peer] * 1e3:.1f} ms | {seconds[mine] * 1e3:.1f} ms | {t:.2f} "
              f"| {peaks[peer] / 2**20:.0f} MiB | {peaks[mine] / 2**20:.0f} MiB | {m:.2f} |",
              flush=True)
        ratios.append(f"E {E}: minitp / peer: time {t:.2f}×, peak memory {m:.2f}×")
    return ratios


# --------------------------------------------------------------------------- part 2
def _fit_line(sizes, seconds):
    """Least squares t = α + bytes·β."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    beta = sum((s - mx) * (t - my) for s, t in zip(sizes, seconds, strict=True)) / \
        sum((s - mx) ** 2 for s in sizes)
    return my - beta * mx, beta


def _ep_work(steps: int, shape) -> dict:
    from minitp.runtime import comm, trace
    vocab, seq, layers, d, E, batch = shape
    mesh = mt.Mesh(dp=4, ep=4)
    cfg = mt.GPTConfig(vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=4, d_model=d,
                       n_experts=E, top_k=2)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg), mesh).to(mt.device())
    opt = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(mt.device())
    y = torch.randint(0, vocab, (batch, seq), generator=g).to(mt.device())
    mt.train_step(model, (x, y), mesh, opt)  # warm-up, not counted
    walls = []
    trace.clear()
    for _ in range(steps):
        comm.barrier(mesh.dp)
        start = trace.recorder().now()
        mt.train_step(model, (x, y), mesh, opt)
        walls.append((start, trace.recorder().now()))
    events = [e for e in trace.events()  # those inside a step (not the barriers)
              if any(a <= e.start and e.end <= b for a, b in walls)]
    # α, β: all-to-alls of known sizes on the same group, each the median of 5
    fit_sizes, fit_seconds = [], []
    axis = mesh.ep
    with trace.paused():
        for rows in (16, 256, 1024, 4096):
            buf = torch.randn(rows * axis.size, d, device=mt.device())
            times = []
            for _ in range(5):
                comm.barrier(axis)
                t0 = time.perf_counter()
                comm.all_to_all(buf, axis, [rows] * axis.size, [rows] * axis.size)
                times.append(time.perf_counter() - t0)
            fit_sizes.append(rows * (axis.size - 1) * d * buf.element_size())
            fit_seconds.append(statistics.median(times))
    a2a = [e for e in events if e.op == "all_to_all"]
    others = [e for e in events if e.is_comm and e.op != "all_to_all"]
    return {"walls": walls, "a2a": [(e.start, e.end, e.model_bytes, e.label) for e in a2a],
            "other": [(e.start, e.end) for e in others],
            "fit": (fit_sizes, fit_seconds)}


def part2(steps: int, shape) -> None:
    vocab, seq, layers, d, E, batch = shape
    print(f"\nPart 2: Mesh(dp=4, ep=4), gloo, 4 ranks on this machine; GPT of {layers} MoE "
          f"layers, d {d}, E {E}, top-2, seq {seq}, batch {batch}, float32; "
          f"{steps} train_steps", flush=True)
    run = mt.launch(_ep_work, 4, steps, shape, backend="gloo", timeout=300)
    # α, β of the all-to-all: per size, the slowest rank's median (it ends when all have)
    sizes = run[0]["fit"][0]
    slowest = [max(res["fit"][1][i] for res in run) for i in range(len(sizes))]
    alpha, beta = _fit_line(sizes, slowest)
    tokens = batch // 4 * seq  # one dp rank's tokens per step
    uniform = layers * mt.calc.moe_all_to_all_bytes(tokens, 2, d, 4, 4, E)["per_layer_step"]
    print("| rank | step | all-to-all | other collectives | compute (the rest) | all-to-alls "
          "| bytes sent (trace) | MODEL bytes, uniform routing | MODEL all-to-all time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rank, res in enumerate(run):
        wall = sum(b - a for a, b in res["walls"]) / steps
        a2a = sum(b - a for a, b, *_ in res["a2a"]) / steps
        other = sum(b - a for a, b in res["other"]) / steps
        count = len(res["a2a"]) / steps
        nbytes = sum(m for _, _, m, _ in res["a2a"]) / steps
        model = count * alpha + uniform * beta
        print(f"| {rank} | {wall * 1e3:.1f} ms | {a2a * 1e3:.1f} ms | {other * 1e3:.1f} ms "
              f"| {(wall - a2a - other) * 1e3:.1f} ms | {count:.0f} | {nbytes / 1e3:.1f} kB "
              f"| {uniform / 1e3:.1f} kB | {model * 1e3:.1f} ms |")
    print(f"Per step, the mean of {steps}. MODEL time: all-to-alls × α + bytes × β, with "
          f"α {alpha * 1e6:.0f} µs and β {beta * 1e9:.2f} ns/byte fitted in the same launch "
          f"(all-to-alls of {sizes[0] / 1e3:.0f} kB to {sizes[-1] / 1e3:.0f} kB sent per rank; "
          "the slowest rank's median), bytes from mt.calc.moe_all_to_all_bytes. The "
          "measured all-to-all also holds the wait for the slowest rank: four ranks "
          "share this machine's cores.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help="shapes (default: gpu on a GPU, cpu on the CPU)")
    parser.add_argument("--quick", action="store_true", help="the quick preset, 2 steps")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ep-steps", type=int, default=3)
    parser.add_argument("--no-ep", action="store_true", help="part 1 only")
    parser.add_argument("--glibc-default-heap", action="store_true",
                        help="CPU peak memory with glibc's own mmap threshold (noisier)")
    parser.add_argument("--measure-peak", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.measure_peak:
        d, E, tokens = (int(v) for v in args.shape.split(","))
        print(peak_bytes(args.measure_peak, d, E, tokens, device))
        return
    preset = "quick" if args.quick else args.preset or ("gpu" if device.type == "cuda" else "cpu")
    ratios = part1(preset, device, args.glibc_default_heap)
    if not args.no_ep:
        shape = (64, 16, 2, 32, 8, 16) if args.quick else (256, 64, 2, 64, 8, 32)
        part2(2 if args.quick else args.ep_steps, shape)
    print()
    for line in ratios:
        print(line)


if __name__ == "__main__":
    main()
