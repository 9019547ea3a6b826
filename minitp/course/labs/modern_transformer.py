"""Lab: the Llama-style GPT across ranks (lesson 09) — its traps run, on real ranks.

One launch of 4 ranks, float64, 3 AdamW steps each, beside the single-device model:

* ``exact``: grouped-query attention with the K/V heads split over tp (tp 2 of 2 K/V
  heads), replicated (tp 4 above 2), and under context parallelism with sequence
  parallelism (cp 2 · tp 2: the rotation at each token's global position);
* ``no_kv_sum``: tp 4 above 2 K/V heads with the replicated heads' gradient sum left out
  (their ``grad_partial_over_tp`` tag taken off): how far the model goes off one device's,
  and how far the two copies of one K/V head drift apart;
* ``local_rope``: cp 4 with each rank rotating its tokens as if they began the sequence
  (positions 0, 1, ... instead of its two chunks' global ones);
* ``ring_bytes``: the bytes the cp ring sends in one step for 1, 2 and 4 K/V heads
  (4 query heads), from the trace.

`activation_bytes` weighs, on one process, what a layer's attention keeps for backward
with 1, 2 and 4 K/V heads (`mt.memory.ActivationLedger`). Everything here is measured;
the formulas beside it in the lesson are `minitp.calc`'s, a MODEL.
"""

from __future__ import annotations

import torch

from ...context_parallel.split import global_positions
from ...data_parallel.zero import make_optimizer
from ...memory.activations import ActivationLedger
from ...model import GPT
from ...model.config import GPTConfig
from ...model.llama_layers import Rotary
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...step import train_step
from .zero_bubble import random_batch  # random ids on mt.device(), seeded

CFG = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, norm="rmsnorm",
           positions="rope", mlp="swiglu", bias=False, n_kv_head=2)
STEPS, LR = 3, 1e-2


def side_by_side(sizes, options, cfg, spoil=None, batches=None) -> dict:
    """3 steps of the parallel model and of one device (`batches`, default 3 seeded random
    ones); `spoil(model)` breaks the parallel one first. The largest loss and parameter
    differences, the model, its mesh and optimizer, and the trace of its last step."""
    mesh = Mesh(**sizes)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    model = parallelize(ref, mesh, **options)
    if spoil is not None:
        spoil(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=LR)
    if batches is None:
        batches = [random_batch(cfg, 2 * sizes.get("dp", 1), seed=step) for step in range(STEPS)]
    loss_gap, events = 0.0, []
    for x, y in batches:
        ref_opt.zero_grad()
        _, ref_loss = ref(x, y)
        ref_loss.backward()
        ref_opt.step()
        trace.clear()
        loss = train_step(model, (x, y), mesh, opt)
        events = trace.events()
        loss_gap = max(loss_gap, abs(loss - ref_loss.item()))
    dense = model.full_state_dict()
    worst = max(((dense[n] - p.detach()).abs().max().item(), n) for n, p in ref.named_parameters())
    return dict(loss_gap=loss_gap, param_gap=worst, model=model, mesh=mesh, optimizer=opt,
                events=events)


def _forget_kv_sum(model) -> None:
    """The step's sum of partial gradients over tp, without the replicated K/V weights."""
    kv = {id(p) for name, p in model.named_parameters() if name.endswith("attn.kv.weight")}
    partial = model.partial_grad_parameters
    model.partial_grad_parameters = lambda: [p for p in partial() if id(p) not in kv]


def _local_positions(model) -> None:
    for module in model.modules():
        if isinstance(module, Rotary):
            module.positions = lambda length, dev: torch.arange(length, device=dev)
            module._tables.clear()


def _ring_bytes(kv_heads) -> int:
    cfg = GPTConfig(**{**CFG, "n_kv_head": kv_heads})
    mesh = Mesh(cp=4)
    torch.manual_seed(0)
    model = parallelize(GPT(cfg).double().to(device()), mesh)
    trace.clear()
    train_step(model, random_batch(cfg, 2, seed=0), mesh,
               torch.optim.SGD(model.parameters(), lr=0.0))
    return sum(e.nbytes for e in trace.events() if e.op == "send" and "ring" in e.label)


def _rank():
    cfg = GPTConfig(**CFG)
    out = {"exact": {}}
    for name, sizes, options in (("K/V split, tp 2 of 2 heads", dict(dp=2, tp=2), {}),
                                 ("K/V replicated, tp 4 > 2 heads", dict(tp=4), {}),
                                 ("cp 2 x tp 2, SP, global positions", dict(cp=2, tp=2),
                                  dict(sequence_parallel=True))):
        run = side_by_side(sizes, options, cfg)
        out["exact"][name] = (run["loss_gap"], run["param_gap"])
    spoiled = side_by_side(dict(tp=4), {}, cfg, spoil=_forget_kv_sum)
    kv = spoiled["model"].blocks[0].attn.kv
    copies = [torch.zeros_like(kv.weight) for _ in range(4)]
    torch.distributed.all_gather(copies, kv.weight.detach().contiguous(),
                                 group=spoiled["mesh"].tp.group)
    out["no_kv_sum"] = dict(loss_gap=spoiled["loss_gap"], param_gap=spoiled["param_gap"],
                            copies_apart=(copies[0] - copies[1]).abs().max().item())
    local = side_by_side(dict(cp=4), {}, cfg, spoil=_local_positions)
    out["local_rope"] = dict(loss_gap=local["loss_gap"], param_gap=local["param_gap"],
                             positions=global_positions(4, local["mesh"].cp).tolist())
    out["ring_bytes"] = {kv: _ring_bytes(kv) for kv in (1, 2, 4)}
    return out


def runs() -> list[dict]:
    """Every rank's results (see the module's docstring)."""
    return list(launch(_rank, 4, timeout=180))


def activation_bytes(kv_heads_each=(1, 2, 4), rows: int = 2, attention: str = "math",
                     whole_layer: bool = False) -> dict:
    """Bytes one layer's attention (or, `whole_layer`, the whole first block, in bfloat16:
    what `minitp.calc.activation_bytes_per_layer` models) keeps for backward, per K/V head
    count, weighed by `ActivationLedger` around the plain model (one process), its core
    written out ("math") or fused ("sdpa")."""
    out = {}
    dtype = torch.bfloat16 if whole_layer else torch.float32
    for kv in kv_heads_each:
        cfg = GPTConfig(**{**CFG, "n_kv_head": kv, "attention": attention})
        torch.manual_seed(0)
        block = GPT(cfg).to(device(), dtype).blocks[0]
        layer = block if whole_layer else block.attn
        x = torch.randn(rows, cfg.seq_len, cfg.d_model, device=device(), dtype=dtype,
                        requires_grad=True)
        with ActivationLedger() as ledger:
            layer(x)
        out[kv] = ledger.total_bytes
    return out
