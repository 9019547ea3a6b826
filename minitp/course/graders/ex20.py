"""Checks for ex20: one ZeRO-3 unit — the gathered parameters freed after the forward,
refilled in place just before the backward, freed again after it.

At dp = 2 and 3, in float64: every rank wraps each of two small MLP blocks (Ψ_u
= 235 values: 236 after padding at dp = 2, 237 at dp = 3) in the learner's
`Zero3Unit`, and runs two steps on its slice of a batch: forward through both
units, backward of a weighted sum, one SGD step on the shards. The plain blocks
run beside it on the whole batch with autograd (the loss is a sum, so the ranks'
gradients add up to the plain one). Per world size:

* the numbers: the output, the input's gradient and each shard's gradient (this
  rank's slice of the summed gradient) equal the plain blocks', at both steps.
  A backward that fails is named by what autograd found: a saved view whose
  storage holds 0 bytes (nothing refilled it in time, or the refill went into
  another storage), or one written since it was saved (a refill autograd
  counted). A right output with wrong gradients: backward read other values;
* after each unit's forward: the storage of every tensor of at least Ψ_u values
  made during the forward (the gathered vector, which autograd's saved views
  keep alive) holds 0 bytes;
* during backward, at each unit's reduce-scatter, no other unit's gathered
  storage holds a byte (a later unit's: not freed after its backward; an
  earlier unit's: refilled too soon); after backward, none, nor any buffer an
  all-gather filled in backward;
* the trace, per unit and step: one all-gather in the forward, one in backward
  (the refill), one reduce-scatter, each of the whole padded vector;
* gradient accumulation, on fresh units: two micro-batches, both forwards first, then
  both backwards (the first micro-batch's first), then the step. Each backward must
  refill the vector its own forward gathered (the unit has two gathered-and-freed
  vectors at once), and the shards' gradients must be the sum of both backwards'
  (the plain blocks' accumulated ones); afterwards no gathered storage holds a byte.
  Named: a backward that reads a freed vector (the refill went to the unit's latest
  vector, not this forward's), a gradient that is one micro-batch's alone (overwritten,
  not accumulated).

Why one file: the run on the ranks and the five judgements read the same record,
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

WORLD_SIZES = (2, 3)
STEPS, UNITS, LR = 2, 2, 0.1
B, T, D = 2, 3, 5  # per rank: batch, sequence, width (the MLP's hidden layer is 4D)
TOLERANCE = 1e-12  # float64
FREED = "out of bounds for storage of size 0"  # autograd reading a freed saved view
WRITTEN = "modified by an inplace operation"  # autograd's version check


def _block() -> nn.Module:
    """LayerNorm + MLP, 235 parameters: padded at dp = 2 and 3 alike."""
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


def _flat_grad(module, padded) -> torch.Tensor:
    flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
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


class _WatchBackward:
    """While active: every buffer an all-gather fills (weakly), and at each
    reduce-scatter the bytes each unit's forward-made tensors hold. (Autograd's
    backward runs outside the forward's function mode: the collectives are watched.)"""

    def __init__(self, made: list[list]):
        self.made, self.gathered, self.held = made, [], []
        self._originals = None

    # torch 2.13's names (minitp's comm calls these) and the deprecated ones a learner
    # may still call: the old ones reach the new through torch's module, not `dist`'s
    # attributes, so each call is watched once.
    GATHERS = ("all_gather_single", "all_gather_into_tensor")
    SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")

    def __enter__(self):
        self._originals = {name: getattr(dist, name) for name in self.GATHERS + self.SCATTERS}

        def watched_gather(gather):
            def watched(output, *args, **kwargs):
                self.gathered.append(weakref.ref(output))
                return gather(output, *args, **kwargs)
            return watched

        def watched_scatter(scatter):
            def watched(*args, **kwargs):
                self.held.append([_bytes(refs) for refs in self.made])
                return scatter(*args, **kwargs)
            return watched

        for name, original in self._originals.items():
            setattr(dist, name, (watched_gather if name in self.GATHERS else watched_scatter)(
                original))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)


