"""Pipeline-parallel decoding: the layers cut into stages, several groups of sequences in
flight so that the stages stay busy.

The batch is split into G groups (the microbatches of inference). Prefill sends each
group's prompt through the stages one after another (GPipe's forward half); then every
decode step of group g starts on the first stage as soon as the last stage has drawn g's
previous token and sent it back. Stage s runs group g's step t at tick t·max(G, P) + g + s
(P stages): with G ≥ P groups a stage never waits in the steady state; with G < P it idles
P − G ticks of every P. Each stage keeps a KV cache per group for its own layers.

The trace holds a region per unit, "P3" (group 3's prefill) and "D3" (one of its decode
steps), which `mt.viz.timeline` draws; `pipeline_bubble` measures the idle share beside
`bubble_model`'s (equal unit times: a model). Seed rule: group g draws from
``generator(seed + g)`` (`minitp.serving.sampling`), on the last stage, which sends the
token to the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..model import GPT
from ..model.kv_cache import KVCache
from ..parallelize import parallelize
from ..runtime import comm, trace
from ..runtime.mesh import Mesh
from .decode import Generation, check_request, window_start
from .sampling import draw, generator
from .tp import check_same_prompt, vocab_gather


@dataclass
class PipelineGeneration:
    """One rank's part of `pp_generate`: ``groups``, each group's `Generation` (on the last
    stage; empty elsewhere); seconds until this rank finished every prefill, and after;
    ``caches``, each group's KV cache of this rank's stage as the last step left it (n = 1:
    the prompt's, what `minitp.serving.kv_reshard` moves to a decoding layout)."""

    groups: list = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    caches: list = field(default_factory=list)


def pp_generate(ref: GPT, mesh: Mesh, prompts: list, n: int, temperature: float = 0.0,
                seed: int = 0) -> PipelineGeneration:
    """n tokens after each group's prompt (a list of (B_g, T_g) ids, the same on every rank)
    through this rank's stage of `ref` (and its heads, with tp > 1). Ranks given
    different prompts are refused on every rank (`check_same_prompt`, over pp and tp)."""
    _check(ref, mesh, prompts, n, temperature)
    return _decode(parallelize(ref, mesh, sequence_parallel=False).eval(), prompts, n,
                   temperature, seed)


def _check(ref, mesh: Mesh, prompts, n: int, temperature: float) -> None:
    for axis in (mesh.pp, mesh.tp):  # first: every rank then refuses a bad prompt alike
        check_same_prompt(prompts, axis)
    if not isinstance(prompts, list | tuple) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of (batch, tokens) prompts, one a "
                        f"group in flight, got {type(prompts).__name__} {prompts!r:.40}")
    for prompt in prompts:
        check_request(ref, prompt, n, temperature)


def pp_decode(model, prompts: list, n: int, temperature: float = 0.0,
              seed: int = 0) -> PipelineGeneration:
    """`pp_generate` on this rank's part of a model already laid out for serving (an
    `mt.parallelize` model, sequence parallelism off: e.g. `minitp.serving.refit`'s served
    shard, at pp ≥ 1 and tp ≥ 1)."""
    _check(model.chunks[0] if model.mesh.pp.size > 1 else model, model.mesh, prompts, n,
           temperature)
    return _decode(model, prompts, n, temperature, seed)


def _decode(model, prompts, n: int, temperature: float, seed: int) -> PipelineGeneration:
    mesh = model.mesh
    stage = model.chunks[0] if mesh.pp.size > 1 else model
    pp, window = mesh.pp, stage.cfg.seq_len
    first, last = pp.rank == 0, pp.rank == pp.size - 1
    device = next(stage.parameters()).device
    gather = vocab_gather(stage)
    ids = [p.to(device) for p in prompts]
    gens = [generator(seed + g) for g in range(len(prompts))]
    caches = [None] * len(prompts)
    out = PipelineGeneration([Generation(p, prompt_len=p.shape[1]) for p in prompts] if last
                             else [])
    sends, started = [], time.perf_counter()
    for t in range(n):
        for g, prompt in enumerate(prompts):
            total, tag = prompt.shape[1] + t, 2 * (t * len(prompts) + g)
            if t == 0 or total > window:  # prefill, or the window re-prefilled (decode.py)
                caches[g] = KVCache.for_model(stage)
            start = window_start(caches[g].length, total, window)
            if first and t > 0 and not last:  # the token the last stage drew
                token = torch.empty(prompt.shape[0], dtype=torch.long, device=device)
                token = comm.irecv(token, pp.ranks[-1], tag + 1).wait()
                ids[g] = torch.cat([ids[g], token[:, None]], 1)
            if first:
                inp = ids[g][:, start:]
            else:
                buf = torch.empty(prompt.shape[0], total - start, stage.cfg.d_model,
                                  dtype=stage.activation_dtype, device=device)
                inp = comm.irecv(buf, pp.ranks[pp.rank - 1], tag).wait()
            with trace.region(f"{'P' if t == 0 else 'D'}{g}", "fwd"), torch.no_grad(), \
                    caches[g].bound(stage):
                y = stage(inp)[0]
            if not last:
                sends.append(comm.isend(y, pp.ranks[pp.rank + 1], tag))
                continue
            logits = gather(y[:, -1]).double()
            token = draw(logits, temperature, gens[g]).to(device)
            done = out.groups[g]
            done.logits.append(logits.cpu())
            done.tokens = torch.cat([done.tokens, token.cpu()[:, None]], 1)
            if first:
                ids[g] = torch.cat([ids[g], token[:, None]], 1)
            elif t + 1 < n:
                sends.append(comm.isend(token, pp.ranks[0], tag + 2 * len(prompts) + 1))
        if t == 0:
            out.prefill_s = time.perf_counter() - started
    for pending in sends:
        pending.wait()
    out.decode_s = time.perf_counter() - started - out.prefill_s
    out.caches = caches
    return out


def pipeline_bubble(events, kind: str = "D") -> float:
    """The measured idle share of the ranks while units of `kind` ran ("D": decode, "P":
    prefill): 1 − (the units' summed time) / (ranks × the span from the first to the last)."""
    units = [e for e in events if e.op == "compute" and e.label[:1] == kind
             and e.label[1:].isdigit()]
    if not units:
        raise ValueError(f"the trace holds no {kind!r} units: run pp_generate first")
    ranks = {e.rank for e in units}
    span = max(e.end for e in units) - min(e.start for e in units)
    return 1.0 - sum(e.duration for e in units) / (len(ranks) * span)


def bubble_model(groups: int, stages: int, steps: int) -> float:
    """The idle share a MODEL gives `steps` decode steps of `groups` groups over `stages`
    stages, every unit one tick: steps·max(G, P) + min(G, P) − 1 ticks, of which each stage
    is busy steps·G."""
    ticks = steps * max(groups, stages) + min(groups, stages) - 1
    return 1.0 - steps * groups / ticks
