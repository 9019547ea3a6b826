"""Lab: serving a model across ranks (lesson 18) — the KV cache grown, prefill and decode on
the timeline, tensor parallelism's collectives per token, and tokens per second against
the batch beside the roofline's model, on panels of their own.

Every run uses `minitp.serving` (the cache, `Decoder`, `tp_model`, `pp_generate`) on a tiny
Llama-style GPT (`CFG`: 4 query heads, 2 K/V heads) on `mt.device()`:

* `grow_cache`: one process, prefill then decode, the cache's length after each forward
  and its bytes per token MEASURED from its tensors beside 2·L·K·d·w;
* `tp_decode`: one launch at tp ranks, prefill and each decode step in a trace region of
  its own ("prefill", "D0", "D1", ...), the collectives per decoded token counted from the
  trace (`minitp.serving.per_token_collectives`);
* `pp_decode`: one launch of `pp_generate` over pp stages (regions "P<g>", "D<g>"), its
  bubble MEASURED beside `bubble_model`;
* `throughput`: decode tokens per second against the batch at each tp, MEASURED on this
  machine by `minitp.serving.decode_throughput` (its CPU, not a GPU: its balance point is
  another);
* `roofline` (`serving_roofline`): the picture — a GPU's roofline and tokens per second
  for a Llama 3 model from `mt.calc.inference.serving` (a MODEL), and the tokens per second measured
  here, each on its own panel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from matplotlib.patches import Rectangle

from ... import calc
from ...calc.inference import serving as model_of
from ...model import GPT, GPTConfig
from ...model.kv_cache import KVCache
from ...runtime._device import device
from ...runtime.launch import launch
from ..viz._style import _new_figure
from .serving_roofline import roofline  # noqa: F401  (lab.roofline, lesson 18)

CFG = GPTConfig.llama(vocab_size=64, seq_len=32, n_layer=2, n_head=4, d_model=32,
                      n_kv_head=2)


def _model(cfg: GPTConfig, dtype=torch.float64) -> GPT:
    torch.manual_seed(0)
    return GPT(cfg).to(device=device(), dtype=dtype).eval()


def _prompt(cfg: GPTConfig, batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, cfg.vocab_size, (batch, length), generator=g).to(device())


@dataclass
class Growth:
    """What `grow_cache` saw: the cache's length after the prefill and each decode step,
    its bytes per token MEASURED and the formula's, and its whole allocation."""

    lengths: list
    measured: int
    formula: int
    allocated: int


def grow_cache(cfg: GPTConfig = CFG, prompt: int = 6, new: int = 5) -> Growth:
    """Prefill a prompt of `prompt` tokens, then decode `new` more greedily, float64."""
    model = _model(cfg)
    cache = KVCache.for_model(model)
    ids, lengths = _prompt(cfg, 1, prompt), []
    with torch.no_grad():
        step = ids
        for _ in range(new + 1):
            with cache.bound(model):
                logits = model(step)[0]
            lengths.append(cache.length)
            step = logits[:, -1].argmax(-1, keepdim=True)
    formula = 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * 8  # float64: 8 bytes
    return Growth(lengths, cache.bytes_per_token(), formula, cache.nbytes)


def draw_cache(growth: Growth, cfg: GPTConfig = CFG):
    """The cache as a grid: a row for K and one for V of each layer, a column per position
    (seq_len of them allocated); each filled cell coloured by the forward that wrote it."""
    fig = _new_figure((9, 2.4))
    ax = fig.subplots()
    rows = [f"layer {i} {kv}" for i in range(cfg.n_layer) for kv in ("K", "V")]
    starts = [0, *growth.lengths[:-1]]
    for step, (a, b) in enumerate(zip(starts, growth.lengths, strict=True)):
        color = "#0072B2" if step == 0 else "#E69F00"
        for r in range(len(rows)):
            for pos in range(a, b):
                ax.add_patch(Rectangle((pos, r), 0.92, 0.85, color=color))
            if step:
                ax.text(a + 0.46, r + 0.42, str(step), ha="center", va="center", fontsize=7)
    for r in range(len(rows)):
        ax.add_patch(Rectangle((growth.lengths[-1], r), cfg.seq_len - growth.lengths[-1],
                                   0.85, fill=False, ec="#BBBBBB", hatch="..", lw=0.5))
    ax.set(xlim=(0, cfg.seq_len), ylim=(len(rows), 0), xlabel="position (cache slot)",
           yticks=[r + 0.42 for r in range(len(rows))], yticklabels=rows,
           title=f"the KV cache: prefill (blue, {growth.lengths[0]} positions), "
                 f"{len(growth.lengths) - 1} decode steps (orange, a slot each), empty (grey)")
    return fig


