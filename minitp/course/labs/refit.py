"""Lab: from trainer to generator (lesson 19) — a trained model's weights moved live onto
the serving layout (`minitp.serving.refit`), the plan drawn, its bytes read from the trace,
and the generator's log-probabilities beside the trainer's in float64 and in bf16.

One launch of 4 ranks (`run`), every number MEASURED on those ranks:

* a GPT (`CFG`, float64) trained one step at (pp 2, tp 2), refit to tp 4 on the same ranks:
  the plan (`Refit.source`, every rank's), each rank's `RefitReport`, the refit's window on
  the timeline, and whether every served shard equals `tp_model` of the dense trainer's
  weights bit for bit;
* the same GPT trained at tp 2 on ranks 0-1 and refit onto ranks 2-3 serving at tp 2 (separate
  serving ranks, each grid an `mt.Mesh` over its own ranks): reports and window;
* the same GPT trained at (dp 2, tp 2) with ZeRO-1 and refit to tp 4: the generator's
  log-probabilities of its own sampled tokens beside the trainer's forward (float64);
* a mixture of experts (`MOE`) trained one step at (dp 2, tp 2) in bf16 and refit to tp 1,
  2 and 4: the log-probabilities of the same sampled tokens at each layout and the
  trainer's, and the routing decisions that flip (and, with a router negated, that the
  count sees a flip).

In this process (no ranks): `reduction_order` and `chunked_vs_whole`, the two sources of
the bf16 drift a CPU can show; `draw_plan`, `draw_drift`.
"""

from __future__ import annotations

import torch

from ...data import get_batch
from ...data_parallel import make_optimizer
from ...data_parallel.zero import gathered
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...serving import Refit, generate, logprob_parity, refit, routing_flips, tp_model, vocab_gather
from ...step import train_step
from ..viz._style import _new_figure, rank_color

CFG = GPTConfig(vocab_size=64, seq_len=8, n_layer=4, n_head=4, d_model=16)
MOE = GPTConfig(vocab_size=64, seq_len=8, n_layer=2, n_head=4, d_model=16, n_experts=4,
                top_k=2)
DRAWN = {"layer 0's attention qkv (column-parallel)": "blocks.0.attn.qkv.weight",
         "layer 3's attention proj (row-parallel)": "blocks.3.attn.proj.weight"}
DRAWN_AS = [(label, int(name.split(".")[1]), 0 if "qkv" in name else 1)  # (layer, split dim)
            for label, name in DRAWN.items()]
PROMPT, NEW = 4, 3
LAYOUTS = ("trainer tp 2", "generator tp 1", "generator tp 2", "generator tp 4")


