"""Cached decoding: minitp's one-process decode beside a plain-PyTorch peer, in one run.

    python bench/decode.py                  # CPU: 4 layers, d 256, 4 heads, vocabulary 4096
    python bench/decode.py --steps 96 --rounds 9

What is compared. The peer is written the usual way for inference: a GPT-2 with a
preallocated (B, heads, seq_len, head_dim) K and V per layer, the new positions written
into them, `F.scaled_dot_product_attention` over the filled part, logits of the last
position only, greedy argmax. Beside it minitp's plain `mt.GPT` (attention="sdpa") driven
by `minitp.serving.generate` — its `KVCache`, its `Decoder`, its `draw` — the same weights
(copied as `bench/gpt_step.py` copies them). Before timing, the two must pick the same
greedy tokens.

One timed unit: a prefill of --prompt tokens (not timed), then --steps decode steps (timed):
time per token = their time / steps. The rows take turns round by round, so a slow moment of
a shared machine lands on both; the figure is the median over --rounds. The last lines are
the ratios minitp ÷ peer at batch 1 and 16; the goal (issue 41) is ≤ 1.1×.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from gpt_step import PeerBlock, _copy_into_peer  # bench/ is on the path: this script's folder

import minitp as mt
from minitp.serving import generate


class DecodePeer(nn.Module):
    """nanoGPT's modules (`bench/gpt_step.py`'s peer blocks), run with a preallocated cache."""

    def __init__(self, layers, heads, d, seq, vocab):
        super().__init__()
        self.heads, self.seq = heads, seq
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(PeerBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def new_cache(self, batch):
        d = self.wte.weight.shape[1]
        shape = (batch, self.heads, self.seq, d // self.heads)
        self.k = [torch.zeros(shape) for _ in self.h]
        self.v = [torch.zeros(shape) for _ in self.h]

    def forward(self, idx, pos):  # idx (B, T) at positions pos..pos+T-1 -> (B, V) last logits
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(pos, pos + T))
        for block, k_cache, v_cache in zip(self.h, self.k, self.v, strict=True):
            h = block.ln_1(x)
            C = h.shape[-1]
            q, k, v = block.c_attn(h).split(C, dim=2)
            q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
            k_cache[:, :, pos:pos + T] = k
            v_cache[:, :, pos:pos + T] = v
            y = F.scaled_dot_product_attention(q, k_cache[:, :, :pos + T], v_cache[:, :, :pos + T],
                                               is_causal=T > 1)
            x = x + block.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            x = x + block.mlp_proj(F.gelu(block.c_fc(block.ln_2(x))))
        return self.ln_f(x[:, -1]) @ self.wte.weight.T


def peer_generate(peer, prompt, steps):
    """(tokens (B, T0 + steps + 1), seconds of the decode steps): greedy."""
    with torch.no_grad():
        peer.new_cache(prompt.shape[0])
        token = peer(prompt, 0).argmax(-1)
        out, pos = [prompt, token[:, None]], prompt.shape[1]
        started = time.perf_counter()
        for _ in range(steps):
            token = peer(token[:, None], pos).argmax(-1)
            pos += 1
            out.append(token[:, None])
        return torch.cat(out, 1), time.perf_counter() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    layers, heads, d, seq, vocab = 4, 4, 256, args.prompt + args.steps + 1, 4096
    torch.manual_seed(0)
    cfg = mt.GPTConfig(vocab_size=vocab, seq_len=seq, n_layer=layers, n_head=heads, d_model=d,
                       attention="sdpa")
    ref = mt.GPT(cfg).eval()
    peer = DecodePeer(layers, heads, d, seq, vocab).eval()
    _copy_into_peer(peer, ref)
    result = {}
    for batch in (1, 16):
        prompt = torch.randint(0, vocab, (batch, args.prompt),
                               generator=torch.Generator().manual_seed(batch))
        mine = generate(ref, prompt, args.steps + 1)
        theirs, _ = peer_generate(peer, prompt, args.steps)
        agree = float((mine.tokens == theirs).float().mean())
        if agree < 0.99:  # float32: a near tie may fall either way, rarely
            raise SystemExit(f"batch {batch}: the rows pick different tokens ({agree:.1%} agree)")
        times = {"peer": [], "minitp": []}
        for _ in range(args.rounds):
            times["peer"].append(peer_generate(peer, prompt, args.steps)[1] / args.steps)
            mine = generate(ref, prompt, args.steps + 1, keep_logits=False)
            times["minitp"].append(mine.decode_s / args.steps)
        med = {row: statistics.median(t) for row, t in times.items()}
        result[batch] = {"peer_ms_per_token": round(1e3 * med["peer"], 3),
                         "minitp_ms_per_token": round(1e3 * med["minitp"], 3),
                         "ratio": round(med["minitp"] / med["peer"], 3)}
        print(f"batch {batch:2d}: peer {1e3 * med['peer']:.3f} ms/token, minitp "
              f"{1e3 * med['minitp']:.3f} ms/token: {med['minitp'] / med['peer']:.2f}× the peer")
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "shape": dict(layers=layers, heads=heads, d=d, vocab=vocab), **result}))


if __name__ == "__main__":
    main()
