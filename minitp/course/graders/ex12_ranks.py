"""ex12 on real ranks: the learner's order as a custom schedule of `train_step`, on
Mesh(pp=4) and Mesh(pp=2, dp=2) in float64, beside the plain GPT (see ex12.py)."""

from __future__ import annotations

import torch

from ...data_parallel import make_optimizer
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...runtime._device import device
from ...runtime.mesh import Mesh
from ...step import train_step

MESHES = ((dict(pp=4), 6), (dict(pp=2, dp=2), 3))  # the real runs: mesh sizes, microbatches
CFG = dict(vocab_size=16, seq_len=8, n_layer=4, n_head=2, d_model=8)
ROWS, STEPS = 2, 2  # rows per microbatch (per dp rank), AdamW steps
TOLERANCE = 1e-10  # float64
TIMEOUT = 60.0


def _in_rank(fn, batches):
    """Every rank: the plain GPT and its pipeline trained side by side, per mesh."""
    def schedule(p, r, m, v=1):
        return fn(p, r, m)

    found = {}
    for sizes, m in MESHES:
        mesh = Mesh(**sizes)
        torch.manual_seed(0)
        ref = GPT(GPTConfig(**CFG)).double().to(device())
        model = parallelize(ref, mesh)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
        worst = (0.0, "the loss")
        for x, y in batches:
            x, y = x[:ROWS * m * mesh.dp.size].to(device()), y[:ROWS * m * mesh.dp.size].to(
                device())
            ref_opt.zero_grad()
            _, ref_loss = ref(x, y)
            ref_loss.backward()
            ref_opt.step()
            loss = train_step(model, (x, y), mesh, opt, schedule=schedule, microbatches=m)
            worst = max(worst, (abs(loss - ref_loss.item()), "the loss"))
        dense = model.full_state_dict()
        worst = max([worst] + [((dense[n] - q.detach()).abs().max().item(),
                                f"{n} after {STEPS} steps") for n, q in ref.named_parameters()])
        found[_label(sizes)] = worst
    return found


def _label(sizes) -> str:
    return " × ".join(f"{k}={n}" for k, n in sizes.items())
