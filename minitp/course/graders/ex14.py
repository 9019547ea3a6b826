"""Checks for ex14: one ZeRO-3 unit — gather before forward, free after, gather again
for backward, reduce-scatter the gradient.

At dp = 2 and 4, in float64: every rank wraps each of two small MLP blocks (Ψ_u
= 235 values, padded to a multiple of dp) in the learner's `Zero3Unit`, and runs
two steps on its slice of a batch: forward through both units, backward of
a weighted sum, one SGD step on the shards. The plain blocks run beside it on
the whole batch (the loss is a sum, so the ranks' gradients add up to the
plain one). Per world size:

* the output and the input's gradient equal the plain blocks' (this rank's
  rows), at both steps (the second uses the updated shards);
* each rank's shard is its own slice of the flattened, zero-padded parameters
  (values [d·S, (d+1)·S) on dp rank d), and its gradient is that slice of the
  gradient summed over the ranks;
* the trace, per unit and step: one all-gather of the whole vector in the
  forward, one in backward, one reduce-scatter of its gradient in backward, and
  nothing else (an all-reduce of the gradient gives the right slice too, at N×
  the gradient memory: it is named);
* no gathered vector outlives its forward: every tensor of at least Ψ_u values
  made while a unit's forward ran, and every buffer an all-gather filled in
  backward, holds no memory once the pass is over (freed, or its storage
  resized to 0).

Why one file: the run on the ranks and the four judgements read the same record,
field by field; apart, each half would only make sense with the other open.
"""

from __future__ import annotations

import copy
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ...rules import round_up
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, run_per_size

WORLD_SIZES = (2, 4)
STEPS, UNITS, LR = 2, 2, 0.1
B, T, D = 2, 3, 5  # per rank: batch, sequence, width (the MLP's hidden layer is 4D)
TOLERANCE = 1e-12  # float64


def _block() -> nn.Module:
    """LayerNorm + MLP, 235 parameters: padded at dp = 2 and 4 alike."""
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


def _flat(module, padded) -> torch.Tensor:
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return nn.functional.pad(flat, (0, padded - flat.numel()))


