"""A KV cache moved from the layout that prefilled it to the layout that decodes: prefill
at tp 4, decode at tp 2; prefill over pp stages, decode at tp 2; on the same ranks or on
others of the launch (disaggregated serving: Megatron-LM names this step
`megatron/core/inference/disaggregation/kv_reshard.py`, TensorRT-LLM's
`docs/source/1.0/features/disagg-serving.md` its "cache layout transformation").

A layer's cache holds, on a tp rank, its K/V heads (`minitp.rules.heads.kv_layout`:
split, or one head copied to tp/n_kv ranks), and on a pipeline stage its layers only. The
dense cache is (layer, K/V head) blocks, each B·length·(k width + v width) values; a rank
*has* the blocks its prefill cache holds and *needs* those its decoding model will read.
From there the refit's machinery does the rest (`minitp.serving.refit`): the two masks
all-gathered (bookkeeping, out of the trace), the same plan on every rank (each block from
the rank itself where it holds it, else from the first holder after it), one message a
pair of ranks, traced as "kv" receives: the bytes a rank received, read from the trace,
beside the plan's, the minimum (each block it needs, once) and a broadcast of the whole
cache (a `RefitReport`).

Where minitp differs from production: the masks are per element, not per block or page
(Megatron and TensorRT-LLM move pages of a paged cache); latent attention's cache (one
latent a token, not heads) is refused.
"""

from __future__ import annotations

import torch

from ..model.kv_cache import KVCache
from ..rules.heads import kv_layout
from ..runtime import _device, comm, trace
from ..runtime.mesh import world
from .refit_checks import agree, refusal
from .refit_routes import RefitReport, exchange_dense, plan_sources

VIA = "kv"  # the axis name the reshard's messages carry in the trace


def kv_heads_held(cfg, tp: int, tp_rank: int) -> list[int]:
    """The dense K/V heads tp rank `tp_rank` of `tp` holds in its cache (`kv_layout`)."""
    kv = cfg.kv_heads
    if kv_layout(cfg, tp) == "split":
        return list(range(tp_rank * kv // tp, (tp_rank + 1) * kv // tp))
    return [tp_rank // (tp // kv)]  # one K/V head, copied to tp/kv ranks


def kv_place(model) -> list[tuple[int, list[int]]]:
    """What a parallel model's cache holds: (layer, its K/V heads) for each of its blocks'
    layers, in order (`KVCache.for_model`'s layers: a pipeline's stage, else all)."""
    mesh, cfg = model.mesh, model.cfg
    if getattr(cfg, "kv_lora_rank", 0):
        raise ValueError("reshard_kv moves K/V heads; latent attention caches one latent a "
                         "token (kv_lora_rank > 0): not resharded here")
    layers = range(cfg.n_layer)
    if hasattr(model, "stage_layers"):  # a pipeline: this rank's one stage
        if len(model.chunks) != 1:
            raise ValueError(f"reshard_kv: a pipeline of {len(model.chunks)} virtual stages a "
                             "rank; decoding runs one stage a rank (pp_decode)")
        layers = model.stage_layers[mesh.pp.rank]
    heads = kv_heads_held(cfg, mesh.tp.size, mesh.tp.rank)
    return [(layer, heads) for layer in layers]


def _block_ids(place, n_kv: int, width: int) -> list[torch.Tensor]:
    """Per local layer: the dense element ids of its (head, element) values, (heads, width),
    block (layer, head) at (layer·n_kv + head)·width."""
    return [torch.tensor([(layer * n_kv + h) * width for h in heads])[:, None]
            + torch.arange(width) for layer, heads in place]


def reshard_kv(cache: KVCache | None, prefill, decode) -> tuple[KVCache | None, RefitReport]:
    """This rank's part of the cache `decode` (its parallel model, or None where it does
    not decode) reads, built from every rank's prefill `cache` (None where it did not
    prefill) of the parallel model `prefill` (None likewise), and this rank's bytes.
    Collective: every rank of the launch calls it. The cache returned holds the prefill's
    positions, ready for `decode`'s next token (`minitp.serving.Decoder`'s ``cache``)."""
    def check():
        if (cache is None) != (prefill is None):
            raise ValueError("reshard_kv: pass the prefill's cache with its model (both or "
                             "neither)")
        if cache is not None and (not cache.layers or cache.layers[0].k is None):
            raise ValueError("reshard_kv: the prefill's cache is empty: run a prefill first")
        for model in (prefill, decode):
            if model is not None:
                kv_place(model)
    error = refusal(check)
    meta = None if error or cache is None else _meta(cache, prefill.cfg)
    metas = {m for _, m in agree((error, meta)) if m is not None}
    if len(metas) != 1:
        raise ValueError(f"reshard_kv: {len(metas)} different prefill caches (batch, length, "
                         "widths, dtype, layers, K/V heads) among the ranks: one prefill, "
                         "one shape")
    batch, length, wk, wv, dtype, n_layer, n_kv = metas.pop()
    width, item = batch * length * (wk + wv), getattr(torch, dtype)
    n = n_layer * n_kv * width
    values = torch.zeros(n, dtype=item)
    have, need = torch.zeros(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    if cache is not None:
        for layer, ids in zip(cache.layers, _block_ids(kv_place(prefill), n_kv, width),
                              strict=True):
            values[ids.flatten()] = _blocks(layer, length).flatten().cpu()
            have[ids.flatten()] = 1
    if decode is not None:
        for ids in _block_ids(kv_place(decode), n_kv, width):
            need[ids.flatten()] = 1
    with trace.paused():  # bookkeeping: who holds what, who needs what
        table = comm.all_gather(torch.stack([have, need]).to(_device.device()), world())
    source = plan_sources(table[0::2].cpu(), table[1::2].cpu())
    me, families = world().rank, [(0, n, item)]
    got, report = exchange_dense([values], source, me, families, VIA)
    if decode is None:
        return None, report
    out = KVCache.for_model(decode.chunks[0] if hasattr(decode, "stage_layers") else decode)
    device = next(decode.parameters()).device
    for layer, ids in zip(out.layers, _block_ids(kv_place(decode), n_kv, width), strict=True):
        blocks = got[0][ids.flatten()].view(len(ids), batch, length, wk + wv)
        k, v = blocks.permute(1, 0, 2, 3).split([wk, wv], dim=-1)
        layer.append(k.to(device), v.to(device))
    return out, report


def _meta(cache: KVCache, cfg) -> tuple:
    """(batch, length, k width, v width, dtype, layers, K/V heads) of a prefill's cache."""
    k, v = cache.layers[0].k, cache.layers[0].v
    return (k.shape[0], cache.length, k.shape[3], v.shape[3], str(k.dtype).removeprefix(
        "torch."), cfg.n_layer, cfg.kv_heads)


def _blocks(layer, length: int) -> torch.Tensor:
    """(heads, B, length, k width + v width): one layer's cache, a block a head."""
    k, v = (t.narrow(2, 0, length) for t in (layer.k, layer.v))
    return torch.cat([k, v], dim=-1).permute(1, 0, 2, 3).contiguous()
