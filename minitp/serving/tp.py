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

import hashlib
from collections import Counter

import torch

from ..model import GPT
from ..parallelize import parallelize
from ..runtime import _device, comm, trace
from ..runtime.mesh import Axis, Mesh
from .decode import Generation, check_request, generate


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
    it with the same arguments); every rank returns the same tokens and whole logits.
    A rank given another prompt is refused on every rank (`check_same_prompt`)."""
    check_same_prompt(prompt, mesh.tp)  # first: every rank then refuses a bad one alike
    check_request(ref, prompt, n, temperature)
    model = tp_model(ref, mesh)
    return generate(model, prompt.to(next(model.parameters()).device), n, temperature, seed,
                    cached, gather=vocab_gather(model))


def _prompt_bytes(prompt) -> bytes:
    """What a prompt is, as bytes: a tensor's dtype, shape and contents; a list's (a
    pipeline's groups) each in turn; anything else its repr."""
    if isinstance(prompt, list | tuple):
        return b"[" + b",".join(_prompt_bytes(p) for p in prompt) + b"]"
    if isinstance(prompt, torch.Tensor):
        ids = prompt.detach().cpu().contiguous()
        return (repr((ids.dtype, tuple(ids.shape))).encode()
                + ids.flatten().view(torch.uint8).numpy().tobytes())
    return repr(prompt).encode()


def check_same_prompt(prompt, axis: Axis) -> None:
    """Every rank of `axis` holds the same prompt (or list of them: a pipeline's groups),
    else a ValueError on every one of them, naming which ranks hold which. Each rank would
    otherwise compute its part (its heads, its stage) of its own prompt, and the
    collectives would join the parts into tokens of no prompt, without a word. Run before
    any rank checks its prompt alone: a prompt only one rank refused would leave the others
    waiting in the next collective. Cheap: one all-gather of an 8-byte hash of the prompt
    (dtype, shape and ids) a rank, left out of the trace (bookkeeping, not decoding's
    communication)."""
    if axis.size == 1:
        return
    digest = hashlib.blake2b(_prompt_bytes(prompt), digest_size=8).digest()
    mine = torch.tensor([int.from_bytes(digest, "little", signed=True)], dtype=torch.int64,
                        device=_device.device())  # NCCL: on the GPU
    with trace.paused():
        every = comm.all_gather(mine, axis).tolist()
    if len(set(every)) == 1:
        return
    holders: dict = {}
    for index, fingerprint in enumerate(every):
        holders.setdefault(fingerprint, []).append(axis.ranks[index])
    said = "; ".join(f"ranks {ranks}" for ranks in holders.values())
    raise ValueError(f"the {axis.name} ranks were given different prompts ({said} each hold "
                     "their own): every rank of the group must pass the same prompt")


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