def _bytes(refs) -> int:
    """Bytes the storages of the still-referenced tensors of `refs` hold (each once)."""
    seen, total = set(), 0
    for ref in refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
        del t
    return total


def _alive_bytes(refs, settle: float = 0.2) -> int:
    """`_bytes`, once more than nothing has stayed so `settle` seconds: gloo's worker
    thread may drop its reference to a collective's buffer a moment after ``wait()``."""
    deadline = time.perf_counter() + settle
    while (total := _bytes(refs)) and time.perf_counter() < deadline:
        time.sleep(0.002)
    return total


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


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.Zero3Unit, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="Zero3Unit", size="dp")


def _names(n) -> list[str]:
    return [f"dp={n}: output, input gradient and shard gradients equal the plain blocks'",
            f"dp={n}: after each unit's forward, the gathered storage holds 0 bytes",
            f"dp={n}: in backward only the unit being differentiated is gathered; after, none",
            f"dp={n}: per unit: an all-gather in forward, one in backward, a reduce-scatter",
            f"dp={n}: two micro-batches' backwards before a step: the shard gradients "
            "accumulate to the plain blocks'"]


def _judge(n, names, per_rank) -> list[Check]:
    crashed = _crash(names[0], per_rank)
    if crashed:
        skipped = "not checked: backward failed (see above)"
        return [crashed, _after_forward(names[1], per_rank),
                Check(names[2], False, skipped), Check(names[3], False, skipped),
                _accumulation(names[4], per_rank)]
    return [_numbers(names[0], per_rank), _after_forward(names[1], per_rank),
            _in_backward(names[2], per_rank), _collectives(names[3], per_rank),
            _accumulation(names[4], per_rank)]


def _crash(name, per_rank) -> Check | None:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            if not s["crash"]:
                continue
            where = f"step {k + 1}, rank {rank}"
            refills = sum(op == "all_gather" and phase == "bwd" for op, phase, _ in s["ops"])
            if FREED in s["crash"] and not refills:
                return Check(name, False, f"{where}: backward read a saved view of the "
                             "parameters while their storage held 0 bytes: nothing refilled "
                             "it before the unit's backward", rank=rank, tensor="saved views",
                             hint="the refill must run after the forward and before the first "
                                  "of the unit's backward nodes: when the gradient of the "
                                  "unit's output arrives (a hook on its input fires too late)")
            if FREED in s["crash"]:
                return Check(name, False, f"{where}: backward gathered again, but a saved "
                             "view of the parameters still saw a storage of 0 bytes: the "
                             "refill went somewhere else", rank=rank, tensor="saved views",
                             hint="the saved views point into full's own storage: give that "
                                  "storage its bytes back and write the values into it; a new "
                                  "tensor (full.data = ..., full = ...) leaves them on the "
                                  "freed one")
            if WRITTEN in s["crash"]:
                return Check(name, False, f"{where}: autograd refused a saved view of the "
                             "parameters: the refill counted as an in-place write (its "
                             "version went up)", rank=rank, tensor="saved views",
                             hint="autograd counts every in-place write to a tensor it "
                                  "saved, under torch.no_grad() too, and refuses the tensor "
                                  "after one; the refill changes no value: write the same "
                                  "storage through a tensor autograd does not watch")
            return Check(name, False, f"{where}: backward raised RuntimeError: {s['crash']}",
                         rank=rank, hint="read the message: backward fails where a saved "
                                         "tensor is read")
    return None


