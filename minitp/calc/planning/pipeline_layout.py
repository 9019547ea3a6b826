"""The pipeline layout balancer (a MODEL): `pipeline_layout` picks which layers each stage
holds so that the slowest stage is as fast as it can be, each stage within a memory limit.

A stage's cost is its training FLOPs per token, as torchtitan counts a model's
(torchtitan, torchtitan/models/utils.py, ``get_dense_model_nparams_and_flops``): 6 per
parameter a token uses, the embedding's left out (a lookup multiplies nothing), plus
12·h·s per layer for attention's QKᵀ and ·V (full, not halved for the causal mask), with
a mixture of experts' layer counting its router, shared expert and k of its E experts.
So the first stage pays its layers alone (and a vision-language model's encoder, 3× its
forward: `minitp.calc.architectures.vision.vision_forward_flops`), the last stage its layers and the
head's 6·V·h (the output projection, a matmul even when tied to the embedding) — which is
why an even split is slow at its ends.

The search: for pp·v stages in model order (`minitp.rules.layouts`), the contiguous runs of
layers whose largest stage cost is least (dynamic programming over (stages, layers)); among
the layouts that reach it, the one whose costs spread least (least sum of squares), so that
an even split is kept wherever it is already best. Memory per stage (``memory_limit``,
bytes): its model states (`model_state_bytes` of its parameters) and its activations
(`activation_bytes_per_layer` × its layers × the microbatches its rank holds: p − r under
1F1B and ZB-H1, m under GPipe, 2p − 1 under ZB-H2).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...rules.layouts import layout_text
from ..architectures.vision import vision_forward_flops
from ..counts.params import (
    expert_mlp_params,
    layer_params_per_rank,
    learned_positions,
    norm_params,
    padded_vocab,
    vision_params,
)
from ..footprint.memory import activation_bytes_per_layer, model_state_bytes


@dataclass(frozen=True)
class LayoutChoice:
    """A layout and what the model says of it. ``layout``: the string `mt.parallelize`'s
    ``pipeline_layout=`` and ``--pipeline-layout`` read; ``stages``: each stage's layers;
    ``stage_flops``: each stage's training FLOPs per token (MODEL); ``stage_bytes``: each
    stage's memory on its rank (MODEL)."""

    layout: str
    stages: tuple[range, ...]
    stage_flops: tuple[int, ...]
    stage_bytes: tuple[int, ...]

    @property
    def slowest(self) -> int:
        """The largest stage's FLOPs per token: what every stage waits for."""
        return max(self.stage_flops)


def _moe(cfg) -> bool:  # a `DecoderShape` (calc's published shapes) has no experts field
    return getattr(cfg, "n_experts", 0) > 0


def layer_flops(cfg) -> list[int]:
    """Each layer's training FLOPs per token (torchtitan's count: module docstring)."""
    h, s = cfg.d_model, cfg.seq_len
    out = []
    for i in range(cfg.n_layer):
        params = layer_params_per_rank(cfg, 1, i if _moe(cfg) else None)
        if _moe(cfg) and cfg.is_moe_layer(i):  # the experts a token does not visit
            params -= (cfg.n_experts - cfg.top_k) * expert_mlp_params(cfg)
        out.append(6 * params + 12 * h * s)
    return out


