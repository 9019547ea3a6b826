"""Lab: an optimizer that needs the whole matrix — Muon over ZeRO's shards and tensor
parallelism (lesson 22).

* `slice_or_whole`: Newton–Schulz of a flat shard's rows against the same rows of the whole
  matrix's Newton–Schulz, and an elementwise update (Adam's kind) the same two ways, MEASURED;
* `strategies_run`: one launch of 4 ranks, a tiny float64 GPT under ZeRO-1 trained with
  Muon by each strategy (gather and owner at dp = 4, tp at dp = 2 × tp = 2) beside one
  device's Muon: per rank, the loss's and the parameters' distance from one device, the
  Newton–Schulz FLOPs it ran (counted as they ran), the bytes Muon's collectives carried in
  the last step (the trace's count of the collectives that ran), the matrices as ZeRO cut
  them (for `mt.calc.muon_comm_bytes`), Muon's and AdamW's state bytes (MEASURED, the
  ledger) and the last optimizer step's events, each Newton–Schulz a compute region;
* `seconds`: a MODEL of Muon's part of a step per rank, `muon_comm_bytes` over a link of
  `mt.calc`'s clusters plus the busiest rank's Newton–Schulz FLOPs at the GPU's peak;
* `crossover` / `k2_experts`: from which width owner's model beats gather's, and one MoE
  layer's expert matrices at Kimi K2's published shapes (MoonshotAI/Kimi-K2, README.md,
  "Model Summary": hidden 7168, 2048 per expert, 384 experts and 1 shared, SwiGLU).
"""

from __future__ import annotations

import torch

from ...calc.footprint.muon import lpt_owners, muon_comm_bytes, ns_flops
from ...calc.network.cluster import CLUSTERS
from ...data_parallel import gathered, make_optimizer
from ...memory import measure_model_states
from ...model import GPT, GPTConfig
from ...optim import muon_with_adamw, newton_schulz
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...step import train_step

CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)
OPTIONS = dict(lr=0.02, weight_decay=0.1, adamw_lr=1e-2, adamw_weight_decay=0.01)
# (strategy, mesh sizes): every one at ZeRO-1, the stage Moonlight's distributed Muon runs
SETTINGS = (("gather", dict(dp=4)), ("owner", dict(dp=4)), ("tp", dict(dp=2, tp=2)))
ROWS = 8  # sequences a step (2 per dp rank at dp = 4)


def slice_or_whole(rows: int = 8, cols: int = 6, ranks: int = 4, seed: int = 0) -> dict:
    """A rows×cols momentum cut as ZeRO cuts its flat vector (rank r: the r-th run of
    rows·cols/ranks elements, here whole rows). Per rank, the largest difference between
    the update computed on its run alone and its run of the whole's update: Newton–Schulz's,
    and an elementwise one's (g/(|g|+1e-8), Adam's kind of update)."""
    g = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64).to(device())
    runs, whole = g.chunk(ranks), newton_schulz(g).chunk(ranks)
    def elementwise(t):
        return t / (t.abs() + 1e-8)
    return {"newton_schulz": [(newton_schulz(run) - part).abs().max().item()
                              for run, part in zip(runs, whole, strict=True)],
            "elementwise": [(elementwise(run) - part).abs().max().item() for run, part
                            in zip(runs, elementwise(g).chunk(ranks), strict=True)]}


def _batches(steps: int):
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, CFG["vocab_size"], (ROWS, CFG["seq_len"] + 1), generator=gen)
        yield x[:, :-1].to(device()), x[:, 1:].to(device())


def _traced_ns(inner) -> None:
    """Each Newton–Schulz this rank runs recorded as a compute region "NS" (drawn)."""
    for name in ("ns", "ns_tp"):
        plain = getattr(inner, name)

        def region(piece, x, plain=plain):
            with trace.region("NS"):
                return plain(piece, x)
        setattr(inner, name, region)


