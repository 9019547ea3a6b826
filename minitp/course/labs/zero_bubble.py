"""Lab: zero-bubble pipelines run on real ranks — timed, weighed, checked (lesson 12).

Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", ICLR 2024) split each backward in
two: B, the input gradient the previous stage waits for, and W, the weight gradients,
which can wait (`minitp.tensor_parallel.weight_grad`). Three experiments, each one `launch`:

* `timed`: 1F1B, ZB-H1 and ZB-H2 (or ZBV and DualPipeV, two chunks per rank in a V) on
  p ranks with the paper's unit costs SET by sleep
  (F = B = W = ``unit`` seconds; a whole backward sleeps B + W), as lesson 11 sets its
  costs (lesson 12 checks the bubbles against the formulas), or with real compute only
  (``unit=None``: lesson 12 sets the formulas' costs from the measured medians). The trace then
  MEASURES the order, the waits, the bubble and the step's "grad norm" all-reduce
  (``clip_grad`` is on). In a second, untimed step of each schedule the lab WEIGHS what a
  stage holds: each microbatch's saved activations (`ActivationLedger` around
  the stage's forward) and, between its B and its W, the (x, g) pairs the W pass keeps
  (outside autograd, in a `DeferredWeightGrads`), each storage once;
* `exactness`: a float64 run of a schedule on ``Mesh(pp=p)`` beside one device, AdamW;
* `clipping`: each rank's sum of squared gradients, parameter by parameter, tagged with
  what the global norm must not count twice (tp replicas, the tied embedding's copy).

Costs set, everything else measured; the unit-cost formulas are a MODEL (`minitp.calc`).
"""

from __future__ import annotations

import contextlib
import time

import torch

from ...data_parallel.zero import make_optimizer
from ...memory.activations import ActivationLedger
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...pipeline.schedules import SCHEDULES
from ...rules import model_chunks, parse_unit_label, placement_of
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...sharding.tags import tag
from ...step import train_step
from ...step.grad_norm import clip_grad_norm
from ...tensor_parallel import weight_grad
from . import load_free

CFG = dict(vocab_size=64, seq_len=16, n_layer=4, n_head=4, d_model=32)