def gqa_table(shapes=(model_of.LLAMA3_8B, model_of.LLAMA3_70B), context: int = 8192,
              cluster=calc.H100_80GB, tp: int = 8) -> list:
    """(name, kind, KiB a token in bf16, the most sequences of `context` tokens whose cache
    fits beside the weights on a GPU of tp ranks) for each shape as published (GQA) and with
    a K/V head per query head (MHA): a MODEL, `mt.calc.inference.serving`."""
    from dataclasses import replace

    rows = []
    for shape in shapes:
        for kind, s in (("GQA", shape), ("MHA", replace(shape, n_kv_head=shape.n_head))):
            rows.append((shape.name, f"{kind} ({s.n_kv_head} K/V heads)",
                         model_of.kv_cache_bytes_per_token(s) / 1024,
                         model_of.max_decode_batch(s, cluster, context, tp=tp)))
    return rows


def _decode_in_rank(cfg, batch, prompt, new):
    from ...runtime import trace
    from ...runtime.mesh import Mesh, world
    from ...serving import Decoder, per_token_collectives, tp_model, vocab_gather

    mesh = Mesh(tp=world().size)
    model = tp_model(_model(cfg), mesh)
    decoder = Decoder(model, vocab_gather(model))
    ids = _prompt(cfg, batch, prompt)
    with trace.region("prefill", "fwd"):
        ids = torch.cat([ids, decoder.next_logits(ids).argmax(-1, keepdim=True)], dim=1)
    after = trace.events()[-1].end
    for step in range(new):
        with trace.region(f"D{step}", "fwd"):
            ids = torch.cat([ids, decoder.next_logits(ids).argmax(-1, keepdim=True)], dim=1)
    return per_token_collectives(trace.events(), world().rank, after, new)


def tp_decode(cfg: GPTConfig = CFG, tp: int = 2, batch: int = 2, prompt: int = 8, new: int = 3):
    """The launch (its trace for `mt.viz.timeline`) and rank 0's collectives per decoded
    token: {"count": {op: n}, "bytes": {op: (MEASURED sent, ring MODEL)}}."""
    run = launch(_decode_in_rank, tp, cfg, batch, prompt, new, timeout=60)
    return run, run[0]


def expected_per_token(cfg: GPTConfig = CFG) -> dict:
    """The collectives a tp rank makes per decoded token, by the rule: 2 all-reduces per
    block (attention's and the MLP's row-parallel outputs), 1 for the vocabulary-parallel
    embedding, and 1 all-gather of the logits."""
    return {"all_reduce": 2 * cfg.n_layer + 1, "all_gather": 1}


def _pp_in_rank(cfg, groups, batch, prompt, new):
    from ...runtime.mesh import Mesh, world
    from ...serving import pp_generate

    prompts = [_prompt(cfg, batch, prompt) for _ in range(groups)]
    pp_generate(_model(cfg), Mesh(pp=world().size), prompts, new)


def pp_decode(cfg: GPTConfig = CFG, pp: int = 2, groups: int = 2, batch: int = 1,
              prompt: int = 8, new: int = 4):
    """One launch of `pp_generate`: the Run (regions "P<g>", "D<g>" in its trace)."""
    return launch(_pp_in_rank, pp, cfg, groups, batch, prompt, new, timeout=60)


def throughput(cfg: GPTConfig, batches=(1, 4, 16, 64), tps=(1, 2, 4), repeats: int = 2,
               tokens: int = 6) -> dict:
    """{tp: {batch: decode tokens per second}}, MEASURED here by
    `minitp.serving.decode_throughput` (float32), the best of `repeats` runs: a shared
    machine's other load only ever slows a run. `tokens` − 1 decode steps a batch: every
    step of one batch costs the same, so more of them average the same time over longer
    (at tp 4 a step of gloo's all-reduces takes about 0.1 s here)."""
    from ...serving.throughput import decode_throughput

    runs = [decode_throughput(cfg, batches, tps, tokens=tokens) for _ in range(repeats)]
    return {tp: {b: max(run[tp][b] for run in runs) for b in batches} for tp in tps}
