"""What several test files need, written once: a free port, random token batches, the
bytes a model and its optimizer keep alive (counted without minitp), and the float64
equivalence loop (a plain GPT and its parallel version trained side by side).

Workers that call these run in ranks, which cannot import this file: like the test
modules, it travels to them by value.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import io
import os
import socket
import sys
import types
from pathlib import Path

import cloudpickle
import pytest
import torch

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent  # the checkout
IGNORED = -100  # minitp.rules.IGNORE_INDEX: targets the loss skips


FULL_MATRIX_ENV = "MINITP_FULL_MATRIX"  # set: every sampled or rotated row runs


def rotated(rows: list, day: int | None = None) -> list:
    """The one of `rows` that runs on `day` (default today, a UTC day counted from
    0001-01-01): each runs once every len(rows) days, all of them with MINITP_FULL_MATRIX
    set. For rows that cost seconds each and that a change rarely breaks one alone."""
    if os.environ.get(FULL_MATRIX_ENV):
        return list(rows)
    if day is None:
        day = datetime.datetime.now(datetime.UTC).date().toordinal()
    return [rows[day % len(rows)]]


# The benches whose quick run is a test (tests/test_bench_*.py): each run is a Python start
# and seconds of training, so one a run, by rotation (`rotated`), every one within three
# days; each bench module is still imported every run (its imports and names checked).
BENCH_QUICK_RUNS = ["default_run", "moe_layer", "muon_step", "refit"]


def on_its_day(name: str, rows: list):
    """A mark: skip this test unless `name` is among today's `rows` (`rotated`), saying so."""
    return pytest.mark.skipif(name not in rotated(rows), reason=f"by rotation, {name!r} runs "
                              "on another day (MINITP_FULL_MATRIX=1: every day)")


def import_bench(name: str) -> types.ModuleType:
    """bench/NAME.py imported, as a test imports it (bench/ is not a package)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def run_cli(*flags, timeout=None) -> types.SimpleNamespace:
    """``python -m minitp.train FLAGS`` run in this process (the ranks are launched as
    usual): its exit code and what the parent printed. A CLI test runs in process unless
    the process boundary itself is what it tests (a terminal, a warning on stderr): that
    saves each run a Python start and a torch import. timeout: accepted for the
    subprocess form's sake; the launch's own timeouts and pytest-timeout stop a hang."""
    from minitp import train

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            train.main(list(flags))  # it returns the summary it printed last
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_batches(steps: int, cfg, batch: int, ignored=((0, slice(0, 3)),),
                   device=None) -> list:
    """`steps` global batches (x, y) of random ids, the same on every rank (one seeded
    generator), on `device` (default: the CPU); the targets at each (row, columns) of
    `ignored` are IGNORED, so the loss's mean over non-ignored targets is exercised."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator)
        y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator)
        for row, columns in ignored:
            y[row, columns] = IGNORED
        out.append((x.to(device), y.to(device)) if device is not None else (x, y))
    return out


# --------------------------------------------------------------------------- live bytes
_NOT_STATE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
              types.CodeType, types.FrameType)


def live_bytes(model, optimizer) -> int:
    """Bytes of every storage reachable from `model` and `optimizer`, following
    Python references (gc.get_referents) and each tensor's ``.grad``, each storage
    once: what stays alive because of them. Independent of `measure_model_states`: it
    knows nothing of param_groups, shards or state. Buffers are not model state."""
    modules = {id(m.__dict__) for m in list(sys.modules.values()) if m is not None}
    skip = {id(b) for b in model.buffers()}
    seen, storages, todo = set(), {}, [model, optimizer]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in modules or id(obj) in skip or isinstance(obj, _NOT_STATE):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[(str(obj.device), storage.data_ptr())] = storage.nbytes()
            if obj.grad is not None:  # kept by autograd's metadata, out of gc's sight
                todo.append(obj.grad)
        todo.extend(gc.get_referents(obj))
    return sum(storages.values())


