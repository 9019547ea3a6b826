"""PyTorch's own parallelism (`minitp.torch_parallel`) equals one device and minitp's, in
float64: DTensor tensor parallelism (with and without SP), FSDP2 and HSDP, on a sample of
dp × tp meshes (HSDP × TP included). Per step the loss; after the first step every
gradient; after the last the parameters (after AdamW steps). One mesh also trains
minitp's ZeRO-3 beside torch's FSDP2 and compares the two directly. A packed batch
(x, y, positions) at tp 2 with SP: its loss and every gradient, the plain GPT's on the same
packed rows.

Budget: one launch of 2 ranks and one of 4, several meshes each."""

import pytest
import torch
from helpers import random_batches
from torch.distributed.tensor import DTensor

import minitp as mt
import minitp.torch_parallel as tpar

TOLERANCE = 1e-10
CFG = dict(vocab_size=10, seq_len=12, n_layer=2, n_head=4, d_model=16)
STEPS = 3


def _whole(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _train(sizes, sp=False, hsdp=None, with_minitp=False):
    """The plain GPT, torch's version (and minitp's ZeRO-3) trained side by side."""
    mesh = mt.Mesh(**sizes)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = mt.GPT(cfg).double()
    model = tpar.parallelize(ref, mesh, sequence_parallel=sp, hsdp=hsdp)
    ours = mt.parallelize(ref, mesh, sequence_parallel=sp, zero_stage=3) if with_minitp else None
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    our_opt = mt.make_optimizer(ours, mesh, torch.optim.AdamW, lr=1e-2) if ours else None
    errors = {"loss": 0.0, "grad": 0.0, "param": 0.0, "minitp": 0.0}
    for step, (x, y) in enumerate(random_batches(STEPS, cfg, 4 * mesh.dp.size,
                                                 ignored=((0, slice(0, 5)),))):
        ref_opt.zero_grad()
        _, ref_loss = ref(x, y)
        ref_loss.backward()
        loss = tpar.train_step(model, (x, y), opt)
        if ours is not None:
            errors["minitp"] = max(errors["minitp"],
                                   abs(mt.train_step(ours, (x, y), mesh, our_opt) - loss))
        errors["loss"] = max(errors["loss"], abs(loss - ref_loss.item()))
        if step == 0:
            grads = dict(model.named_parameters())
            errors["grad"] = max((_whole(grads[n].grad) - p.grad).abs().max().item()
                                 for n, p in ref.named_parameters())
        ref_opt.step()
    theirs = dict(model.named_parameters())
    errors["param"] = max((_whole(theirs[n]).detach() - p.detach()).abs().max().item()
                          for n, p in ref.named_parameters())
    return errors


def _packed(sizes, sp=False):
    """One step on packed rows (documents of 5 and 7, then 3 and 9 tokens): the loss and
    every gradient against the plain GPT given the same positions."""
    mesh = mt.Mesh(**sizes)
    torch.manual_seed(0)
    ref = mt.GPT(mt.GPTConfig(**CFG)).double()
    model = tpar.parallelize(ref, mesh, sequence_parallel=sp)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, CFG["vocab_size"], (4, CFG["seq_len"]), generator=g)
            for _ in range(2))
    positions = torch.tensor([[*range(5), *range(7)]] * 2 + [[*range(3), *range(9)]] * 2)
    _, ref_loss = ref(x, y, positions=positions)
    ref_loss.backward()
    loss = tpar.train_step(model, (x, y, positions), torch.optim.SGD(model.parameters(), lr=0))
    grads = dict(model.named_parameters())
    return {"loss": abs(loss - ref_loss.item()),
            "grad": max((_whole(grads[n].grad) - p.grad).abs().max().item()
                        for n, p in ref.named_parameters())}


def _two():
    return {"tp2": _train({"tp": 2}), "tp2+sp": _train({"tp": 2}, sp=True),
            "dp2": _train({"dp": 2}), "tp2+sp, packed": _packed({"tp": 2}, sp=True)}


def _four():
    return {"dp2xtp2+sp vs ZeRO-3": _train({"dp": 2, "tp": 2}, sp=True, with_minitp=True),
            "hsdp2x2": _train({"dp": 4}, hsdp=2),
            "hsdp2x1xtp2+sp (a 3-D mesh)": _train({"dp": 2, "tp": 2}, sp=True, hsdp=2)}


@pytest.mark.parametrize("world,fn", [(2, _two), (4, _four)])
def test_torch_parallel_equals_one_device_and_minitp(world, fn):
    run = mt.launch(fn, world, timeout=120)
    for rank in range(world):
        for case, errors in run[rank].items():
            assert max(errors.values()) <= TOLERANCE, (rank, case, errors)
