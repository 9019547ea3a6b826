"""Tensor-parallel decoding: each rank runs its heads, with its heads' KV cache.

The rank's model is the training one (`mt.parallelize`, sequence parallelism off: one new
token cannot be split over the sequence), so the heads and the K/V heads are split — or,
where tp is above the K/V heads, replicated — by the training rules
(`minitp.rules.heads.kv_layout`), and the cache bound to it holds only what the rank's
attention computed: n_head/tp query heads' worth of K/V (`kv_heads_per_rank`).

Per decoded token each block makes two all-reduces (attention's and the MLP's row-parallel
output, Megatron's g), each of B·d_model values; the vocabulary-parallel embedding one more
(B·d_model), and the logits one all-gather (B·V). `per_token_collectives` counts them from
the trace. Sequence parallelism would turn each all-reduce into a reduce-scatter and an
all-gather of the same bytes, over a sequence of one token: it does not apply to decode.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..model import GPT
from ..parallelize import parallelize
from ..runtime import comm
from ..runtime.mesh import Mesh
from .decode import Generation, generate


def vocab_gather(model):
    """(B, V'/t) this rank's vocabulary columns -> (B, V) the whole logits, on every rank of
    tp (an all-gather; the padding columns `VocabParallelEmbedding` added dropped)."""
    tp, vocab = model.mesh.tp, model.cfg.vocab_size

    def gather(local: torch.Tensor) -> torch.Tensor:
        return comm.all_gather(local, tp, dim=local.dim() - 1)[..., :vocab]
    return gather


def tp_model(ref: GPT, mesh: Mesh):
    """This rank's decoding shard of `ref`: split by heads over ``mesh.tp``, sequence
    parallelism off."""
    if mesh.pp.size != 1:
        raise ValueError("tp_model is one stage; with pp > 1 use minitp.serving.pp_generate")
    return parallelize(ref, mesh, sequence_parallel=False).eval()


def tp_generate(ref: GPT, mesh: Mesh, prompt: torch.Tensor, n: int, temperature: float = 0.0,
                seed: int = 0, cached: bool = True) -> Generation:
    """`minitp.serving.generate` on this rank's shard of `ref` (every rank of a launch calls
    it with the same arguments); every rank returns the same tokens and whole logits."""
    model = tp_model(ref, mesh)
    return generate(model, prompt.to(next(model.parameters()).device), n, temperature, seed,
                    cached, gather=vocab_gather(model))


def per_token_collectives(events, rank: int = 0, after: float = 0.0, tokens: int = 1) -> dict:
    """The collectives one rank made per token, from a trace: {op: count per token}, and
    ``bytes`` {op: (measured sent bytes, modelled ring bytes) per token} — events that end
    after time `after` (e.g. the prefill's end), over `tokens` decode steps."""
    mine = [e for e in events if e.rank == rank and e.is_comm and e.start >= after
            and e.axis == "tp"]
    counts = Counter(e.op for e in mine)
    sent, model = Counter(), Counter()
    for e in mine:
        sent[e.op] += e.sent_bytes or 0
        model[e.op] += e.model_bytes
    return {"count": {op: c / tokens for op, c in counts.items()},
            "bytes": {op: (sent[op] / tokens, model[op] / tokens) for op in counts}}