# --------------------------------------------------------------------------- side by side
def train_side_by_side(ref, model, mesh, batches, *, microbatches=1, schedule=None,
                       optimizer_class=None, lr=1e-2, after_step=None, clip_grad=None,
                       optimizers=None):
    """The float64 equivalence loop, written once: train the plain GPT `ref` and the
    parallel `model` (made from it by `mt.parallelize`) on the same `batches`, one
    optimizer step each per batch, and measure how far apart they are.

    Returns ``(loss_error, (param_error, name), losses)``: the largest difference of a
    step's loss (and, after training, of the forward-only `eval_loss`), the largest
    difference of any parameter after the last step (ZeRO-3's gathered for the
    comparison), and the parallel model's losses. `clip_grad`: both clip the gradients'
    global norm to it (the reference with ``torch.nn.utils.clip_grad_norm_``; the norms
    before clipping are compared too, into the loss error). `after_step(step, events)` runs after
    both models stepped, with the trace events of that `train_step` (``ref``'s ``.grad``
    still holds this step's gradients). `optimizers`: (the reference's, the parallel
    model's), made by the caller, in place of `optimizer_class`'s (Muon's split by name)."""
    import minitp as mt
    from minitp.data_parallel import gathered
    from minitp.step import eval_loss

    optimizer_class = optimizer_class or torch.optim.AdamW
    ref_opt, opt = optimizers or (optimizer_class(ref.parameters(), lr=lr),
                                  mt.make_optimizer(model, mesh, optimizer_class, lr=lr))
    loss_error, losses = 0.0, []
    for step, batch in enumerate(batches):  # (x, y), or (x, y, positions): packed documents
        x, y, *packed = batch
        positions = packed[0] if packed else None
        ref_opt.zero_grad()
        _, ref_loss = ref(x, y, positions=positions)
        ref_loss.backward()
        before = len(mt.trace.events())
        loss = mt.train_step(model, batch, mesh, opt, schedule=schedule,
                             microbatches=microbatches, clip_grad=clip_grad)
        if clip_grad is not None:
            ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip_grad)
            loss_error = max(loss_error, abs(model.grad_norm - float(ref_norm)))
        ref_opt.step()
        loss_error = max(loss_error, abs(loss - ref_loss.item()))
        losses.append(loss)
        if after_step is not None:
            after_step(step, mt.trace.events()[before:])
    with torch.no_grad():  # and the trained models still agree, forward only
        _, ref_loss = ref(x, y, positions=positions)
    loss_error = max(loss_error, abs(eval_loss(model, batch, mesh, microbatches)
                                     - ref_loss.item()))
    with gathered(model):  # ZeRO-3 holds shards only: the whole parameters, for once
        dense = model.full_state_dict()
    names = {name for name, _ in ref.named_parameters()}
    assert set(dense) == names, set(dense) ^ names
    worst = max(((dense[n] - p.detach()).abs().max().item(), n)
                for n, p in ref.named_parameters())
    return loss_error, worst, losses


def train_meshes(settings, base_cfg: dict, steps: int = 3, clip_grad=None) -> list:
    """On every rank: for each (mesh sizes, parallelize options, schedule, microbatches,
    GPTConfig overrides) of `settings`, the plain GPT and its parallel version trained
    side by side in float64 (`train_side_by_side`, each rank's batch 2 rows per
    microbatch). Returns, per setting, (loss error, (parameter error, name), the parallel
    model) — the model for what a test reads off it after training."""
    import minitp as mt

    out = []
    for sizes, options, schedule, microbatches, overrides in settings:
        mesh = mt.Mesh(**sizes)
        cfg = mt.GPTConfig(**{**base_cfg, **overrides})
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        model = mt.parallelize(ref, mesh, **options)
        batch = 2 * microbatches * sizes.get("dp", 1)
        loss_error, worst, _ = train_side_by_side(
            ref, model, mesh, random_batches(steps, cfg, batch), microbatches=microbatches,
            schedule=schedule, clip_grad=clip_grad)
        out.append((loss_error, worst, model))
    return out


def assert_every_mesh_matches(run, settings, tolerance: float) -> None:
    """Every rank's (loss error, (parameter error, name)) per setting, from a launch of
    `train_meshes`'s first two results, within `tolerance`; a failure names the rank and
    the setting."""
    for rank, results in enumerate(run):
        for setting, (loss_error, (param_error, name)) in zip(settings, results, strict=True):
            where = f"rank {rank}, {setting}"
            assert loss_error < tolerance, f"{where}: loss differs by {loss_error:.3g}"
            assert param_error < tolerance, f"{where}: {name} differs by {param_error:.3g}"
