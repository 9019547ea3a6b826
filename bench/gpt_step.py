"""One training step of minitp's GPT beside a nanoGPT-style peer, in one run.

    python bench/gpt_step.py                       # CPU, a small model (a few minutes)
    python bench/gpt_step.py --preset gpt2-small   # GPT-2 small, batch 8 × 1024 (a GPU)
    python bench/gpt_step.py --preset 1.2b         # h 1536, 40 layers, 16 heads, s 1024
    python bench/gpt_step.py --arch llama          # the Llama-style GPT beside a Llama peer
    python bench/gpt_step.py --profile             # also each row's top kernels (profile_step)

What is compared. The peer is written here, as nanoGPT writes it: one fused qkv
linear split into q, k, v, `F.scaled_dot_product_attention`, GELU MLP, pre-LN,
learned positions, the output tied to the token embedding. Beside it, on the
same shapes with the same weights (copied, the qkv rows reordered to the peer's
(q/k/v, head, dim) layout): minitp's plain `mt.GPT` with the attention core
written out ("math") and fused ("sdpa"), and `mt.parallelize`d at world 1 (one
process group of one rank, in this process), "sdpa". The first step's losses
are checked equal before anything is timed, so the rows do the same arithmetic.

One timed step: zero the gradients, forward, loss, backward, AdamW step — in
float32, and in bfloat16 autocast (parameters and optimizer state float32).
The models take turns step by step (round robin), so a slow moment of a shared
machine lands on all of them; the figure is the median. Peak memory: on a GPU
`torch.cuda.max_memory_allocated` around one model's steps; on the CPU the
growth of the process's peak resident set (VmHWM) while one model is built
and stepped, each model in a fresh process of its own (the allocator keeps freed
memory, so a second model in the same process would read as free).

The last lines are the ratios (minitp ÷ peer). The goals (issue 37, tightening issue
11's): with "sdpa", step time ≤ 1.05× the peer's, and peak memory ≤ 0.95× on the CPU
preset and ≤ 0.9× in bf16 on a GPU — below the peer's, because minitp's loss runs chunk
by chunk over tokens (`minitp.model.cross_entropy`) where the peer's `F.cross_entropy`
holds whole-size float32 tensors; the parallel wrapper at world 1 ≤ 1.03× plain.
``--arch llama`` (issue 25): minitp's `GPTConfig.llama` (a
quarter as many K/V heads as query heads) beside a plain-PyTorch Llama-style peer
(`bench/llama_peer.py`: SDPA with grouped K/V), the same goal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from llama_peer import LlamaPeer, copy_from  # bench/ is on the path: this script's folder
from profile_step import profile_rows

import minitp as mt
from minitp.runtime._device import synchronize

PRESETS = {  # (n_layer, n_head, d_model, seq_len, batch, vocab)
    "cpu": (4, 4, 128, 128, 4, 4096),  # about a minute on two cores
    # GPT-2's vocabulary padded to a multiple of 64, as nanoGPT does
    "gpt2-small": (12, 12, 768, 1024, 8, 50304),
    "1.2b": (40, 16, 1536, 1024, 8, 50304),
}
ROWS = ("peer", "minitp math", "minitp sdpa", "minitp sdpa, parallelize (world 1)")


# --------------------------------------------------------------------------- the peer
class PeerBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Peer(nn.Module):
    def __init__(self, layers, heads, d, seq, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(PeerBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _copy_into_peer(peer: Peer, ref: mt.GPT) -> None:
    heads = ref.cfg.n_head
    with torch.no_grad():
        peer.wte.weight.copy_(ref.wte.weight)
        peer.wpe.weight.copy_(ref.wpe.weight)
        peer.ln_f.load_state_dict(ref.ln_f.state_dict())
        for mine, theirs in zip(peer.h, ref.blocks, strict=True):
            mine.ln_1.load_state_dict(theirs.ln1.state_dict())
            mine.ln_2.load_state_dict(theirs.ln2.state_dict())
            w, b = theirs.attn.qkv.weight, theirs.attn.qkv.bias
            d = w.shape[1]
            # minitp orders qkv rows (head, q/k/v, dim); nanoGPT (q/k/v, head, dim)
            mine.c_attn.weight.copy_(
                w.view(heads, 3, d // heads, d).transpose(0, 1).reshape(3 * d, d))
            mine.c_attn.bias.copy_(b.view(heads, 3, d // heads).transpose(0, 1).reshape(3 * d))
            mine.c_proj.load_state_dict(theirs.attn.proj.state_dict())
            mine.c_fc.load_state_dict(theirs.mlp.fc.state_dict())
            mine.mlp_proj.load_state_dict(theirs.mlp.proj.state_dict())


# --------------------------------------------------------------------------- the rows
def _world_of_one() -> None:
    if not dist.is_initialized():
        # one rank in this process: an in-memory store, nothing left on disk
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def build(row: str, shape, device, arch: str = "gpt2") -> nn.Module:
    layers, heads, d, seq, _, vocab = shape
    torch.manual_seed(0)
    attention = "math" if row == "minitp math" else "sdpa"
    sizes = dict(vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=heads, d_model=d,
                 attention=attention)
    if arch == "llama":
        cfg = mt.GPTConfig.llama(**sizes, n_kv_head=max(1, heads // 4))
        ref = mt.GPT(cfg)
        if row == "peer":
            peer = LlamaPeer(layers, heads, cfg.kv_heads, d, seq, vocab, cfg.ffn_width)
            copy_from(peer, ref)
            return peer.to(device)
    else:
        ref = mt.GPT(mt.GPTConfig(**sizes))
    if row == "peer":
        peer = Peer(layers, heads, d, seq, vocab)
        _copy_into_peer(peer, ref)
        return peer.to(device)
    if row.endswith("(world 1)"):
        _world_of_one()
        return mt.parallelize(ref, mt.Mesh(dp=1, pp=1, tp=1)).to(device)
    return ref.to(device)


def batch(shape, device, seed=1):
    *_, seq, b, vocab = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (b, seq), generator=g)
    return x.to(device), torch.roll(x, -1, dims=1).to(device)


def make_step(model, device, dtype):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def time_rows(shape, device, dtype, steps, arch="gpt2", profiled=False):
    x, y = batch(shape, device)
    models = {row: build(row, shape, device, arch) for row in ROWS}
    with torch.no_grad():  # the same arithmetic: the same first loss, to float32 rounding
        first = {row: m(x, y)[1].item() for row, m in models.items()}
    spread = max(first.values()) - min(first.values())
    if dtype == "fp32" and spread > 1e-4 * abs(first["peer"]):
        raise SystemExit(f"the rows disagree before timing: first losses {first}")
    steps_of = {row: make_step(m, device, dtype) for row, m in models.items()}
    for fn in steps_of.values():  # warm-up: allocator, kernels, AdamW state
        fn(x, y)
        fn(x, y)
    seconds = {row: [] for row in ROWS}
    for _ in range(steps):
        for row, fn in steps_of.items():
            synchronize(device)
            start = time.perf_counter()
            fn(x, y)
            synchronize(device)
            seconds[row].append(time.perf_counter() - start)
    if profiled:
        print(f"{dtype}: profile of each row ...", flush=True)
        profile_rows(steps_of, x, y, device)
    return {row: statistics.median(t) for row, t in seconds.items()}


def peak_bytes_here(row, shape, device, dtype, arch="gpt2") -> int:
    """Peak memory of building and stepping one model: in this process on a GPU."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model = build(row, shape, device, arch)
    step = make_step(model, device, dtype)
    x, y = batch(shape, device)
    for _ in range(3):
        step(x, y)
    synchronize(device)
    peak = torch.cuda.max_memory_allocated() - before
    del model, step
    return peak


