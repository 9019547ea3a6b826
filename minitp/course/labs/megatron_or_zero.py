"""Lab: Megatron or ZeRO? One GPT trained on the same ranks with tensor parallelism
and with ZeRO over data parallelism, measured side by side; and the parameter
bytes a ZeRO-3 rank holds through one step.

    runs = compare(cfg, world=4, batch=8)   # one launch: tp=4, then dp=4 at ZeRO 0, 1, 2, 3
    runs["tp=4"][rank].states               # model-state bytes on that rank, measured
    runs["zero-3"][0].memory                # stage 3's parameter bytes through a step

Everything in a `Measured` is read from the run, not computed: model-state bytes
from the tensors alive between steps (`minitp.memory.measure_model_states`),
activation bytes from the tensors autograd saved (`ActivationLedger`), the
bytes a rank wrote to its sockets during its last step (the kernel's counter,
`minitp.runtime.io_counters`: a whole step, because overlapping collectives leave each
event's own ``sent_bytes`` None) beside the ring model of the same step's
events (``model_bytes``, a MODEL), the collectives counted in the trace, and
wall-clock seconds per step.

`ParamMemory` samples, at each boundary of a ZeRO-3 unit (a gather posted, a
forward begun and ended, a backward begun and its gradient sent), the bytes of
the gathered parameter vectors still holding memory, beside the rank's shards:
the picture the ZeRO paper describes in words (§5.3: only one layer's
parameters whole at a time, plus the one prefetched).

Why one file: the measurement, the recorder that runs inside it and the
comparison that launches both are one experiment, read in that order by lesson
14; apart, each would only make sense with the others open beside it.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch

from ...data_parallel.zero import make_optimizer, zero_stage_of
from ...memory import ActivationLedger, measure_model_states
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...rules import model_chunks
from ...runtime import comm, trace
from ...runtime import io_counters as _io_counters
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh, world
from ...step import train_step

CONFIGS = {"tp=4": (1, 4, 0), "zero-0": (4, 1, 0), "zero-1": (4, 1, 1), "zero-2": (4, 1, 2),
           "zero-3": (4, 1, 3)}  # name -> (dp, tp, ZeRO stage), for a world of 4


# --------------------------------------------------------------------------- the recorder
@dataclass(frozen=True)
class Sample:
    """Parameter bytes on one rank at one moment of a step (seconds on the trace's clock)."""

    t: float
    what: str  # e.g. "fwd blocks.1 begins", "gather blocks.2 posted"
    gathered: int  # bytes of gathered parameter vectors holding memory now
    shards: int  # bytes of this rank's shards (the parameters it keeps)

    @property
    def total(self) -> int:
        return self.gathered + self.shards


class ParamMemory:
    """Inside ``with ParamMemory(model) as memory:`` (a ZeRO-3 model, on a rank), every
    gather of a unit's parameters is followed by weak reference, and ``memory.samples``
    collects a `Sample` at each unit boundary. The library is not changed: each unit's
    gather is wrapped on the instance, and the samples come from module hooks
    registered after ZeRO's own (so a forward "begins" once its parameters are
    gathered, and "ends" once they are freed). ``unit_bytes``: each unit's whole
    (padded) vector, the most a gather of it can hold."""

    def __init__(self, model):
        if zero_stage_of(model) != 3:
            raise ValueError("ParamMemory follows ZeRO-3's gathered parameters: "
                             "parallelize the model with zero_stage=3")
        self.units = [u for c in model_chunks(model)
                      for u in getattr(c, "zero_units", [])]
        self.shards = sum(u.shard.numel() * u.shard.element_size() for u in self.units)
        self.unit_bytes = {u.name: u.padded * u.shard.element_size() for u in self.units}
        self.samples: list[Sample] = []
        self._buffers: list[weakref.ref] = []
        self._handles: list = []

    def gathered_bytes(self) -> int:
        """Bytes the gathered vectors alive now hold (a freed one holds 0).

        gloo's thread drops its reference to a finished collective's buffer only when
        it next gets the GIL, so one reading can still count a buffer that is already
        freed. We let go of the GIL and read again until two readings a millisecond
        apart agree (at most 50 ms): a buffer still held then is really held."""
        total, deadline = self._alive_bytes(), time.monotonic() + 0.05
        while time.monotonic() < deadline:
            time.sleep(0.001)
            again = self._alive_bytes()
            if again == total:
                break
            total = again
        return total

    def _alive_bytes(self) -> int:
        seen, total = set(), 0
        for ref in self._buffers:
            t = ref()
            if t is not None and t.untyped_storage().nbytes():
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
        self._buffers = [r for r in self._buffers if r() is not None]
        return total

    def sample(self, what: str) -> None:
        self.samples.append(Sample(trace.recorder().now(), what, self.gathered_bytes(),
                                   self.shards))

    def __enter__(self) -> ParamMemory:
        for unit in self.units:
            self._wrap(unit)
            for module in unit.triggers:
                self._handles += [
                    module.register_forward_pre_hook(
                        lambda m, a, u=unit: self.sample(self._pass(f"{u.name} begins"))),
                    module.register_forward_hook(
                        lambda m, a, o, u=unit: self.sample(self._pass(f"{u.name} ends")))]
        self.sample("before the step")
        return self

    def __exit__(self, *exc) -> None:
        self.sample("after the step")
        for handle in self._handles:
            handle.remove()
        for unit in self.units:
            for name in ("post_gather", "take_gathered", "start_reduce"):
                unit.__dict__.pop(name, None)  # the class's methods again

    @staticmethod
    def _pass(what: str) -> str:
        return ("bwd " if trace._in_backward() else "fwd ") + what

    def _wrap(self, unit) -> None:
        post, take, reduce = unit.post_gather, unit.take_gathered, unit.start_reduce

        def post_gather():
            fresh = unit.prefetched is None
            pending = post()
            if fresh:  # a new buffer, filled by this gather
                self._buffers.append(weakref.ref(pending.result))
                self.sample(f"gather {unit.name} posted")
            return pending

        def take_gathered(then_post=None):
            full = take(then_post)
            if trace._in_backward():  # gathered again for backward (forward: the hook samples)
                self.sample(f"bwd {unit.name} gathered again")
            return full

        def start_reduce(flat_grad):
            self.sample(f"bwd {unit.name} gradient sent")
            return reduce(flat_grad)

        unit.post_gather, unit.take_gathered, unit.start_reduce = (post_gather, take_gathered,
                                                                   start_reduce)

    @property
    def peak(self) -> Sample:
        return max(self.samples, key=lambda s: s.total)

    def __getstate__(self):  # what travels back from a rank: the record, not the hooks
        return {"samples": self.samples, "shards": self.shards, "unit_bytes": self.unit_bytes}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state, units=[], _buffers=[], _handles=[])


