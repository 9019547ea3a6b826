"""Lab: long sequences — what sequence parallelism leaves whole, and what context
parallelism splits (lesson 08).

* `memory_vs_length`: one launch of 4 ranks; a one-layer GPT in bfloat16 runs one
  forward pass under the `ActivationLedger` (MEASURED) for each sequence length,
  three ways: t = 2 with sequence parallelism ("SP"), the same with selective
  recomputation ("SP+selective"), and t = 2 with c = 2 context parallelism
  ("SP+CP"). Each row carries `minitp.calc`'s bytes for the same setting, a MODEL,
  and the ledger's entries sorted by how much of the sequence they hold
  (`sequence_share`).
* `ring_trace`: ring attention alone at cp = 4, forward and backward, for its trace
  (what `minitp.course.viz.ring` draws).
* `ring_work`: a ring over cp ranks with the sequence split two ways: contiguous
  (rank r holds chunks 2r and 2r+1) and load-balanced (chunks r and 2cp−1−r, as
  `minitp.context_parallel` does). Every block each rank computes is counted as
  it is computed (blocks, query·key scores, seconds): the per-rank work,
  MEASURED. The ring is built from `minitp.context_parallel`'s own pieces (the
  block kinds, the block forward, the log-sum-exp merge), forward only, and its
  output is checked against plain causal attention on the same ranks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ...calc.footprint.memory import activation_bytes_per_layer
from ...memory.activations import ActivationLedger
from ...rules import cp_chunks, layer_label

SETTINGS = ("SP", "SP+selective", "SP+CP")
_MESH = {"SP": {"dp": 2, "tp": 2}, "SP+selective": {"dp": 2, "tp": 2},
         "SP+CP": {"cp": 2, "tp": 2}}
_RECOMPUTE = {"SP": None, "SP+selective": "selective", "SP+CP": None}
_TAG = 1 << 23  # this lab's ring messages


# --------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class MemoryRow:
    setting: str
    seq_len: int
    measured: int  # bytes autograd keeps for layer 0 on rank 0 (the ledger)
    model: float  # minitp.calc.activation_bytes_per_layer for the same setting: a MODEL
    share: dict  # measured bytes by (part of the layer, `sequence_share` kind)


def sequence_share(shape: tuple[int, ...], seq_len: int, local: int) -> str:
    """How much of the sequence a saved tensor of `shape` holds, with `seq_len` the
    whole sequence and `local` a rank's part of it: "s x s" (two whole-sequence
    dims: scores, probabilities, the causal mask), "whole" (one), "split" (a part
    only) or "other". Needs micro-batch 1 and widths unequal to the lengths."""
    whole = sum(d == seq_len for d in shape)
    if whole >= 2:
        return "s x s"
    if whole == 1:
        return "whole"
    return "split" if local in shape else "other"


def _part(module: str) -> str:
    return "attention" if ".attn" in module else "MLP" if ".mlp" in module else "LayerNorms"


def model_bytes(cfg, setting: str) -> float:
    """MODEL: calc's per-layer activation bytes (Korthikanti et al. 2022, 16-bit,
    1-byte dropout masks) at t = 2 with sequence parallelism. For "SP+CP" the
    selective row divided by c = 2: minitp's ring keeps no probabilities (it
    recomputes them from the saved log-sum-exp), as calc's docstring says."""
    if setting == "SP":
        return activation_bytes_per_layer(cfg, 1, tp=2, sp=True)
    if setting == "SP+selective":
        return activation_bytes_per_layer(cfg, 1, tp=2, sp=True, recompute="selective")
    return activation_bytes_per_layer(cfg, 1, tp=2, sp=True, recompute="selective", cp=2)


def _ledgers(cfgs, seed: int):
    """On each of 4 ranks: one forward per (length, setting) under a ledger."""
    from ...context_parallel.split import split_sequence
    from ...model import GPT
    from ...parallelize import parallelize
    from ...runtime._device import device
    from ...runtime.mesh import Mesh

    meshes = {name: Mesh(**sizes) for name, sizes in (("dp2tp2", _MESH["SP"]),
                                                      ("cp2tp2", _MESH["SP+CP"]))}
    out = {}
    for cfg in cfgs:
        torch.manual_seed(seed)
        ref = GPT(cfg).to(device=device(), dtype=torch.bfloat16)
        x = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len), device=device())
        for setting in SETTINGS:
            mesh = meshes["cp2tp2" if setting == "SP+CP" else "dp2tp2"]
            model = parallelize(ref, mesh, sequence_parallel=True,
                                recompute=_RECOMPUTE[setting])
            mine = split_sequence(x, mesh.cp)
            with ActivationLedger(model) as ledger:
                model(mine, mine)
            local = cfg.seq_len // (mesh.cp.size * mesh.tp.size)
            share: dict[str, int] = {}
            for e in ledger.layer(layer_label(0)):
                key = (_part(e.module), sequence_share(e.shape, cfg.seq_len, local))
                share[key] = share.get(key, 0) + e.nbytes
            out[(setting, cfg.seq_len)] = (ledger.per_layer()[layer_label(0)], share)
            del model
    return out


def memory_vs_length(cfg, seq_lens=(64, 128, 256), seed: int = 0,
                     timeout: float = 120.0) -> list[MemoryRow]:
    """Activation bytes per layer on rank 0, MEASURED by the ledger, for each
    sequence length and setting (`SETTINGS`), with calc's MODEL beside. `cfg`: a
    one-layer GPT without dropout (the ring refuses attention dropout); its
    seq_len is replaced by each length."""
    from dataclasses import replace

    from ...runtime.launch import launch

    if cfg.dropout:
        raise ValueError("context parallelism refuses attention dropout: use dropout=0")
    cfgs = [replace(cfg, seq_len=s) for s in seq_lens]
    run = launch(_ledgers, 4, cfgs, seed, backend="gloo", timeout=timeout)
    rows = []
    for c in cfgs:
        for setting in SETTINGS:
            measured, share = run[0][(setting, c.seq_len)]
            rows.append(MemoryRow(setting, c.seq_len, measured, model_bytes(c, setting), share))
    return rows