def end_flops(cfg) -> tuple[int, int]:
    """(first stage's extra, last stage's extra) training FLOPs per token: a VLM's encoder,
    and the head with the final norm; the embedding's lookup counts none."""
    encoder = -(-3 * vision_forward_flops(cfg, 1) // cfg.seq_len)  # one image per sequence
    return encoder, 6 * (cfg.vocab_size * cfg.d_model + norm_params(cfg))


def _in_flight(schedule, pp: int, rank: int, microbatches: int | None) -> int:
    m = pp if microbatches is None else microbatches
    if schedule == "gpipe":
        return m
    if schedule == "zb-h2":
        return 2 * pp - 1
    if schedule in (None, "1f1b", "zb-h1"):
        return min(pp - rank, m)
    raise ValueError(f"pipeline_layout's memory model reads schedule None, 'gpipe', '1f1b', "
                     f"'zb-h1' or 'zb-h2', got {schedule!r}")


def stage_memory(cfg, layers: range, g: int, n_stages: int, *, tp=1, dp=1, zero_stage=0,
                 optimizer="adam-mixed", micro_batch=1, sp=False, recompute=None,
                 schedule=None, microbatches=None, _layer_params=None) -> int:
    """Bytes stage g (of n_stages, one per rank) holds with `layers` (MODEL)."""
    embedding = padded_vocab(cfg.vocab_size, tp) * cfg.d_model // tp
    if _layer_params is None:  # (the search passes its prefix sums)
        params = sum(layer_params_per_rank(cfg, tp, i if _moe(cfg) else None)
                     for i in layers)
    else:
        params = _layer_params[layers.stop] - _layer_params[layers.start]
    if g == 0:
        params += (embedding + vision_params(cfg)
                   + (cfg.seq_len * cfg.d_model if learned_positions(cfg) else 0))
    if g == n_stages - 1:
        params += norm_params(cfg) + (embedding if n_stages > 1 else 0)  # the tied copy
    states = model_state_bytes(params, dp, zero_stage, optimizer)["total"]
    per_layer = activation_bytes_per_layer(cfg, micro_batch, tp, sp, recompute)
    return int(states + per_layer * len(layers) * _in_flight(schedule, n_stages, g,
                                                                 microbatches))


def _prefix(values) -> list:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def pipeline_layout(cfg, pp: int, virtual_stages: int = 1, *, memory_limit=None,
                    **memory) -> LayoutChoice:
    """The layout of cfg's layers over pp·virtual_stages stages whose slowest stage is
    fastest (module docstring), every stage within ``memory_limit`` bytes if given.
    ``memory``: `stage_memory`'s keywords (tp, dp, zero_stage, optimizer, micro_batch, sp,
    recompute, schedule, microbatches). A ValueError in one line where no layout fits."""
    n = pp * virtual_stages
    if memory_limit is not None and virtual_stages > 1:
        raise ValueError("pipeline_layout's memory_limit with virtual_stages > 1: a rank's "
                         "memory is the sum of its chunks, which this balancer does not "
                         "constrain; give virtual_stages=1 or no memory_limit")
    costs, (first, last) = layer_flops(cfg), end_flops(cfg)
    prefix = _prefix(costs)
    if memory_limit is not None:
        memory["_layer_params"] = _prefix(
            layer_params_per_rank(cfg, memory.get("tp", 1), i if _moe(cfg) else None)
            for i in range(cfg.n_layer))

    def cost(g, i, j):  # stage g holding layers i..j-1
        return prefix[j] - prefix[i] + (first if g == 0 else 0) + (last if g == n - 1 else 0)

    fits = {}  # (g, i, j) -> within the limit: each asked by both searches

    def allowed(g, i, j):
        if i == j and 0 < g < n - 1:
            return False  # a middle stage with nothing: `minitp.rules.layouts` refuses it
        if memory_limit is None:
            return True
        if (g, i, j) not in fits:
            fits[g, i, j] = stage_memory(cfg, range(i, j), g, n, **memory) <= memory_limit
        return fits[g, i, j]

    bound = _best(n, len(costs), lambda g, i, j: cost(g, i, j), allowed, max)
    if bound is None:
        raise ValueError(f"pipeline_layout: no layout of {cfg.n_layer} layers over {n} stages "
                         f"fits memory_limit={memory_limit} bytes per stage (a model)")
    spread = _best(n, len(costs), lambda g, i, j: cost(g, i, j) ** 2,
                   lambda g, i, j: allowed(g, i, j) and cost(g, i, j) <= bound[0],
                   lambda a, b: a + b)
    stages = tuple(spread[1])
    return LayoutChoice(layout_text(list(stages)), stages,
                        tuple(cost(g, r.start, r.stop) for g, r in enumerate(stages)),
                        tuple(stage_memory(cfg, r, g, n, **memory) if virtual_stages == 1
                              else 0 for g, r in enumerate(stages)))  # (v > 1: not modelled)


def _best(n: int, L: int, value, allowed, combine):
    """(best combined value, stages) over contiguous runs of L items in n stages, or None:
    best[g][j] covers the first j items with g stages (dynamic programming)."""
    best = [[None] * (L + 1) for _ in range(n + 1)]
    best[0][0] = (0, [])
    for g in range(n):
        for j in range(L + 1):
            for i in range(j + 1):
                prev = best[g][i]
                if prev is None or not allowed(g, i, j):
                    continue
                total = combine(prev[0], value(g, i, j))
                if best[g + 1][j] is None or total < best[g + 1][j][0]:
                    best[g + 1][j] = (total, [*prev[1], range(i, j)])
    return best[n][L]