def _one(strategy: str, sizes: dict, steps: int) -> dict:
    mesh = Mesh(**sizes)
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**CFG)).double().to(device())
    model = parallelize(ref, mesh, zero_stage=1)
    opt = make_optimizer(model, mesh, "muon", strategy=strategy, **OPTIONS)
    inner = opt.inner
    _traced_ns(inner)
    ref_opt = muon_with_adamw(ref, **OPTIONS)
    loss_error = 0.0
    for x, y in _batches(steps):
        ref_opt.zero_grad()
        _, ref_loss = ref(x, y)
        ref_loss.backward()
        before = len(trace.events())
        loss = train_step(model, (x, y), mesh, opt)
        ref_opt.step()
        loss_error = max(loss_error, abs(loss - ref_loss.item()))
        events = trace.events()[before:]
    with gathered(model):
        dense = model.full_state_dict()
    # the optimizer step's events: Muon's collectives and its Newton–Schulz regions
    step = [e for e in events if e.label.startswith("muon") or e.label == "NS"]
    states = measure_model_states(model, opt)["optimizer_state"]
    return {"loss": loss_error,
            "params": max((dense[n] - p.detach()).abs().max().item()
                          for n, p in ref.named_parameters()),
            "flops": inner.ns_flops, "events": step,
            "bytes": sum(e.model_bytes for e in step if e.is_comm),
            "matrices": [(*p.dense_shape, p.split_dim, [b - a for a, b in p.ranges])
                         for p in inner.pieces],
            "momentum": states["momentum_buffer"],
            "adamw": states["exp_avg"] + states["exp_avg_sq"],
            "n_matrix": sum(p.hi - p.lo for p in inner.pieces)}


def _all(steps: int) -> dict:
    return {strategy: _one(strategy, sizes, steps) for strategy, sizes in SETTINGS}


def strategies_run(steps: int = 3):
    """One launch of 4 ranks: every strategy of `SETTINGS` trained `steps` steps."""
    return launch(_all, 4, steps, timeout=180)


def model_bytes(rank_result: dict, strategy: str) -> float:
    """`mt.calc.muon_comm_bytes` (a MODEL) for this rank's matrices as ZeRO cut them,
    float64 values (8 bytes)."""
    sizes = dict(SETTINGS)[strategy]
    return muon_comm_bytes(rank_result["matrices"], strategy, sizes.get("dp", 1),
                           sizes.get("tp", 1), zero_stage=1, bytes_per=8)["total"]


def gpt_matrices(h: int, layers: int = 1) -> list[tuple[int, int, None]]:
    """A GPT layer's four Muon matrices at width h (qkv, the projection, the MLP's two),
    whole (no tp split): (rows, cols, None) as `muon_comm_bytes` takes them."""
    return [(3 * h, h, None), (h, h, None), (4 * h, h, None), (h, 4 * h, None)] * layers


def k2_experts() -> list[tuple[int, int, None]]:
    """One MoE layer of Kimi K2 (MoonshotAI/Kimi-K2, README.md, "Model Summary"): 384 routed
    experts and 1 shared, each SwiGLU's three matrices, 2048 × 7168 (gate, up) and 7168 ×
    2048 (down). Its attention (MLA) is left out: the summary does not give its shapes."""
    return [(2048, 7168, None), (2048, 7168, None), (7168, 2048, None)] * 385


def seconds(matrices, strategy: str, dp: int, zero_stage: int, cluster: str = "h100",
            bytes_per: int = 2) -> dict:
    """MODEL, per rank and step: Muon's bytes (`muon_comm_bytes`, bf16 by default) over the
    link a group of `dp` consecutive GPUs uses (NVLink inside a node, else InfiniBand:
    `mt.calc`'s cluster), and the busiest rank's Newton–Schulz FLOPs at the GPU's peak
    (gather: every matrix; owner: its LPT home's load). Latency and overlap ignored."""
    machine = CLUSTERS[cluster]
    sent = muon_comm_bytes(matrices, strategy, dp=dp, zero_stage=zero_stage,
                           bytes_per=bytes_per)["total"]
    costs = [ns_flops(r, c) for r, c, *_ in matrices]
    if strategy == "owner":
        load = [0] * dp
        for cost, home in zip(costs, lpt_owners(costs, dp), strict=True):
            load[home] += cost
        flops = max(load)
    else:
        flops = sum(costs)
    _, bandwidth = machine.link(dp)
    return {"bytes": sent, "flops": flops, "comm": sent / bandwidth,
            "ns": flops / machine.peak_flops,
            "total": sent / bandwidth + flops / machine.peak_flops}


def crossover(dp: int, zero_stage: int, cluster: str = "h100", step: int = 64,
              largest: int = 4096) -> int | None:
    """The smallest GPT width h (a multiple of `step`) from which owner's modelled seconds
    stay below gather's; None if it never does up to `largest`; `step` if it always does."""
    found = None
    for h in range(step, largest + 1, step):
        m = gpt_matrices(h)
        ahead = (seconds(m, "owner", dp, zero_stage, cluster)["total"]
                 < seconds(m, "gather", dp, zero_stage, cluster)["total"])
        found = (found or h) if ahead else None
    return found