class _MadeInForward(TorchFunctionMode):
    """Weak references to every tensor of at least `numel` values made while active."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.made = numel, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.numel:
            self.made.append(weakref.ref(out))
        return out


class _GatheredInBackward:
    """Weak references to every buffer an all-gather fills while active (autograd's
    backward runs outside the forward's function mode)."""

    def __init__(self):
        self.made, self._original = [], None

    def __enter__(self):
        self._original = original = dist.all_gather_into_tensor

        def watched(output, *args, **kwargs):
            self.made.append(weakref.ref(output))
            return original(output, *args, **kwargs)

        dist.all_gather_into_tensor = watched
        return self

    def __exit__(self, *exc):
        dist.all_gather_into_tensor = self._original


def _alive_bytes(refs, settle: float = 0.2) -> int:
    """Bytes the still-referenced tensors of `refs` hold (each storage once). gloo's
    worker thread may drop its reference to a collective's buffer a moment after
    ``wait()`` returns: a tensor only counts if it is still alive `settle` seconds on."""
    deadline = time.perf_counter() + settle
    while True:
        seen, total = set(), 0
        for ref in refs:
            t = ref()
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
            del t
        if total == 0 or time.perf_counter() > deadline:
            return total
        time.sleep(0.002)


def _in_rank(unit_class):
    """Runs on every rank: the learner's units against the plain blocks."""
    axis, dev = world(), device()
    n, r = axis.size, axis.rank
    torch.manual_seed(0)
    blocks = [_block().double().to(dev) for _ in range(UNITS)]
    refs = copy.deepcopy(blocks)
    numel = sum(p.numel() for p in refs[0].parameters())
    padded = round_up(numel, n)
    size = padded // n
    units = [unit_class(block, axis) for block in blocks]
    generator = torch.Generator().manual_seed(1)
    steps = []
    for _ in range(STEPS):
        x = torch.randn(n * B, T, D, generator=generator, dtype=torch.float64).to(dev)
        w = torch.randn(n * B, T, D, generator=generator, dtype=torch.float64).to(dev)
        mine = slice(r * B, (r + 1) * B)  # this rank's rows of the global batch
        record = {"shard": [], "grad": [], "alive_fwd": [], "error": {}}
        for k, unit in enumerate(units):
            shard = getattr(unit, "shard", None)
            expected = _flat(refs[k], padded)
            if not isinstance(shard, nn.Parameter) or shard.shape != (size,):
                shown = tuple(shard.shape) if isinstance(shard, torch.Tensor) else type(shard)
                record["shard"].append(("shape", shown, (size,)))
                continue
            starts = [d * size for d in range(n)
                      if torch.allclose(shard.detach(), expected[d * size:(d + 1) * size],
                                        rtol=0, atol=TOLERANCE)]
            record["shard"].append(("values", starts, r * size))
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
                made += watch.made
                record["alive_fwd"].append(_alive_bytes(made))
        with _GatheredInBackward() as gathered:
            (h * w[mine]).sum().backward()
        record["alive_bwd"] = _alive_bytes(made + gathered.made)
        events = trace.events()[first:]
        record["ops"] = [(e.op, e.phase or "fwd", e.nbytes) for e in events if e.is_comm]
        record["error"]["output"] = (h - ref_out[mine]).abs().max().item()
        record["error"]["input gradient"] = (mine_in.grad - ref_in.grad[mine]).abs().max().item()
        with torch.no_grad():
            for k, unit in enumerate(units):
                grad = _flat_grad(refs[k], padded)[r * size:(r + 1) * size]
                mine_grad = getattr(getattr(unit, "shard", None), "grad", None)
                record["grad"].append(None if mine_grad is None or mine_grad.shape != grad.shape
                                      else (mine_grad - grad).abs().max().item())
                for p in refs[k].parameters():  # one SGD step, both sides
                    p -= LR * p.grad
                    p.grad = None
                if isinstance(getattr(unit, "shard", None), nn.Parameter):
                    if mine_grad is not None and mine_grad.shape == unit.shard.shape:
                        unit.shard -= LR * mine_grad
                    unit.shard.grad = None
        steps.append(record)
    return {"steps": steps, "padded": padded, "size": size, "e": 8}


def _flat_grad(module, padded) -> torch.Tensor:
    flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
    return nn.functional.pad(flat, (0, padded - flat.numel()))


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.Zero3Unit, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="Zero3Unit", size="dp")


def _names(n) -> list[str]:
    return [f"dp={n}: output and input gradient equal the plain blocks', step after step",
            f"dp={n}: each rank keeps its own slice, with that slice of the summed gradient",
            f"dp={n}: per unit: an all-gather in forward, another in backward, a reduce-scatter",
            f"dp={n}: no gathered parameters alive after a unit's forward, nor after backward"]


def _judge(n, names, per_rank) -> list[Check]:
    return [_equality(names[0], per_rank), _shards(names[1], per_rank),
            _collectives(names[2], per_rank), _freed(names[3], per_rank)]


def _equality(name, per_rank) -> Check:
    error, step, rank, tensor = max((err, k, rank, what) for rank, r in enumerate(per_rank)
                                    for k, s in enumerate(r["steps"])
                                    for what, err in s["error"].items())
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    return Check(name, False, f"step {step + 1}, rank {rank}, the {tensor}: largest error "
                 f"{error:.3g}", rank=rank, tensor=tensor, max_error=error,
                 hint="the whole vector is every rank's shard in rank order: all-gather the "
                      "shards (not an all-reduce), and in backward run the module again on "
                      "the same values")