def peak_bytes_in_a_fresh_process(row, preset, dtype, arch="gpt2") -> int:
    """On the CPU: a process of its own, the growth of its peak resident set."""
    out = subprocess.run([sys.executable, __file__, "--measure-peak", row, "--preset", preset,
                          "--dtype", dtype, "--device", "cpu", "--arch", arch],
                         capture_output=True, text=True, timeout=600, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _peak_resident_bytes() -> int:
    """This process's peak resident set (VmHWM), which starts afresh at exec; not
    ru_maxrss, which a child inherits from the parent it was forked from."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status: peak memory needs Linux")


def _measure_peak_here(row, shape, dtype, arch) -> int:
    device = torch.device("cpu")
    x, y = batch(shape, device)
    before = _peak_resident_bytes()
    model = build(row, shape, device, arch)
    step = make_step(model, device, dtype)
    for _ in range(3):
        step(x, y)
    return _peak_resident_bytes() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help="model and batch (default: gpt2-small on a GPU, cpu on the CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2",
                        help="llama: GPTConfig.llama beside a plain-PyTorch Llama-style peer")
    parser.add_argument("--profile", action="store_true",
                        help="also print each row's top kernels by self time (torch.profiler)")
    parser.add_argument("--measure-peak", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    preset = args.preset or ("gpt2-small" if device.type == "cuda" else "cpu")
    shape = PRESETS[preset]
    if args.measure_peak:
        print(_measure_peak_here(args.measure_peak, shape, args.dtype, args.arch))
        return
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    dtypes = ("fp32", "bf16") if args.dtype == "both" else (args.dtype,)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    layers, heads, d, seq, b, vocab = shape
    print(f"{args.arch}, {preset}: {layers} layers, {heads} heads, d {d}, seq {seq}, batch {b}, "
          f"vocab {vocab};"
          f" {name}, torch {torch.__version__}; median of {args.steps} steps, round robin",
          flush=True)
    figures, ratios = {}, []
    for dtype in dtypes:
        print(f"{dtype}: timing {len(ROWS)} models ...", flush=True)
        seconds = time_rows(shape, device, dtype, args.steps, args.arch, args.profile)
        print(f"{dtype}: peak memory, one model at a time ...", flush=True)
        peaks = {row: (peak_bytes_here(row, shape, device, dtype, args.arch)
                       if device.type == "cuda"
                       else peak_bytes_in_a_fresh_process(row, preset, dtype, args.arch))
                 for row in ROWS}
        figures[dtype] = {"seconds": seconds, "peak_bytes": peaks}
        print(f"\n{dtype}:")
        print(f"  {'':36} {'step':>10} {'×peer':>6} {'peak':>10} {'×peer':>6}")
        for row in ROWS:
            print(f"  {row:36} {seconds[row] * 1e3:8.1f}ms {seconds[row] / seconds['peer']:6.2f}"
                  f" {peaks[row] / 2**20:8.0f}MiB {peaks[row] / max(peaks['peer'], 1):6.2f}")
        plain, wrapped = seconds["minitp sdpa"], seconds["minitp sdpa, parallelize (world 1)"]
        ratios.append(f"{dtype}: minitp sdpa / peer: step time "
                      f"{plain / seconds['peer']:.2f}×, peak memory "
                      f"{peaks['minitp sdpa'] / max(peaks['peer'], 1):.2f}×; "
                      f"parallelize (world 1) / plain: {wrapped / plain:.2f}×")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "preset": preset, "device": name,
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                       "figures": figures}, f, indent=1)
    print()
    for line in ratios:
        print(line)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
