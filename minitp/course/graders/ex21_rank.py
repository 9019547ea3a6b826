"""ex21 on the ranks: the learner's `Zero3Unit` around two small MLP blocks, two steps
beside the plain blocks, then two micro-batches of gradient accumulation on fresh units.
What each rank found goes to the parent, which judges it (ex21_checks.py).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ...rules import round_up
from ...runtime import trace
from ...runtime._device import device
from ...runtime.mesh import world
from .ex21_watch import _alive_bytes, _MadeInForward, _WatchBackward

STEPS, UNITS, LR = 2, 2, 0.1
B, T, D = 2, 3, 5  # per rank: batch, sequence, width (the MLP's hidden layer is 4D)


def _block() -> nn.Module:
    """LayerNorm + MLP, 235 parameters: padded at dp = 2 and 3 alike."""
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


def _flat_grad(module, padded) -> torch.Tensor:
    flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    return nn.functional.pad(flat, (0, padded - flat.numel()))


def _fresh(unit_class, axis, dev, seed: int):
    """UNITS plain blocks drawn from `seed`, a copy of them (the reference), the learner's
    units over the blocks, and a block's numel, padded size and shard size."""
    torch.manual_seed(seed)
    blocks = [_block().double().to(dev) for _ in range(UNITS)]
    refs = copy.deepcopy(blocks)
    numel = sum(p.numel() for p in refs[0].parameters())
    padded = round_up(numel, axis.size)
    return refs, [unit_class(block, axis) for block in blocks], numel, padded, padded // axis.size


def _in_rank(unit_class):
    """Runs on every rank: the learner's units against the plain blocks."""
    axis, dev = world(), device()
    n, r = axis.size, axis.rank
    refs, units, numel, padded, size = _fresh(unit_class, axis, dev, seed=0)
    generator = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(STEPS):
        x = torch.randn(n * B, T, D, generator=generator, dtype=torch.float64).to(dev)
        w = torch.randn(n * B, T, D, generator=generator, dtype=torch.float64).to(dev)
        mine = slice(r * B, (r + 1) * B)  # this rank's rows of the global batch
        record = {"grad": [], "after_fwd": [], "error": {}, "crash": None}
        # the plain blocks, the whole batch
        ref_in = x.clone().requires_grad_()
        h = ref_in
        for block in refs:
            h = block(h)
        ref_out = h
        (ref_out * w).sum().backward()
        # the learner's units, this rank's rows
        mine_in = x[mine].clone().requires_grad_()
        first = len(trace.events())
        h, made = mine_in, []
        with trace.phase("fwd"):
            for unit in units:
                with _MadeInForward(numel) as watch:
                    h = unit(h)
                made.append(watch.made)
                record["after_fwd"].append(_alive_bytes(watch.made))
        with _WatchBackward(made) as watch:
            try:
                (h * w[mine]).sum().backward()
            except NotImplementedError:
                raise  # a blank still there (it is a RuntimeError): "not written yet"
            except RuntimeError as error:
                record["crash"] = str(error).strip().splitlines()[0]
        record["held"] = watch.held
        record["after_bwd"] = _alive_bytes([ref for refs_ in made for ref in refs_]
                                           + watch.gathered)
        events = trace.events()[first:]
        record["ops"] = [(e.op, e.phase or "fwd", e.nbytes) for e in events if e.is_comm]
        steps.append(record)
        if record["crash"]:
            break  # the gradients are half made: nothing more to compare
        record["error"]["output"] = (h - ref_out[mine]).abs().max().item()
        record["error"]["input gradient"] = (mine_in.grad - ref_in.grad[mine]).abs().max().item()
        with torch.no_grad():
            for k, unit in enumerate(units):
                grad = _flat_grad(refs[k], padded)[r * size:(r + 1) * size]
                mine_grad = unit.shard.grad
                ok = mine_grad is not None and mine_grad.shape == grad.shape
                record["grad"].append((mine_grad - grad).abs().max().item() if ok else None)
                for p in refs[k].parameters():  # one SGD step, both sides
                    p -= LR * p.grad
                    p.grad = None
                if ok:
                    unit.shard -= LR * mine_grad
                unit.shard.grad = None
    return {"steps": steps, "padded": padded, "e": 8,
            "accumulate": _accumulate(unit_class, axis, dev)}


def _accumulate(unit_class, axis, dev) -> dict:
    """Two micro-batches before one step, on fresh units: both forwards, then both
    backwards (micro-batch 1's first). The shards' gradients against the plain blocks'
    accumulated ones, and against each micro-batch's alone (to name an overwrite)."""
    n, r = axis.size, axis.rank
    refs, units, numel, padded, size = _fresh(unit_class, axis, dev, seed=2)
    generator = torch.Generator().manual_seed(3)
    batches = [tuple(torch.randn(n * B, T, D, generator=generator, dtype=torch.float64).to(dev)
                     for _ in range(2)) for _ in range(2)]  # (x, w) per micro-batch
    mine = slice(r * B, (r + 1) * B)
    alone = []  # per micro-batch: each unit's slice of the plain gradient of it alone
    for x, w in batches:
        h = x
        for block in refs:
            h = block(h)
        (h * w).sum().backward()
        alone.append([_flat_grad(block, padded)[r * size:(r + 1) * size].clone()
                      for block in refs])
        for block in refs:
            for p in block.parameters():
                p.grad = None
    outputs, made = [], []
    for x, _ in batches:
        h = x[mine].clone().requires_grad_()  # as in the steps: the input's gradient too
        for unit in units:
            with _MadeInForward(numel) as watch:
                h = unit(h)
            made.append(watch.made)
        outputs.append(h)
    record = {"crash": None, "error": None, "alone": None, "micro": None}
    with _WatchBackward([]) as watch:
        for k, (h, (_, w)) in enumerate(zip(outputs, batches, strict=True)):
            try:
                (h * w[mine]).sum().backward()
            except NotImplementedError:
                raise
            except RuntimeError as error:
                record["crash"] = str(error).strip().splitlines()[0]
                record["micro"] = k + 1
                return record
    record["after_bwd"] = _alive_bytes([ref for refs_ in made for ref in refs_]
                                       + watch.gathered)
    errors, alone_errors = [], [[], []]
    for u, unit in enumerate(units):
        got = unit.shard.grad
        if got is None or got.shape != alone[0][u].shape:
            record["error"] = None
            record["shape"] = u
            return record
        errors.append((got - alone[0][u] - alone[1][u]).abs().max().item())
        for k in range(2):
            alone_errors[k].append((got - alone[k][u]).abs().max().item())
    record["error"] = errors
    record["alone"] = [max(e) for e in alone_errors]
    return record
