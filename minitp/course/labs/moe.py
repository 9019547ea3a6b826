"""Lab: a mixture of experts across ranks (lesson 26). Routing and balancing trained on one
device, one step of expert parallelism traced on four ranks, and the mesh against one device.

    runs = {b: train(balance=b) for b in ("none", "aux", "bias")}  # one device, a few s each
    runs["none"].load              # (steps, layers, E): assignments per expert, each step
    runs["none"].routes            # (steps, len(PROBE), k): where layer 0 sent each probe token
    ep = ep_runs(EP_CFG)           # one launch of 4 ranks: Mesh(dp=4, ep=4), then dp=4, ep=2
    ep["routed"], ep["forced"]     # every rank's events of one traced step (a list of Event)
    moe_window(ep["forced"], 0)    # layer 0's forward MoE, every rank: for the timeline

Everything in a `Training` is read from the model while it trains (``MoE.load`` and
``MoE.dropped`` after each step, the router's choices for a fixed probe text); the
per-rank numbers of `ep_runs` come from the trace (the all-to-alls' rows and bytes, the
experts' compute region timed on each rank). The single-device loop is plain PyTorch
(forward, backward, AdamW, then `update_expert_bias`), so the loads can be read before
the bias update clears them; it is exactly what `mt.train_step` does on one rank.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from ... import data
from ...model import GPT, GPTConfig
from ...model.moe import moe_layers, update_expert_bias
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...step import train_step

CFG = GPTConfig(vocab_size=256, seq_len=64, n_layer=2, n_head=4, d_model=64, n_experts=4,
                top_k=2)
# The traced steps: wider experts, so that a rank's expert compute takes long enough to see
EP_CFG = GPTConfig(vocab_size=256, seq_len=64, n_layer=2, n_head=4, d_model=256, n_experts=4,
                   top_k=2)
PROBE = "def forward(self, x):"  # a fixed text: where its tokens go is drawn step by step


@dataclass
class Training:
    """One run on one device, step by step."""

    balance: str
    capacity_factor: float | None
    losses: list[float]
    load: torch.Tensor     # (steps, layers, E) assignments per expert, before any drop
    dropped: torch.Tensor  # (steps, layers) assignments the capacity dropped
    routes: torch.Tensor   # (steps, len(PROBE), k) layer 0's experts for each probe token
    seconds: float
    model: GPT             # as trained

    @property
    def assignments(self) -> int:
        """Assignments per layer per step (batch · seq_len · k)."""
        return int(self.load[0, 0].sum())

    def max_violation(self) -> torch.Tensor:
        """(steps, layers): the busiest expert's load over the mean load, minus 1
        (DeepSeek-V3's MaxVio): 0 when balanced, E/k − 1 when k experts take everything."""
        return self.load.max(-1).values / self.load.mean(-1) - 1


def train(cfg: GPTConfig = CFG, steps: int = 60, batch: int = 8, lr: float = 3e-3,
          seed: int = 0, **moe) -> Training:
    """Train `cfg` (with `moe`'s fields replaced: balance, capacity_factor, …) on the
    embedded corpus for `steps` AdamW steps, recording what the MoE layers saw."""
    cfg = replace(cfg, **moe)
    tokens = data.load_tokens()
    probe = data.encode(PROBE)[None].to(device())
    torch.manual_seed(seed)
    model = GPT(cfg).to(device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    layers = moe_layers(model)
    first = layers[0].router
    losses, loads, dropped, routes = [], [], [], []
    started = time.perf_counter()
    with _one_thread():  # a tiny model: one thread is fastest on shared cores
        for step in range(steps):
            x, y = (t.to(device()) for t in data.get_batch(tokens, step, batch, cfg.seq_len,
                                                           seed))
            optimizer.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            loads.append(torch.stack([layer.load.detach().clone() for layer in layers]))
            dropped.append(torch.tensor([layer.dropped for layer in layers]))
            update_expert_bias(model)  # moves the bias (balance="bias"), clears the loads
            routes.append(_route(model, first, probe))
    return Training(cfg.balance, cfg.capacity_factor, losses, torch.stack(loads).cpu(),
                    torch.stack(dropped), torch.stack(routes), time.perf_counter() - started,
                    model)


@contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@torch.no_grad()
def _route(model, router, probe) -> torch.Tensor:
    """The experts `router` chooses for each token of `probe` (an evaluation forward)."""
    seen = []
    handle = router.register_forward_hook(lambda _m, _a, out: seen.append(out[0]))
    model.eval()
    try:
        model(probe)
    finally:
        model.train()
        handle.remove()
    return seen[0].cpu()


# --------------------------------------------------------------------------- across ranks
def _timed_experts(model) -> None:
    """Each MoE layer's experts run inside a compute region named "experts", so the
    timeline shows how long each rank's share of the experts took."""
    for layer in moe_layers(model):
        run = layer.experts.forward

        def timed(x, counts, run=run):
            with trace.region("experts"):
                return run(x, counts)

        layer.experts.forward = timed


def _one_step(cfg, mesh, batch, step, force=()):
    """Build, parallelize and train one warm-up step, then trace step `step`: this rank's
    events of that step. `force`: experts whose bias is set so high that every token
    chooses them (with balance="none" the bias never moves)."""
    torch.manual_seed(0)
    model = parallelize(GPT(cfg).to(device()), mesh)
    _timed_experts(model)
    layers = moe_layers(model)
    for layer in layers:
        layer.router.expert_bias[list(force)] = 10.0
    seen = []
    layers[0].router.register_forward_hook(lambda _m, _a, out: seen.append(out[0]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = data.load_tokens()
    for k in (step - 1, step):
        trace.clear()
        x, y = (t.to(device()) for t in data.get_batch(tokens, k, batch, cfg.seq_len))
        train_step(model, (x, y), mesh, optimizer)
    per = cfg.n_experts // mesh.ep.size  # the ep rank holding expert e: e // per
    sends = torch.bincount(seen[-1].flatten() // per, minlength=mesh.ep.size)
    return trace.events(), sends.cpu()


def _equal_steps(cfg, mesh, batches, lr):
    """float64 AdamW steps on the mesh: the losses, and the whole model gathered."""
    torch.manual_seed(0)
    model = parallelize(GPT(cfg).double().to(device()), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = [train_step(model, (x.to(device()), y.to(device())), mesh, optimizer)
              for x, y in batches]
    state = model.full_state_dict()
    return losses, {k: v.cpu() for k, v in state.items()}


def one_device(cfg, batches, lr):
    """The same float64 steps on the plain GPT, in this process: losses and parameters."""
    torch.manual_seed(0)
    model = GPT(cfg).double().to(device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x.to(device()), y.to(device()))
        loss.backward()
        optimizer.step()
        update_expert_bias(model)
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()
                    if not k.endswith("expert_bias")}


def _ranks(cfg, batch, equal_cfg, batches, lr, force):
    mesh = Mesh(dp=4, ep=4)
    routed = _one_step(cfg, mesh, batch, 1)
    forced = _one_step(cfg, mesh, batch, 1, force)
    with trace.paused():
        equal = _equal_steps(equal_cfg, Mesh(dp=4, ep=2), batches, lr)
    return {"routed": routed, "forced": forced, "equal": equal if mesh.rank == 0 else None}


def equal_batches(cfg, steps=3, batch=8, seed=1):
    """`steps` batches of the corpus for the float64 comparison."""
    tokens = data.load_tokens()
    return [data.get_batch(tokens, k, batch, cfg.seq_len, seed) for k in range(steps)]


def ep_runs(cfg: GPTConfig = EP_CFG, batch: int = 32, force=(0, 1), equal_cfg=None,
            batches=None, lr: float = 1e-2) -> dict:
    """One launch of 4 ranks: one traced step on Mesh(dp=4, ep=4) as the router chooses
    ("routed": no bias set), one with experts `force` chosen by every token ("forced"),
    both with balance="none", so nothing moves the bias; then float64 AdamW steps on
    Mesh(dp=4, ep=2) ("equal": rank 0's losses and the gathered model, balanced by the
    aux loss). For "routed" and "forced": the merged events of the traced step, and
    "rows": (4, 4), the rows rank i sent rank j in layer 0's forward dispatch."""
    cfg = replace(cfg, balance="none")
    equal_cfg = equal_cfg or replace(CFG, vocab_size=64, seq_len=16, d_model=16, n_head=2,
                                     balance="aux")
    batches = batches or [(x % equal_cfg.vocab_size, y % equal_cfg.vocab_size)
                          for x, y in equal_batches(equal_cfg)]
    run = launch(_ranks, 4, cfg, batch, equal_cfg, batches, lr, tuple(force), timeout=180)
    out = {name: trace.merge([r[name][0] for r in run]) for name in ("routed", "forced")}
    out.update({f"{name} rows": torch.stack([r[name][1] for r in run])
                for name in ("routed", "forced")})
    out.update(equal=run[0]["equal"], equal_cfg=equal_cfg, batches=batches, lr=lr, cfg=cfg,
               batch=batch)
    return out


def moe_window(events, layer: int = 0, phase: str = "fwd") -> list:
    """Every rank's events of one MoE layer in one phase: its all-to-alls (counts,
    dispatch, combine) and, in the forward, the experts' region between them."""
    mine = [e for e in events if e.label.startswith(f"layer{layer}.moe") and e.phase == phase]
    out = list(mine)
    for rank in {e.rank for e in mine}:
        ends = [e for e in mine if e.rank == rank]
        lo, hi = min(e.start for e in ends), max(e.end for e in ends)
        out += [e for e in events if e.rank == rank and e.label == "experts"
                and lo <= e.start and e.end <= hi]
    return sorted(out, key=lambda e: (e.start, e.rank))


def per_rank(events, layer: int = 0) -> list[dict]:
    """For each rank, from the trace of one step: the rows its experts ran in `layer`'s
    forward (the rows its combine sends back), the seconds of its experts' region and of
    its combine (the wait for the slowest rank is inside it), and every MoE all-to-all's
    bytes, ``bytes[(layer, phase, kind)] = (model, measured)``: model, the rows sent to
    other ranks × a row's bytes; measured, the kernel's counter (None where another
    collective was in flight in the process: the counter cannot split them)."""
    rows = []
    for rank in sorted({e.rank for e in events}):
        window = [e for e in moe_window(events, layer) if e.rank == rank]
        combine = next(e for e in window if e.label.endswith("moe combine"))
        sent = {}
        for e in events:
            if e.rank == rank and e.op == "all_to_all" and ".moe " in e.label:
                where, kind = e.label.split(".moe ")
                sent[(int(where.removeprefix("layer")), e.phase, kind)] = (e.model_bytes,
                                                                          e.sent_bytes)
        rows.append({"rank": rank, "rows": combine.shape[0], "combine_s": combine.duration,
                     "experts_s": sum(e.duration for e in window if e.label == "experts"),
                     "bytes": sent})
    return rows