def _shards(name, per_rank) -> Check:
    worst = 0.0
    for rank, r in enumerate(per_rank):
        size = r["size"]
        for k, s in enumerate(r["steps"]):
            for u, (kind, got, want) in enumerate(s["shard"]):
                where = f"step {k + 1}, rank {rank}, unit {u}"
                if kind == "shape":
                    return Check(name, False, f"{where}: shard is {got}, expected an "
                                 f"nn.Parameter of shape {want}", rank=rank, tensor="shard",
                                 hint="padded / axis.size values, wrapped in nn.Parameter")
                if want not in got:
                    held = (f"values [{got[0]}, {got[0] + size})" if got
                            else "no slice of the flattened parameters")
                    return Check(name, False, f"{where}: the shard holds {held}; dp rank "
                                 f"{rank} owns values [{want}, {want + size})", rank=rank,
                                 tensor="shard", hint="rank d keeps the d-th of the N equal "
                                 "slices: start at axis.rank * shard_size")
            for u, error in enumerate(s["grad"]):
                where = f"step {k + 1}, rank {rank}, unit {u}"
                if error is None:
                    return Check(name, False, f"{where}: the shard has no gradient of its "
                                 "shape", rank=rank, tensor="shard.grad",
                                 hint="backward returns the shard's gradient: this rank's "
                                      "slice of the summed gradient")
                if error > TOLERANCE:
                    return Check(name, False, f"{where}: shard.grad largest error {error:.3g}",
                                 rank=rank, tensor="shard.grad", max_error=error,
                                 hint="sum the whole gradient over the ranks and keep this "
                                      "rank's slice: mt.comm.reduce_scatter (no division: the "
                                      "loss is a sum)")
                worst = max(worst, error)
    return Check(name, True, f"largest gradient error {worst:.1e}", max_error=worst)


def _collectives(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        whole = r["padded"] * r["e"]
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            ops = s["ops"]
            if any(op == "all_reduce" for op, _, _ in ops):
                return Check(name, False, f"{where}: made an all_reduce: every rank then holds "
                             "the whole summed gradient, N times what its shard needs",
                             rank=rank, hint="reduce-scatter the gradient: each rank receives "
                             "only its own slice of the sum (and on a ring, half the bytes)")
            fwd = [op for op, phase, _ in ops if phase == "fwd"]
            bwd = [op for op, phase, _ in ops if phase == "bwd"]
            if fwd != ["all_gather"] * UNITS:
                return Check(name, False, f"{where}: forward made {fwd or 'no collective'}; "
                             f"expected one all_gather per unit ({UNITS})", rank=rank,
                             hint="gather the whole vector from the shards just before the "
                                  "module runs, once per forward")
            if bwd.count("all_gather") != UNITS:
                return Check(name, False, f"{where}: backward made {bwd.count('all_gather')} "
                             f"all_gather(s) for {UNITS} units: the whole parameters must be "
                             "gathered again for backward, not kept from the forward",
                             rank=rank, hint="between forward and backward a rank holds only "
                             "its shard; gather again in backward")
            if bwd.count("reduce_scatter") != UNITS or len(bwd) != 2 * UNITS:
                return Check(name, False, f"{where}: backward made {bwd}; expected per unit "
                             "one all_gather and one reduce_scatter", rank=rank,
                             hint="reduce-scatter the whole vector's gradient, once per unit")
            sizes = sorted({nbytes for _, _, nbytes in ops})
            if sizes != [whole]:
                return Check(name, False, f"{where}: collectives of {sizes} bytes; expected "
                             f"the whole padded vector, {whole} bytes, each time", rank=rank,
                             hint="gather and reduce-scatter the whole flat vector, padding "
                                  "included")
    return Check(name, True, f"{UNITS} units x (1 + 1 all-gathers, 1 reduce-scatter) a step: "
                 "3 collectives of the unit's values, where data parallelism makes 1 all-reduce")


def _freed(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            for u, alive in enumerate(s["alive_fwd"]):
                if alive:
                    return Check(name, False, f"step {k + 1}, rank {rank}: {alive} bytes of "
                                 f"gathered parameters still alive after unit {u}'s forward "
                                 f"(the whole vector is {r['padded'] * r['e']} bytes)",
                                 rank=rank, tensor="gathered parameters",
                                 hint="keep only the input for backward (save_for_backward(x)); "
                                      "nothing that holds the vector or a view of it may survive "
                                      "the forward: not ctx, not autograd's saved tensors")
            if s["alive_bwd"]:
                return Check(name, False, f"step {k + 1}, rank {rank}: {s['alive_bwd']} bytes "
                             "of gathered parameters still alive after backward", rank=rank,
                             tensor="gathered parameters",
                             hint="the vector gathered for backward is freed once its gradient "
                                  "is reduce-scattered")
    return Check(name, True, "between forward and backward each rank held only its shards")
