"""ex26 on the ranks: the learner's `dispatch_and_combine` alone at ep = 4, every
all-to-all watched (splits that do not match stop every rank, never a hang), then inside
a MoE GPT on Mesh(dp=4, ep=2) for one AdamW step against the plain GPT.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...data_parallel import make_optimizer
from ...expert_parallel import shard_experts
from ...model import GPT, GPTConfig
from ...model.moe import Experts, LocalDispatch, moe_layers
from ...parallelize import parallelize
from ...runtime import comm
from ...runtime._device import device
from ...runtime.mesh import Mesh, world
from ...step import train_step
from .ex26_diagnosis import D, E, K, N, _gradients, _output, _plan, _splits

MODEL = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8, n_experts=4, top_k=2)
STEP_TOLERANCE = 1e-10
REFUSED = "not checked: the all-to-alls' split sizes do not match (see above)"


class _Refused(Exception):
    """The ranks' splits for one all-to-all do not match: every rank stops here."""


class _Watch:
    """Every all-to-all and counts exchange while active; the splits of each compared
    over the ranks before it runs. ``record``: keep the calls (the function alone)."""

    def __init__(self):
        self.calls, self.record = [], False

    def __enter__(self):
        self._originals = a2a, exchange = comm.all_to_all, comm.exchange_counts

        def all_to_all(x, axis, send_splits, recv_splits=None):
            send = [int(s) for s in send_splits]
            recv = None if recv_splits is None else [int(s) for s in recv_splits]
            call = {"kind": "rows" if x.is_floating_point() else "counts", "send": send,
                    "recv": recv, "x": x.detach().clone()}
            if self.record:
                self.calls.append(call)
            problem = None
            if len(send) != axis.size or (recv is not None and len(recv) != axis.size):
                problem = "length"
            elif sum(send) != x.shape[0]:
                problem = "sum"
            everyone = [None] * axis.size
            dist.all_gather_object(everyone, (problem, send, recv), group=axis.group)
            if any(p for p, _, _ in everyone) or any(
                    r is not None and r[s] != everyone[s][1][i]
                    for i, (_, _, r) in enumerate(everyone) for s in range(axis.size)):
                call["problem"] = problem or "mismatch"
                raise _Refused
            out = a2a(x, axis, send_splits, recv_splits)
            call["out"] = out.detach().clone()
            return out

        def exchange_counts(counts, axis):
            got = exchange(counts, axis)
            if self.record:
                self.calls.append({"kind": "counts", "send": list(counts), "recv": got})
            return got

        comm.all_to_all, comm.exchange_counts = all_to_all, exchange_counts
        return self

    def __exit__(self, *exc):
        comm.all_to_all, comm.exchange_counts = self._originals


def _in_rank(fn, step_check: bool):
    """Runs on every rank: the learner's function alone, then in a MoE GPT (if `step_check`)."""
    axis, dev = world(), device()
    ep, r, local = axis.size, axis.rank, E // axis.size
    g = torch.Generator().manual_seed(3)
    tokens = torch.randn(ep * N, D, generator=g, dtype=torch.float64)
    skew = torch.arange(E).repeat(ep * N, 1) == (torch.arange(ep * N) * 3 % E).unsqueeze(1)
    experts = (torch.rand(ep * N, E, generator=g) + skew).topk(K).indices
    gates = torch.rand(ep * N, K, generator=g, dtype=torch.float64) + 0.5
    keep = torch.rand(ep * N, K, generator=g) > 0.2
    w = torch.randn(ep * N, D, generator=g, dtype=torch.float64)
    tokens, experts, gates, keep, w = (t.to(dev) for t in (tokens, experts, gates, keep, w))
    torch.manual_seed(0)
    full = Experts(E, D, bias=True).double().to(dev)
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0, 0.5)
    shard = shard_experts(full, axis)
    # one device: every rank's tokens, all E experts
    ref_t, ref_g = tokens.clone().requires_grad_(), gates.clone().requires_grad_()
    ref_out = LocalDispatch()(ref_t, experts, ref_g * keep, keep, full, E)
    (ref_out * w).sum().backward()
    mine = slice(r * N, (r + 1) * N)
    t, gt = tokens[mine].clone().requires_grad_(), gates[mine].clone().requires_grad_()
    with _Watch() as watch:
        watch.record = True
        try:
            out = fn(t, experts[mine], gt * keep[mine], keep[mine], shard, axis, E)
        except _Refused:
            out = None
        watch.record = False
        plan = _plan(tokens, experts, keep, gates, full, ep, r)
        checks = [_splits(watch.calls, plan, ep, r)]
        if out is None:
            return {"checks": checks + [(False, REFUSED, "", None)] * 3}
        checks.append(_output(out, ref_out[mine], watch.calls, plan, r))
        crash = None
        try:
            (out * w[mine]).sum().backward()
        except RuntimeError as error:
            crash = str(error).strip().splitlines()[0]
        grads = {"tokens": (t.grad, ref_t.grad[mine]), "gates": (gt.grad, ref_g.grad[mine])}
        for name, p in shard.named_parameters():
            grads[f"experts.{name}"] = (p.grad, getattr(full, name).grad[r * local:][:local])
        checks.append(_gradients(checks[1][0], crash, grads, r))
        checks.append(_step(fn, dev) if step_check else (False, "not run", "", None))
    return {"checks": checks}


class _Learners(LocalDispatch):
    """A MoE layer's dispatch that calls the learner's function."""

    def __init__(self, axis, fn):
        super().__init__()
        self.axis, self.fn = axis, fn

    def forward(self, tokens, experts, gates, keep, expert_module, n_experts):
        return self.fn(tokens, experts, gates, keep, expert_module, self.axis, n_experts)


def _step(fn, dev):
    mesh = Mesh(dp=4, ep=2)
    cfg = GPTConfig(**MODEL)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(dev)
    model = parallelize(ref, mesh)
    for layer in moe_layers(model):
        layer.dispatch = _Learners(mesh.ep, fn)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=g).to(dev)
            for _ in range(2))
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    ref_opt.step()
    try:
        loss = train_step(model, (x, y), mesh, opt)
    except _Refused:
        return (False, "the all-to-alls' split sizes do not match in the model", "", None)
    error = abs(loss - ref_loss.item())
    if error > STEP_TOLERANCE:
        return (False, f"the loss differs from one device's by {error:.3g}", "", error)
    dense = model.full_state_dict()
    worst, name = max(((dense[n] - p.detach()).abs().max().item(), n)
                      for n, p in ref.named_parameters())
    if worst > STEP_TOLERANCE:
        return (False, f"after the step, {name} differs by {worst:.3g}", "", worst)
    return (True, f"loss and every parameter after an AdamW step: largest error "
            f"{max(error, worst):.1e}", "", max(error, worst))