# --------------------------------------------------------------------------- one rank's run
@dataclass
class Measured:
    """What one rank measured for one configuration (see the module's docstring)."""

    name: str
    dp: int
    tp: int
    zero: int
    params: int  # Ψ: the whole model's parameters
    losses: list[float]
    seconds: list[float]  # each step's wall-clock time, the first (warm-up) included
    states: dict  # measure_model_states between steps
    activations: int  # bytes autograd saved in one forward of this rank's share of the batch
    sent: int | None  # bytes written to sockets in the last step (None: not measurable here)
    ring: Counter  # the ring MODEL of the last step's collectives: op -> model_bytes summed
    ops: Counter = field(default_factory=Counter)  # (axis, op, phase) -> count, last step
    layer_ops: Counter = field(default_factory=Counter)  # the same, for one middle layer
    memory: ParamMemory | None = None  # stage 3, the last step

    @property
    def step_seconds(self) -> float:
        """Median of the steps after the first (which pays for warm-up)."""
        return statistics.median(self.seconds[1:])


def _layer_of(event, layer: int) -> bool:
    """Whether a collective belongs to transformer layer `layer`: its tensor-parallel
    label ("layer1") or its ZeRO unit ("zero params blocks.1", "zero grads blocks.1")."""
    return event.label == f"layer{layer}" or event.label.endswith(f" blocks.{layer}")


def _measure(cfg: GPTConfig, dtype, batch: int, steps: int, configs: dict) -> dict:
    rank = world().rank
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=generator)
            for _ in range(steps)]
    out = {}
    for name, (dp, tp, zero) in configs.items():
        mesh = Mesh(dp=dp, tp=tp)
        torch.manual_seed(0)
        ref = GPT(cfg).to(dtype=dtype, device=device())
        model = parallelize(ref, mesh, zero_stage=zero)  # tp: Megatron's all-reduces, no SP
        optimizer = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
        losses, seconds, memory = [], [], None
        for k, tokens in enumerate(data):
            x, y = tokens[:, :-1].to(device()), tokens[:, 1:].to(device())
            last = k == steps - 1
            trace.clear()
            written = _io_counters.written()
            started = time.perf_counter()
            # The first step checks that the ranks' calls agree (`comm.checks`); the later
            # ones, whose calls are the same, run without that bookkeeping exchange, so
            # that their bytes and seconds are the step's own.
            with comm.checks(k == 0):
                if last and zero == 3:
                    with ParamMemory(model) as memory:
                        losses.append(train_step(model, (x, y), mesh, optimizer))
                else:
                    losses.append(train_step(model, (x, y), mesh, optimizer))
            seconds.append(time.perf_counter() - started)
            sent = None if written is None else _io_counters.written() - written
        events = [e for e in trace.events() if e.is_comm]
        share = slice(mesh.dp.rank * batch // dp, (mesh.dp.rank + 1) * batch // dp)
        with ActivationLedger(model) as ledger:
            model(x[share], y[share])
        out[name] = Measured(
            name, dp, tp, zero, ref.num_parameters(), losses, seconds,
            measure_model_states(model, optimizer), ledger.total_bytes, sent,
            Counter({op: sum(e.model_bytes for e in events if e.op == op)
                     for op in {e.op for e in events}}),
            Counter((e.axis, e.op, e.phase) for e in events),
            Counter((e.axis, e.op, e.phase) for e in events if _layer_of(e, 1)),
            memory if rank == 0 else None)
    return out


def compare(cfg: GPTConfig, world_size: int = 4, batch: int = 8, steps: int = 3,
            dtype=torch.float32, configs: dict | None = None, timeout: float = 120.0) -> dict:
    """Train `cfg` for `steps` steps (the same batches) in each configuration of
    ``configs`` (name -> (dp, tp, ZeRO stage); default `CONFIGS`), all in one launch
    of ``world_size`` ranks. Returns {name: [Measured of rank 0, rank 1, ...]}."""
    run = launch(_measure, world_size, cfg, dtype, batch, steps, configs or CONFIGS,
                 timeout=timeout)
    return {name: [run[r][name] for r in range(world_size)] for name in (configs or CONFIGS)}
