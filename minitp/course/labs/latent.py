"""Lab: latent attention and folded experts (lesson 27) — the cache measured, absorption
counted, and the tensor-parallel traps run, on real ranks.

    caches()                 # one process: each attention's cache, bytes a token, measured
    decode_flops(absorb)     # one decode step's FLOPs (torch's counter) with a full cache
    run = ranks()            # ONE launch of 2 ranks (tp = 2), float64, everything below

``ranks()`` returns, per rank: ``exact`` (latent attention on tp 2 with sequence
parallelism against one device: the largest loss and parameter differences after 3 AdamW
steps), ``no_rope_sum`` (the same without SP, W^KR's gradient left un-summed on purpose:
the parameter that departs first and how far the two ranks' copies of W^KR drift apart),
``serve`` (absorbed decoding over tp against one uncached process, and the cache bytes a
token each rank holds for latent and grouped-query attention) and ``routed`` (the rows a
rank's experts computed in one MoE forward: today's layout without and with SP, and folded,
ep = 2 spanning the tp ranks).
Everything here is measured; the formulas beside it in the lesson are `minitp.calc`'s or
written out there, a MODEL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from ...expert_parallel.work import expert_work
from ...model import GPT, GPTConfig
from ...model.kv_cache import KVCache
from ...model.mla import set_absorbed
from ...parallelize import parallelize
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...serving import generate
from ...serving.tp import tp_generate, tp_model
from .modern_transformer import side_by_side

SIZES = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)  # head_dim 8
MLA = GPTConfig.mla(**SIZES, kv_lora_rank=16, q_lora_rank=16, rope_dim=4)
GQA = GPTConfig.llama(**SIZES, n_kv_head=2)
MHA = GPTConfig.llama(**SIZES)
MOE = GPTConfig(**SIZES, n_experts=4, top_k=2)
WORLD = 2


def _model(cfg: GPTConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(cfg).double().to(device()).eval()


def _prompt(rows: int = 2, length: int = 5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, SIZES["vocab_size"], (rows, length), generator=generator).to(device())


def cache_bytes(model) -> int:
    """Bytes a token of `model`'s KV cache after a prefill: the cache tensors' own bytes."""
    cache = KVCache.for_model(model)
    with torch.no_grad(), cache.bound(model):
        model(_prompt())
    return cache.bytes_per_token()


def caches() -> dict:
    """{"MHA", "GQA", "MLA"}: bytes a token of each attention's cache, float64, measured."""
    return {name: cache_bytes(_model(cfg)) for name, cfg in (("MHA", MHA), ("GQA", GQA),
                                                            ("MLA", MLA))}


def decode_flops(absorb: bool, cached: int = 15) -> int:
    """FLOPs (torch's counter) of the latent attention layers in one decode step of one
    sequence, `cached` positions already in the cache, expanded or absorbed."""
    model = _model(MLA)
    set_absorbed(model, absorb)
    cache = KVCache.for_model(model)
    with torch.no_grad(), cache.bound(model):
        model(_prompt(1, cached))
        with FlopCounterMode(display=False) as counter:
            for block in model.blocks:  # the attentions alone, on a stand-in input
                block.attn(torch.zeros(1, 1, SIZES["d_model"], dtype=torch.float64,
                                       device=device()))
    return counter.get_total_flops()


def _untag_rope(model) -> None:
    for name, p in model.named_parameters():
        if ".k_rope." in name:
            p.grad_partial_over_tp = False


def _copies_apart(model, mesh) -> float:
    weight = model.blocks[0].attn.k_rope.weight.detach().contiguous()
    copies = [torch.zeros_like(weight) for _ in range(mesh.tp.size)]
    dist.all_gather(copies, weight, group=mesh.tp.group)
    return (copies[0] - copies[1]).abs().max().item()


def _serve() -> dict:
    ref = _model(MLA)
    plain = generate(ref, _prompt(), 6, cached=False)
    set_absorbed(ref)
    out = tp_generate(ref, Mesh(tp=WORLD), _prompt(), 6)
    gap = max((a - b).abs().max().item() for a, b in zip(out.logits, plain.logits, strict=True))
    mesh = Mesh(tp=WORLD)
    return dict(same_tokens=torch.equal(out.tokens, plain.tokens), logit_gap=gap,
                mla=cache_bytes(tp_model(ref, mesh)), gqa=cache_bytes(tp_model(_model(GQA), mesh)))


def _routed(sizes: dict, sequence_parallel: bool) -> int:
    """Rows this rank's experts computed in one training forward (`expert_work`'s hooks)."""
    model = parallelize(_model(MOE).train(), Mesh(**sizes), sequence_parallel=sequence_parallel)
    tokens = _prompt(4, 16)
    with expert_work(model) as seen:
        model(tokens, tokens)
    return seen["rows"]


def _rank() -> dict:
    exact = side_by_side(dict(tp=WORLD), dict(sequence_parallel=True), MLA)
    spoiled = side_by_side(dict(tp=WORLD), {}, MLA, spoil=_untag_rope)
    return dict(exact=(exact["loss_gap"], exact["param_gap"]),
                no_rope_sum=dict(param_gap=spoiled["param_gap"],
                                 copies_apart=_copies_apart(spoiled["model"], spoiled["mesh"])),
                serve=_serve(),
                routed={"tp": _routed(dict(tp=WORLD), False),
                        "tp+SP": _routed(dict(tp=WORLD), True),
                        "folded": _routed(dict(tp=WORLD, ep=WORLD, fold=True), False)})


def ranks(timeout: float = 120.0) -> list[dict]:
    """Every rank's results of one launch of 2 ranks (see the module docstring)."""
    return launch(_rank, WORLD, timeout=timeout)
