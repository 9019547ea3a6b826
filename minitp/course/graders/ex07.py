"""Checks for ex07: selective recomputation of the attention core, by hand.

At t = 1 and 2 ranks, in float64 with dropout 0.1, a tensor-parallel GPT whose
attention cores the learner's `recompute_attention_cores` wrapped is trained
for two steps beside the same model without recomputation, the same random
seed before each step:

* the loss and every gradient are equal (recomputation changes no number —
  which needs the recomputed dropout to draw the same mask);
* after each backward pass the random generator is where the plain model left
  it (the recomputation must not shift the masks of everything after it);
* an `ActivationLedger` of the forward pass finds no s×s tensor kept in any
  layer (scores, probabilities, dropout mask: the 5as²b of Table 2), and the
  core ran once per layer in the forward pass and once again in the backward.
"""

from __future__ import annotations

import torch

from ...memory.activations import ActivationLedger
from ...model import GPT, AttentionCore, GPTConfig
from ...parallelize import parallelize
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from .base import Check, run_per_size

WORLD_SIZES = (1, 2)
TOLERANCE = 1e-12  # float64
CFG = dict(vocab_size=32, seq_len=20, n_layer=2, n_head=4, d_model=16, dropout=0.1)  # s != h
STEPS, LR = 2, 0.5


def _batch(step, cfg):
    generator = torch.Generator().manual_seed(60 + step)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=generator)
    y = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=generator)
    return x, y


def _in_rank(recompute_attention_cores):
    mesh = Mesh(tp=world().size)
    cfg = GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    plain = parallelize(ref, mesh)
    mine = recompute_attention_cores(parallelize(ref, mesh))
    calls = {"fwd": 0, "bwd": 0}
    phase = ["fwd"]
    for module in mine.modules():
        if isinstance(module, AttentionCore):
            module.register_forward_hook(lambda *_: calls.__setitem__(phase[0],
                                                                      calls[phase[0]] + 1))
    found = {"loss": [], "grad": (0.0, ""), "rng": True, "square": [], "calls": []}
    params = dict(plain.named_parameters())
    for step in range(STEPS):
        x, y = (t.to(device()) for t in _batch(step, cfg))  # drawn on the CPU
        torch.manual_seed(100 + step)
        _, plain_loss = plain(x, y)
        plain_loss.backward()
        plain_state = torch.get_rng_state()

        torch.manual_seed(100 + step)
        calls.update(fwd=0, bwd=0)
        phase[0] = "fwd"
        try:
            with ActivationLedger(mine) as ledger:
                _, loss = mine(x, y)
            phase[0] = "bwd"
            loss.backward()
        except NotImplementedError as exc:  # a blank: every rank raises it at the same point
            return {"missing": ("forward" if phase[0] == "fwd" else "backward", str(exc))}
        found["rng"] &= torch.equal(torch.get_rng_state(), plain_state)
        found["calls"].append(dict(calls))
        square = [(e.layer, e.module, e.op, e.shape) for e in ledger.entries
                  if e.layer and e.nbytes and len(e.shape) >= 2
                  and tuple(e.shape[-2:]) == (cfg.seq_len, cfg.seq_len)]
        found["square"] += square
        found["loss"].append(abs(loss.item() - plain_loss.item()))
        for name, p in mine.named_parameters():
            expected = params[_plain_name(name)].grad
            if p.grad is None:
                return {"problem": f"step {step}: {name} got no gradient"}
            error = (p.grad - expected).abs().max().item()
            if error > found["grad"][0]:
                found["grad"] = (error, name)
        with torch.no_grad():  # one SGD step on both, so step 2 starts somewhere new
            for model in (plain, mine):
                for p in model.parameters():
                    p -= LR * p.grad
                    p.grad = None
    return found


def _plain_name(name: str) -> str:
    return name.replace("attn.core.core.", "attn.core.")


def run(module) -> list[Check]:
    def launch_at(t):
        return launch(_in_rank, t, module.recompute_attention_cores, timeout=10.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, blank=_blank,
                        what="RecomputedCore", size="t")