def _numbers(name, per_rank) -> Check:
    worst = 0.0
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            errors = dict(s["error"])
            for u, error in enumerate(s["grad"]):
                if error is None:
                    return Check(name, False, f"{where}: unit {u}'s shard has no gradient of "
                                 "its shape", rank=rank, tensor="shard.grad",
                                 hint="keep GatherParams as given: its backward returns the "
                                      "shard's gradient")
                errors[f"shard gradient of unit {u}"] = error
            tensor, error = max(errors.items(), key=lambda item: item[1])
            if error > TOLERANCE:
                why = (": the forward is right, so backward read other values than the "
                       "forward's" if errors["output"] <= TOLERANCE else "")
                return Check(name, False, f"{where}, the {tensor}: largest error "
                             f"{error:.3g}{why}", rank=rank, tensor=tensor, max_error=error,
                             hint="the refill must bring back exactly the values the forward "
                                  "used (every rank's shard, in rank order); storage given "
                                  "its bytes back holds garbage until they are written")
            worst = max(worst, error)
    return Check(name, True, f"largest error {worst:.1e}", max_error=worst)


def _after_forward(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        whole = r["padded"] * r["e"]
        for k, s in enumerate(r["steps"]):
            for u, held in enumerate(s["after_fwd"]):
                if held:
                    return Check(name, False, f"step {k + 1}, rank {rank}: {held} bytes of "
                                 f"gathered parameters still held after unit {u}'s forward "
                                 f"(the whole vector is {whole} bytes)", rank=rank,
                                 tensor="gathered parameters",
                                 hint="autograd saved views of the vector and keeps them "
                                      "alive: `del` drops only your name. Free the memory "
                                      "they all point to")
    return Check(name, True, "between a unit's forward and its backward each rank held "
                 "its shards only (the saved views alive, their storage empty)")


def _in_backward(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            # backward reaches the units last to first: the i-th reduce-scatter is unit -i-1's
            for i, held in enumerate(s["held"][:UNITS]):
                unit = UNITS - 1 - i
                for other, nbytes in enumerate(held):
                    if other == unit or not nbytes:
                        continue
                    if other > unit:
                        return Check(name, False, f"{where}: unit {other} still held {nbytes} "
                                     f"bytes while unit {unit}'s gradient was reduce-scattered:"
                                     f" not freed after its own backward", rank=rank,
                                     tensor="gathered parameters", hint=FREE_AGAIN)
                    never = bool(s["after_fwd"][other])
                    why = ("never freed after its forward" if never
                           else "refilled before backward reached it")
                    return Check(name, False, f"{where}: unit {other} held {nbytes} bytes "
                                 f"while unit {unit}'s gradient was reduce-scattered: {why}",
                                 rank=rank, tensor="gathered parameters",
                                 hint="free the vector after the unit's forward (the check "
                                      "above)" if never else "refill a unit when the gradient "
                                      "of its output arrives, not sooner: two units gathered "
                                      "at once is the memory ZeRO-3 exists to save")
            if s["after_bwd"]:
                return Check(name, False, f"{where}: {s['after_bwd']} bytes of gathered "
                             "parameters still held after backward", rank=rank,
                             tensor="gathered parameters", hint=FREE_AGAIN)
    return Check(name, True, "at each unit's reduce-scatter no other unit was gathered; "
                 "none after backward")


FREE_AGAIN = ("free the vector again once the unit's backward is over: when GatherParams' "
              "backward runs, every node that read the vector has run")


def _collectives(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        whole = r["padded"] * r["e"]
        for k, s in enumerate(r["steps"]):
            where = f"step {k + 1}, rank {rank}"
            ops = s["ops"]
            fwd = [op for op, phase, _ in ops if phase == "fwd"]
            bwd = [op for op, phase, _ in ops if phase == "bwd"]
            if fwd != ["all_gather"] * UNITS:
                return Check(name, False, f"{where}: forward made {fwd or 'no collective'}; "
                             f"expected one all_gather per unit ({UNITS})", rank=rank,
                             hint="keep the forward's GatherParams as given: one gather per "
                                  "unit, nothing else")
            refills = bwd.count("all_gather")
            if refills == 0:
                return Check(name, False, f"{where}: backward made no all_gather: the "
                             "parameters were kept from the forward, not gathered again",
                             rank=rank, hint="free the vector after the forward and refill "
                                             "it when backward reaches the unit")
            if refills != UNITS:
                return Check(name, False, f"{where}: backward made {refills} all_gathers for "
                             f"{UNITS} units: refill each unit once", rank=rank,
                             hint="one refill per unit per backward: one hook, on the "
                                  "unit's output")
            if bwd.count("reduce_scatter") != UNITS or len(bwd) != 2 * UNITS:
                return Check(name, False, f"{where}: backward made {bwd}; expected per unit "
                             "one all_gather and one reduce_scatter", rank=rank,
                             hint="the refill is the only collective you add")
            sizes = sorted({nbytes for _, _, nbytes in ops})
            if sizes != [whole]:
                return Check(name, False, f"{where}: collectives of {sizes} bytes; expected "
                             f"the whole padded vector, {whole} bytes, each time", rank=rank,
                             hint="refill by gathering every rank's shard, as the forward did")
    return Check(name, True, f"{UNITS} units x (1 + 1 all-gathers, 1 reduce-scatter) a step: "
                 "3 collectives of the unit's values, where data parallelism makes 1 all-reduce")


def _accumulation(name, per_rank) -> Check:
    for rank, r in enumerate(per_rank):
        a = r["accumulate"]
        where = f"rank {rank}, both forwards done"
        if a["crash"] and FREED in a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward read a "
                         "saved view of the parameters while their storage held 0 bytes: "
                         "the refill did not fill the vector this forward gathered",
                         rank=rank, tensor="saved views",
                         hint="with two forwards before the backwards a unit has two "
                              "gathered (and freed) vectors at once: each backward must refill "
                              "the `full` of its own forward, the one its hook captured, not "
                              "one kept on the unit (self.full is the latest forward's)")
        if a["crash"] and WRITTEN in a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward: "
                         "autograd refused a saved view of the parameters (written in place "
                         "since it was saved)", rank=rank, tensor="saved views",
                         hint="write the refill through a tensor autograd does not watch")
        if a["crash"]:
            return Check(name, False, f"{where}: micro-batch {a['micro']}'s backward raised "
                         f"RuntimeError: {a['crash']}", rank=rank,
                         hint="each backward must find its own forward's vector refilled")
        if a["error"] is None:
            return Check(name, False, f"rank {rank}: after two backwards unit "
                         f"{a['shape']}'s shard has no gradient of its shape", rank=rank,
                         tensor="shard.grad", hint="keep GatherParams as given: its backward "
                         "returns the shard's gradient, and autograd adds it to shard.grad")
        u, error = max(enumerate(a["error"]), key=lambda item: item[1])
        if error > TOLERANCE:
            only = next((k + 1 for k, e in enumerate(a["alone"]) if e <= TOLERANCE), None)
            if only:
                return Check(name, False, f"rank {rank}: after two backwards the shards' "
                             f"gradients are micro-batch {only}'s alone: the other "
                             "backward's were overwritten, not accumulated", rank=rank,
                             tensor="shard.grad", max_error=error,
                             hint="autograd adds each backward's gradient into shard.grad; "
                                  "set or clear .grad nowhere in the unit (the optimizer "
                                  "clears it after the step)")
            return Check(name, False, f"rank {rank}: unit {u}'s shard gradient after two "
                         f"backwards: largest error {error:.3g} from the sum of both "
                         "micro-batches' plain gradients", rank=rank, tensor="shard.grad",
                         max_error=error,
                         hint="each backward must read exactly its own forward's values: "
                              "refill the vector its forward gathered, every rank's shard in "
                              "rank order")
        if a["after_bwd"]:
            return Check(name, False, f"rank {rank}: {a['after_bwd']} bytes of gathered "
                         "parameters still held after both backwards", rank=rank,
                         tensor="gathered parameters", hint=FREE_AGAIN)
    worst = max(max(r["accumulate"]["error"]) for r in per_rank)
    return Check(name, True, f"both forwards, then both backwards: the shards' gradients "
                 f"the plain blocks' sum (largest error {worst:.1e}); nothing held after",
                 max_error=worst)