# --------------------------------------------------------------------------- the ring, traced
def _ring_once(shape, seed: int):
    from ...context_parallel.ring import ring_attention
    from ...context_parallel.split import split_sequence
    from ...runtime._device import device
    from ...runtime.mesh import Mesh
    from ...runtime.trace import label

    cp = Mesh(cp=4).cp
    torch.manual_seed(seed)
    q, k, v, g = (torch.randn(*shape, device=device()) for _ in range(4))
    mine = [split_sequence(t, cp, dim=2).requires_grad_() for t in (q, k, v)]
    with label("layer0"):
        y = ring_attention(*mine, cp)
    y.backward(split_sequence(g, cp, dim=2))
    return tuple(y.shape)


def ring_trace(shape=(1, 2, 32, 8), seed: int = 0, timeout: float = 60.0):
    """One call of ring attention at cp = 4 (q, k, v of `shape` (B, heads, T, d)),
    forward and backward, on real processes; returns the `Run` (its `.trace` holds
    every K/V and dK/dV message, axis "cp")."""
    from ...runtime.launch import launch

    return launch(_ring_once, 4, shape, seed, backend="gloo", timeout=timeout)


# --------------------------------------------------------------------------- causal imbalance
def chunks_of(rank: int, cp: int, balanced: bool) -> tuple[int, int]:
    """The two (of 2·cp) chunks of the sequence cp rank `rank` holds."""
    return cp_chunks(rank, cp) if balanced else (2 * rank, 2 * rank + 1)


def _ring_counted(q, k, v, cp, balanced: bool):
    """Causal attention of this rank's two chunks of queries over every rank's keys,
    K/V passed around the ring (forward only), counting the work as it is done."""
    from ...context_parallel.ring import block_forward, block_kind, merge_partials
    from ...runtime import comm

    mine = chunks_of(cp.rank, cp.size, balanced)
    qs = q.chunk(2, dim=-2)
    out, lse = [None, None], [None, None]
    work = {"blocks": 0, "scores": 0, "seconds": 0.0}
    kv = (k.contiguous(), v.contiguous())
    for step in range(cp.size):
        pending = None
        if step < cp.size - 1:  # the next block travels while this one is computed
            sends = [comm.isend(t, cp.next, _TAG + 2 * step + i, via=cp.name)
                     for i, t in enumerate(kv)]
            recvs = [comm.irecv(torch.empty_like(t), cp.prev, _TAG + 2 * step + i, via=cp.name)
                     for i, t in enumerate(kv)]
            pending = (sends, recvs)
        theirs = chunks_of((cp.rank - step) % cp.size, cp.size, balanced)
        ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
        started = time.perf_counter()
        for a in range(2):
            for b in range(2):
                kind = block_kind(mine[a], theirs[b])
                if kind is None:  # every key later than every query: nothing to do
                    continue
                o, ell = block_forward(qs[a], ks[b], vs[b], kind == "causal")
                work["blocks"] += 1
                work["scores"] += ell.numel() * ks[b].shape[-2]  # query rows x keys
                if out[a] is None:
                    out[a], lse[a] = o, ell
                else:
                    out[a], lse[a] = merge_partials(out[a], lse[a], o, ell)
        work["seconds"] += time.perf_counter() - started
        if pending is not None:
            kv = tuple(r.wait() for r in pending[1])
            for s in pending[0]:
                s.wait()
    return torch.cat(out, dim=-2), work


def _causal(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def _work(shape, seed: int):
    from ...runtime._device import device
    from ...runtime.mesh import Mesh

    cp = Mesh(cp=torch.distributed.get_world_size()).cp
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=generator, dtype=torch.float64).to(device())
               for _ in range(3))
    expected = _causal(q, k, v)
    out = {}
    for balanced in (False, True):
        chunks = q.chunk(2 * cp.size, dim=-2)
        mine = chunks_of(cp.rank, cp.size, balanced)

        def part(t, mine=mine):
            pieces = t.chunk(2 * cp.size, dim=-2)
            return torch.cat([pieces[c] for c in mine], dim=-2)

        y, work = _ring_counted(part(q), part(k), part(v), cp, balanced)
        work["error"] = (y - part(expected)).abs().max().item()
        work["chunks"] = mine
        work["chunk_len"] = chunks[0].shape[-2]
        out["load-balanced" if balanced else "contiguous"] = work
    return out


def ring_work(cp: int = 4, shape=(1, 4, 1024, 16), seed: int = 0, timeout: float = 120.0):
    """Per-rank work of causal ring attention, contiguous and load-balanced splits,
    MEASURED on `cp` real processes (float64, q, k, v of `shape` (B, heads, T, d)):
    ``{"contiguous": [per rank {"blocks", "scores", "seconds", "error", "chunks",
    "chunk_len"}], "load-balanced": [...]}``. "scores": query·key products the
    rank computed; "seconds": its time in the blocks (noisy on shared cores);
    "error": its output's largest difference from plain causal attention."""
    from ...runtime.launch import launch

    if shape[2] % (2 * cp):
        raise ValueError(f"T={shape[2]} must split into 2·cp = {2 * cp} chunks")
    run = launch(_work, cp, shape, seed, backend="gloo", timeout=timeout)
    return {split: [run[r][split] for r in range(cp)] for split in ("contiguous",
                                                                    "load-balanced")}