def _names(t) -> list[str]:
    return [f"t={t}: loss and every gradient equal no recomputation (2 steps, dropout)",
            f"t={t}: the random generator is left as it was found",
            f"t={t}: no s×s tensor kept; the core is recomputed in backward"]


def _missing(per_rank):
    return next((r["missing"] for r in per_rank if "missing" in r), None)


def _judge(t, names, per_rank) -> list[Check]:
    missing = _missing(per_rank)
    if missing:
        return ([Check(names[0], False, f"the {missing[0]} of RecomputedCore is not "
                       "written yet", hint=missing[1])]
                + [Check(n, False, f"not checked: the {missing[0]} is not written yet")
                   for n in names[1:]])
    problem = next(((rank, r["problem"]) for rank, r in enumerate(per_rank)
                    if "problem" in r), None)
    if problem:
        return ([Check(names[0], False, f"rank {problem[0]}: {problem[1]}", rank=problem[0],
                       hint="backward must return (None, grad_q, grad_k, grad_v): one entry "
                            "per forward input")]
                + [Check(n, False, "not checked: the run above failed") for n in names[1:]])
    return [_equal(names[0], per_rank), _rng(names[1], per_rank), _kept(names[2], per_rank, t)]


def _blank(per_rank, checks) -> str | None:
    missing = _missing(per_rank)
    return f"the {missing[0]} is not written yet" if missing else None


def _equal(name, per_rank) -> Check:
    first_loss = max(r["loss"][0] for r in per_rank)  # before any update: the forward alone
    loss_error = max(max(r["loss"]) for r in per_rank)
    grad_error, rank, tensor = max((r["grad"][0], rank, r["grad"][1])
                                   for rank, r in enumerate(per_rank))
    if first_loss > TOLERANCE:
        return Check(name, False, f"the loss differs by {first_loss:.3g}", tensor="loss",
                     max_error=first_loss, hint="the forward must return core(q, k, v) itself")
    if grad_error > TOLERANCE:
        return Check(name, False, f"rank {rank}: gradient of {tensor} off by up to "
                     f"{grad_error:.3g}", rank=rank, tensor=f"grad of {tensor}",
                     max_error=grad_error,
                     hint="the recomputation must redraw the same dropout mask: "
                          "torch.set_rng_state(the state saved in forward) before running the "
                          "core again, then back-propagate grad_out through its output")
    if loss_error > TOLERANCE:
        return Check(name, False, f"the loss of step 2 differs by {loss_error:.3g}",
                     tensor="loss", max_error=loss_error,
                     hint="the first step matched: check what your backward changes besides "
                          "the gradients it returns")
    worst = max(loss_error, grad_error)
    return Check(name, True, f"largest error {worst:.1e}", max_error=worst)


def _rng(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        if not r["rng"]:
            return Check(name, False, f"rank {rank}: after backward the generator is not where "
                         "the model without recomputation leaves it", rank=rank,
                         hint="remember torch.get_rng_state() before setting the saved state, "
                              "and torch.set_rng_state(it) again after the recomputation")
    return Check(name, True, "the same generator state after every backward pass")


def _kept(name, per_rank, t) -> Check:
    layers = CFG["n_layer"]
    for rank, r in enumerate(per_rank):
        if r["square"]:
            layer, module, op, shape = r["square"][0]
            return Check(name, False, f"rank {rank}, {layer}: {module} kept {op}'s {shape}",
                         rank=rank, tensor=f"{op} output",
                         hint="run the core under torch.no_grad() in forward and save only "
                              "q, k, v (ctx.save_for_backward)")
        for step, calls in enumerate(r["calls"]):
            if calls != {"fwd": layers, "bwd": layers}:
                return Check(name, False, f"rank {rank}, step {step}: the core ran "
                             f"{calls['fwd']} times in forward and {calls['bwd']} in backward, "
                             f"expected {layers} and {layers} (once per layer each)",
                             rank=rank, hint="backward must run ctx.core(...) once again, "
                                             "under torch.enable_grad()")
    return Check(name, True, f"no s×s tensor kept; the core ran once per layer forward and "
                 f"once again backward, on every rank (t={t})")