def random_batch(cfg, rows: int, seed: int = 0):
    """(x, y) of `rows` random token ids each, seeded, on `mt.device()`."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=generator)
    y = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=generator)
    return x.to(device()), y.to(device())


# --------------------------------------------------------------------------- set costs
@contextlib.contextmanager
def unit_costs(model, unit: float, split, clock=None):
    """While inside: every forward of a stage sleeps `unit`, every B `unit` (a whole
    backward, B + W, ``2 * unit``), every W `unit` before its real work. split: the
    (chunk, microbatch) pairs whose backward the schedule splits (or True / False: all,
    none); a chunk's forwards run in microbatch order, so its n-th is microbatch n.
    clock: a `load_free.RankClock` to sleep by (it counts the sleep asked for)."""
    run = weight_grad.DeferredWeightGrads.run
    forwards = {}
    sleep = clock.sleep if clock is not None else time.sleep

    def sleepy_run(self):  # W: one unit
        sleep(unit)
        run(self)

    def after_forward(k):
        def hook(_, __, output):
            sleep(unit)  # F: one unit
            i = forwards[k] = forwards.get(k, -1) + 1
            halves = split if isinstance(split, bool) else (k, i) in split
            out, loss = output
            (loss if loss is not None else out).register_hook(  # B, or B + W
                lambda grad: sleep(unit if halves else 2 * unit))
        return hook

    handles = [chunk.register_forward_hook(after_forward(k))
               for k, chunk in enumerate(model_chunks(model))]
    weight_grad.DeferredWeightGrads.run = sleepy_run
    try:
        yield
    finally:
        weight_grad.DeferredWeightGrads.run = run
        for handle in handles:
            handle.remove()


# --------------------------------------------------------------------------- weighed
@contextlib.contextmanager
def weighed(model):
    """While inside: ``held["F"]`` gets the bytes each forward of this rank saves for
    backward (the ledger, model state left out), in the order run; ``held["W"]`` the
    bytes each W pass found waiting for it (its (x, g) pairs, each storage once)."""
    held = {"F": [], "W": []}
    chunks = model_chunks(model)
    originals = [chunk.forward for chunk in chunks]
    run = weight_grad.DeferredWeightGrads.run

    def ledgered(chunk, forward):
        def wrapper(*args, **kwargs):
            with ActivationLedger(chunk) as ledger:
                result = forward(*args, **kwargs)
            held["F"].append(ledger.total_bytes)
            return result
        return wrapper

    def weighed_run(self):
        storages = {}
        for _, x, g in self.pending:
            for t in (x, g):
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        held["W"].append(sum(storages.values()))
        run(self)

    for chunk, forward in zip(chunks, originals, strict=True):
        chunk.forward = ledgered(chunk, forward)
    weight_grad.DeferredWeightGrads.run = weighed_run
    try:
        yield held
    finally:
        weight_grad.DeferredWeightGrads.run = run
        for chunk in chunks:
            del chunk.forward  # the class's forward again


def held_over_time(order, held) -> list[int]:
    """Bytes a rank holds after each unit of `order` (labels "F3", "B3", "W3", "F3:1" or
    (kind, chunk, microbatch) tuples): a microbatch holds, in each chunk, its forward's
    saved activations until its B, and then, if its backward is split, the (x, g) its W
    needs until that W. `held`: from `weighed`, in the order the units ran."""
    def unit(u):
        if isinstance(u, str):
            kind, i, k = parse_unit_label(u)
            return kind, (k, i)
        return u[0], (u[1], u[2])

    units = [unit(u) for u in order]
    f_bytes = iter(held["F"])
    w_bytes = dict(zip([i for kind, i in units if kind == "W"], held["W"], strict=True))
    activations, waiting, out = {}, {}, []
    for kind, i in units:
        if kind == "F":
            activations[i] = next(f_bytes)
        elif kind == "B":
            activations.pop(i)
            if i in w_bytes:  # a split backward: its W's (x, g) wait
                waiting[i] = w_bytes[i]
        else:
            waiting.pop(i)
        out.append(sum(activations.values()) + sum(waiting.values()))
    return out


# --------------------------------------------------------------------------- the runs
def _pipelined(ref, mesh, schedule):
    """`ref` split for `schedule`: two chunks per rank in a V for ZBV and DualPipeV."""
    v_shaped = dict(virtual_stages=2, placement="v") if placement_of(schedule) == "v" else {}
    return parallelize(ref, mesh, **v_shaped)


def _split_pairs(schedule, p, r, m) -> set:
    return {(k, i) for kind, k, i in SCHEDULES[schedule](p, r, m) if kind == "W"}


def _timed_rank(schedules, p, m, unit, cfg, clip):
    cfg = GPTConfig(**cfg)
    mesh = Mesh(pp=p)
    x, y = random_batch(cfg, m)
    out = {}
    for schedule in schedules:
        torch.manual_seed(0)
        model = _pipelined(GPT(cfg).to(device()), mesh, schedule)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay put

        def step(model=model, optimizer=optimizer, schedule=schedule):
            trace.clear()
            train_step(model, (x, y), mesh, optimizer, schedule=schedule,
                          microbatches=m, clip_grad=clip)
            return trace.events()

        step()  # warm-up
        clock = load_free.RankClock()
        costs = (unit_costs(model, unit, _split_pairs(schedule, p, mesh.pp.rank, m), clock)
                 if unit else contextlib.nullcontext())
        with costs, (load_free.sampled(clock) if unit else contextlib.nullcontext({})) as readings:
            events = step()
        with weighed(model) as held:
            order = [e.label for e in step() if e.op == "compute" and e.label
                     and parse_unit_label(e.label)]
        out[schedule] = dict(events=events, order=order, held=held, readings=readings)
    return out


def timed(schedules=("1f1b", "zb-h1", "zb-h2"), p: int = 4, m: int = 8, unit: float = 0.02,
          cfg=None, clip: float = 1.0) -> dict:
    """One launch of p ranks: per schedule, ``events`` (every rank's trace of the step
    with the costs set: units and collectives, with the waits a busy machine caused taken
    out: `load_free.replay`; ``wall_events``: as the launch's clock saw them),
    ``order`` (each rank's unit labels in
    the order run, untimed step) and ``held`` (per rank, `weighed`'s bytes).
    ``unit=None``: nothing set, each unit costs what its real compute takes, and
    ``events`` are as the launch's clock saw them (compute on several threads has no one
    CPU clock to replay it by)."""
    run = launch(_timed_rank, p, schedules, p, m, unit, cfg or CFG, clip, timeout=120)
    out = {}
    for s in schedules:
        wall = [e for rank in run for e in rank[s]["events"]]
        v = 2 if placement_of(s) == "v" else 1
        readings = [rank[s]["readings"] for rank in run]
        out[s] = dict(events=load_free.replay(wall, readings, p, p * v, placement_of(s))
                      if unit else wall, wall_events=wall, order=[rank[s]["order"] for rank in run],
                      held=[rank[s]["held"] for rank in run])
    return out


def _exact_rank(schedule, p, m, steps, cfg):
    cfg = GPTConfig(**cfg)
    mesh = Mesh(pp=p)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    model = _pipelined(ref, mesh, schedule)  # a copy: ref trains on its own below
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
    losses = []
    for step in range(steps):
        x, y = random_batch(cfg, 2 * m, seed=step)
        ref_opt.zero_grad()
        _, ref_loss = ref(x, y)
        ref_loss.backward()
        ref_opt.step()
        loss = train_step(model, (x, y), mesh, opt, schedule=schedule, microbatches=m)
        losses.append((loss, ref_loss.item()))
    dense = model.full_state_dict()
    worst = max(((dense[n] - q.detach()).abs().max().item(), n) for n, q in ref.named_parameters())
    return losses, worst


def exactness(schedule: str, p: int = 4, m: int = 8, steps: int = 3, cfg=None):
    """Rank 0's (losses [(pipeline, one device)] per step, (largest parameter
    difference after the last step, its name)) — float64, AdamW, 2 rows a microbatch."""
    return launch(_exact_rank, p, schedule, p, m, steps, cfg or CFG, timeout=120)[0]


def _clip_rank(sizes, m, clip, cfg):
    cfg = GPTConfig(**cfg)
    mesh = Mesh(**sizes)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    model = parallelize(ref, mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # nothing moves
    x, y = random_batch(cfg, 2 * m)
    train_step(model, (x, y), mesh, optimizer, microbatches=m)  # final gradients
    tied = {id(c.head.weight) for c in model_chunks(model) if c.last and not c.first}
    rows = [dict(name=name, squares=q.grad.double().square().sum().item(),
                 tp_split=tag(q, "tp_split_dim") is not None, tied_copy=id(q) in tied)
            for name, q in model.named_parameters() if q.grad is not None]
    trace.clear()
    train_step(model, (x, y), mesh, optimizer, microbatches=m, clip_grad=clip)
    _, ref_loss = ref(x, y)
    ref_loss.backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item()
    return dict(pp=mesh.pp.rank, tp=mesh.tp.rank, rows=rows, norm=model.grad_norm,
                one_device=ref_norm, clip_norm_again=_norm_after(model, mesh, optimizer))


def _norm_after(model, mesh, optimizer) -> float:
    """The global norm of the clipped gradients (a second count, clipping at inf)."""
    return clip_grad_norm(model, mesh, optimizer, float("inf"))


def clipping(sizes=None, m: int = 2, clip: float = 1.0, cfg=None) -> list[dict]:
    """Per rank of ``Mesh(**sizes)`` (default pp = 2, tp = 2): its pp and tp rank, every
    parameter's sum of squared gradients with its tags, the mesh's global norm from
    ``train_step(clip_grad=clip)`` (``norm``), the norm after clipping, and one device's
    norm (``torch.nn.utils.clip_grad_norm_``), float64."""
    sizes = sizes or dict(pp=2, tp=2)
    world = 1
    for size in sizes.values():
        world *= size
    return list(launch(_clip_rank, world, sizes, m, clip, cfg or CFG, timeout=120))