def _trained(cfg, sizes, plan, dtype):
    """A GPT parallelized at `sizes` with `plan`, after one AdamW step, and its mesh."""
    torch.manual_seed(0)
    mesh = Mesh(**sizes)
    model = parallelize(GPT(cfg).to(device=device(), dtype=dtype), mesh, **plan)
    optimizer = make_optimizer(model, mesh, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    tokens = torch.randint(0, cfg.vocab_size, (200,), generator=torch.Generator().manual_seed(2))
    train_step(model, get_batch(tokens, 0, 4, cfg.seq_len), mesh, optimizer)
    return model, mesh


def _prompt():
    return torch.randint(0, 64, (2, PROMPT), generator=torch.Generator().manual_seed(1))


def _in_rank():
    out = {}
    model, _ = _trained(CFG, dict(pp=2, tp=2), {}, torch.float64)
    with gathered(model):
        dense = {k: v.cpu().clone() for k, v in model.full_state_dict().items()}
    planned, started = Refit(model, Mesh(tp=4)), trace.recorder().now()
    with trace.region("refit", ""):
        out["report"] = planned.refit_once()
    out["window"] = (started, trace.recorder().now())
    ref = GPT(CFG).to(torch.float64)
    ref.load_state_dict(dense)
    expect = tp_model(ref.to(device()), Mesh(tp=4)).state_dict()
    out["equal"] = all(torch.equal(v, expect[k]) for k, v in planned.served.state_dict().items())
    first = {name.removeprefix("model/"): (start, shape)
             for name, shape, start in planned.space.tensors}
    out["plan"] = {label: planned.source[:, first[name][0]:first[name][0]
                                         + first[name][1][0] * first[name][1][1]]
                   .view(-1, *first[name][1]) for label, name in DRAWN.items()}

    out["separate"] = _separate()

    model, _ = _trained(CFG, dict(dp=2, tp=2), dict(zero_stage=1), torch.float64)
    served = refit(model, Mesh(tp=4))[0]
    gen = generate(served, _prompt().to(device()), NEW, temperature=1.0, seed=3,
                   gather=vocab_gather(served))
    out["parity64"] = logprob_parity(model, served, gen.tokens.cpu(), PROMPT)["max_diff"]

    model, _ = _trained(MOE, dict(dp=2, tp=2), {}, torch.bfloat16)
    logprobs, out["flips"] = {}, {}
    for tp in (2, 1, 4):  # tp 2 first: its sampled tokens are scored at every layout
        served = refit(model, Mesh(dp=4 // tp, tp=tp))[0]
        if tp == 2:
            tokens = generate(served, _prompt().to(device()), NEW, temperature=1.0, seed=3,
                              gather=vocab_gather(served)).tokens.cpu()
        parity = logprob_parity(model, served, tokens, PROMPT)
        logprobs[f"generator tp {tp}"], logprobs["trainer tp 2"] = (parity["generator"],
                                                                    parity["trainer"])
        out["flips"][tp] = routing_flips(model, served, tokens, PROMPT)
    out["logprobs"] = logprobs
    for router in (m for m in served.modules() if type(m).__name__ == "Router"):
        router.gate.weight.data.neg_()  # every top-2 of 4 becomes the bottom 2: all flip
    out["negated"] = routing_flips(model, served, tokens, PROMPT)
    return out


def _separate():
    """Ranks 0-1 train at tp 2 (`Mesh(tp=2, ranks=[0, 1])`), ranks 2-3 serve at tp 2 (their
    own grid): this rank's refit report and window."""
    import torch.distributed as dist

    if dist.get_rank() < 2:
        planned = Refit(_trained(CFG, dict(tp=2, ranks=range(2)), {}, torch.float64)[0], None)
    else:
        planned = Refit.for_generator(CFG, Mesh(tp=2, ranks=range(2, 4)))
    started = trace.recorder().now()
    with trace.region("refit", ""):
        report = planned.refit_once()
    return {"report": report, "window": (started, trace.recorder().now())}


def run():
    """The launch of 4 ranks (its trace for the timeline); every rank's findings."""
    return launch(_in_rank, 4, timeout=180)


def refit_events(run_, which: str | None = None):
    """The trace's events inside each rank's refit window (for `mt.viz.timeline`): the
    collocated refit's, or with ``which="separate"`` the separate serving ranks'."""
    def window(rank):
        return (run_[rank] if which is None else run_[rank][which])["window"]
    return [e for e in run_.trace if window(e.rank)[0] <= e.start and e.end <= window(e.rank)[1]]


def drift(logprobs: dict) -> torch.Tensor:
    """(4, 4): the largest |difference| of log-probabilities between each two layouts."""
    rows = [logprobs[name] for name in LAYOUTS]
    return torch.tensor([[float((a - b).abs().max()) for b in rows] for a in rows])


def reduction_order(dtype, tps=(2, 4), seed: int = 0) -> dict:
    """{tp: largest |difference|} between a row-parallel layer's output computed whole and
    as the sum of tp partial products, each in `dtype` (the all-reduce's sum of rounded
    partials): the reduction order across tp."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(16, 64, generator=g), torch.randn(64, 32, generator=g) / 8
    x, w = x.to(dtype), w.to(dtype)
    whole = x @ w
    out = {}
    for tp in tps:
        parts = [x[:, k::tp] @ w[k::tp] for k in range(tp)]  # rank k's share of the inputs
        summed = parts[0]
        for p in parts[1:]:
            summed = summed + p
        out[tp] = float((summed.double() - whole.double()).abs().max())
    return out


def chunked_vs_whole(dtype, chunks: int = 4, seed: int = 0) -> float:
    """Largest |difference| between log p(target) from one log-sum-exp over the whole
    vocabulary and from log-sum-exps of `chunks` slices combined (as the vocabulary-parallel
    loss combines its ranks', or a chunked loss its chunks'), the logits in `dtype`, the sum
    in float32 for 16-bit logits (minitp's accumulation dtype)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 4096, generator=g).to(dtype)
    acc = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    z = logits.to(acc)
    whole = torch.logsumexp(z, -1)
    parts = torch.stack([torch.logsumexp(c, -1) for c in z.chunk(chunks, -1)], -1)
    combined = torch.logsumexp(parts, -1)
    return float((whole.double() - combined.double()).abs().max())


def draw_plan(plan: dict):
    """For each drawn weight, two rows of 4 panels: what each rank holds in training (pp 2,
    tp 2; the colour is the rank's) and what it serves at tp 4, each element coloured by the
    rank it came from (hatched: kept from its own training shard, no message)."""
    from matplotlib.colors import ListedColormap

    fig = _new_figure((10, 2.2 * 2 * len(plan)))
    axes = fig.subplots(2 * len(plan), 4)
    cmap = ListedColormap(["white"] + [rank_color(r) for r in range(4)])
    for i, (label, source) in enumerate(plan.items()):
        for t in range(4):
            # what t sends or keeps: all it holds of a weight split with no replicas
            ax = axes[2 * i, t]
            ax.imshow(torch.where((source == t).any(0), t, -1) + 1, cmap=cmap, vmin=0, vmax=4,
                      aspect="auto", interpolation="nearest")
            ax.set_title(f"{label}\ntraining: rank {t} holds" if t == 0 else
                         f"rank {t} holds", fontsize=8, loc="left")
            ax = axes[2 * i + 1, t]
            ax.imshow(source[t] + 1, cmap=cmap, vmin=0, vmax=4, aspect="auto",
                      interpolation="nearest")
            senders = sorted({int(s) for s in source[t].flatten() if s >= 0})
            words = ", ".join("kept" if s == t else f"from {s}" for s in senders)
            ax.set_title(f"serving: rank {t} ({words})", fontsize=8, loc="left")
            if (source[t] == t).any():
                ax.contourf((source[t] == t).double(), levels=[0.5, 1.5], colors="none",
                            hatches=["//"])
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def draw_drift(table: torch.Tensor, parity64: float):
    """The bf16 drift between every two layouts (log scale; 0 drawn white), beside float64's."""
    import matplotlib.colors as colors

    fig = _new_figure((6, 4.2))
    ax = fig.subplots()
    shown = torch.where(table > 0, table, torch.nan)
    image = ax.imshow(shown, cmap="viridis", norm=colors.LogNorm(vmin=1e-5, vmax=1e-1))
    ax.set_xticks(range(4), LAYOUTS, rotation=30, ha="right")
    ax.set_yticks(range(4), LAYOUTS)
    for i in range(4):
        for j in range(4):
            ax.text(j, i, "0" if table[i, j] == 0 else f"{table[i, j]:.0e}", ha="center",
                    va="center", fontsize=8, color="black" if table[i, j] == 0 else "white")
    fig.colorbar(image, label="largest |Δ log p|, bf16 (MEASURED)")
    ax.set_title(f"bf16: the same tokens scored at each layout (float64: {parity64:.0e})",
                 fontsize=9)
    return fig
