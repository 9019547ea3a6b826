"""One optimizer step of a parallel model: `mt.train_step`."""

from __future__ import annotations

import torch

from ..context_parallel.split import split_sequence
from ..model.moe import moe_layers, update_expert_bias
from ..pipeline.executor import run_schedule
from ..pipeline.schedules import SCHEDULES
from ..rules import (
    IGNORE_INDEX,
    check_step,
    check_token_ids,
    default_schedule,
    model_chunks,
    model_placement,
)
from ..runtime import comm, trace
from ..runtime.mesh import Mesh
from .grad_norm import clip_grad_norm
from .grads import finalize_grads


def train_step(model, batch, mesh: Mesh, optimizer, schedule=None, microbatches: int = 1,
               clip_grad: float | None = None) -> float:
    """Forward and backward over `microbatches` slices of this data-parallel rank's
    part of the global batch, in the pipeline `schedule`'s order; gradients summed
    over dp (bucketed, overlapped with backward — or reduce-scattered: by a ZeRO-1
    optimizer at its step, unit by unit during backward at ZeRO stages 2 and 3), over
    tp where sequence parallelism left them partial, and between
    the two copies of the tied embedding; then one optimizer step. Returns the loss
    of the whole batch — the mean over its (non-ignored) target tokens, exactly as
    one device computes it — the same float on every rank.

    batch: (x, y), LongTensors (batch, seq_len), the same global batch on every rank — or
    (x, y, positions), packed documents (`minitp.data.packing`): every rank passes its
    microbatch's whole positions to the model, whose pieces take their part;
    dp rank d takes rows [d·B/dp, (d+1)·B/dp), and with context parallelism cp rank i
    takes chunks i and 2cp−1−i of each row's 2·cp (`minitp.context_parallel`); the
    gradients are then summed over dp×cp. schedule: a name ("gpipe", "1f1b",
    "interleaved", or the zero-bubble "zb-h1", "zb-h2", which split each backward into B
    and W, and "zbv", "dualpipev" for a model built with virtual_stages=2, placement="v"),
    None for "1f1b" (or "interleaved" for a model built with virtual_stages > 1, "zbv" for
    one placed in a V),
    or your own function with the built-in schedules' signature
    ``(p, r, m, v) -> [(kind, chunk, microbatch)]``, kind "F", "B" or "W"
    (`minitp.pipeline.schedules`). clip_grad: scale the gradients so their norm over
    the whole mesh is at most this (`minitp.step.grad_norm`, as ``clip_grad_norm_`` on one
    device); the norm before clipping is left in ``model.grad_norm``.
    """
    x, y, positions = unpack_batch(batch)
    _check_ids(model, x, y)
    chunks = model_chunks(model)
    v, placement = len(chunks), model_placement(model)
    _check_step_once(model, mesh, schedule, microbatches, x.shape[0])
    schedule = schedule or default_schedule(v, placement)
    make_order = schedule if callable(schedule) else SCHEDULES[schedule]
    optimizer.zero_grad(set_to_none=True)
    pairs, weights = _my_microbatches(x, y, positions, mesh, microbatches)
    order = make_order(mesh.pp.size, mesh.pp.rank, len(pairs), v)
    syncs = [c.grad_sync for c in chunks]
    last = len(pairs) - 1

    def before_backward(k, i):
        if syncs[k] is not None:
            syncs[k].arm(i == last)  # only the last microbatch's gradient is final

    for layer in moe_layers(model):  # the aux loss: a mean over the global batch's sequences
        layer.aux_rows = x.shape[0]
    loss = run_schedule(order, chunks, mesh, pairs, weights, before_backward, placement)
    finalize_grads(model, mesh)  # every reduction after backward, in order (minitp.step.grads)
    if clip_grad is not None:  # the global norm: one all-reduce every stage must join
        model.grad_norm = clip_grad_norm(model, mesh, optimizer, clip_grad)
    optimizer.step()
    update_expert_bias(model)  # DeepSeek-V3's balancing, from the whole step's load
    return _batch_loss(loss, mesh)


def eval_loss(model, batch, mesh: Mesh, microbatches: int = 1) -> float:
    """The batch's mean loss, forward only (no gradients, no step), through the
    pipeline: every chunk's forwards in turn. The same float on every rank."""
    x, y, positions = unpack_batch(batch)
    _check_ids(model, x, y)
    chunks, placement = model_chunks(model), model_placement(model)
    _check_step_once(model, mesh, None, microbatches, x.shape[0])
    pairs, weights = _my_microbatches(x, y, positions, mesh, microbatches)
    order = [("F", k, i) for k in range(len(chunks)) for i in range(len(pairs))]
    with torch.no_grad():
        return _batch_loss(run_schedule(order, chunks, mesh, pairs, weights,
                                        placement=placement), mesh)


def _check_step_once(model, mesh: Mesh, schedule, microbatches, rows: int) -> None:
    """The model was checked when it was split (`parallelize`); a step adds its schedule,
    microbatches and batch rows, checked the first time the model sees them (a training
    loop passes the same ones every step)."""
    seen = getattr(model, "_steps_checked", None)
    if seen is None:
        seen = model._steps_checked = set()
    key = (schedule if isinstance(schedule, str) or schedule is None else id(schedule),
           microbatches, rows)
    if key in seen:
        return
    chunks = model_chunks(model)
    check_step(schedule, microbatches, rows, dp=mesh.dp.size, pp=mesh.pp.size,
               virtual_stages=len(chunks), placement=model_placement(model),
               tp_overlap=chunks[0].tp_overlap)
    seen.add(key)


def unpack_batch(batch):
    """(x, y, positions or None) of a batch of two or three tensors, checked."""
    if len(batch) not in (2, 3):
        raise ValueError(f"batch must be (x, y) or (x, y, positions), got {len(batch)} tensors")
    x, y, positions = (*batch, None)[:3]
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"batch must be (x, y) of equal shape (batch, seq_len), got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    if positions is not None and (positions.shape != x.shape or positions.is_floating_point()):
        raise ValueError(f"a packed batch's positions must be integers of x's shape "
                         f"{tuple(x.shape)}, got {positions.dtype} {tuple(positions.shape)}")
    return x, y, positions


def _check_ids(model, x, y) -> None:
    """Every rank checks the whole batch, so a bad id stops every rank with the same
    clear error (in a pipeline only the last stage would see the targets)."""
    check_token_ids(x, model.cfg.vocab_size, "input id")
    check_token_ids(y, model.cfg.vocab_size, "target id", ignore_index=IGNORE_INDEX)


def _my_microbatches(x, y, positions, mesh: Mesh, microbatches):
    """This dp rank's contiguous slice of the global batch, cut into microbatches,
    each weighted by its share of the *global* batch's target tokens: the sum over
    microbatches and dp ranks of weight · mean loss is then the batch mean (not a
    mean of means). (Python ints: dividing two LongTensors would give float32.)
    With context parallelism each microbatch is then cut along the sequence: this
    cp rank's two chunks; its weight stays the whole microbatch's share, since the
    loss (`ContextParallelLoss`) is the mean over every token of the cp group — a cp
    rank holding fewer real tokens (packing's ignored targets) weighs less in it.
    A packed batch's positions are sliced by rows alike, never along the sequence."""
    dp = mesh.dp
    total = int((y != IGNORE_INDEX).sum())
    if total == 0:
        raise ValueError("every target of the batch is ignored: its mean loss would be 0/0")
    rows = x.shape[0] // dp.size
    mine = slice(dp.rank * rows, (dp.rank + 1) * rows)
    x, y = x[mine], y[mine]
    pairs = list(zip(x.chunk(microbatches), y.chunk(microbatches), strict=True))
    packed = [None] * len(pairs) if positions is None else positions[mine].chunk(microbatches)
    # A microbatch with no targets weighs 0 (run_schedule keeps it out of the loss):
    # it still runs, so every stage and every dp replica does the same communication.
    weights = [int((ys != IGNORE_INDEX).sum()) / total for _, ys in pairs]
    pairs = [(split_sequence(xs, mesh.cp), split_sequence(ys, mesh.cp), ps)
             for (xs, ys), ps in zip(pairs, packed, strict=True)]
    return pairs, weights


def _batch_loss(loss, mesh: Mesh) -> float:
    if mesh.pp.size > 1 or mesh.dp.size > 1:
        # the last stage holds each dp slice's weighted loss; all ranks get their sum
        with trace.label("batch loss"):
            loss = comm.all_reduce(comm.all_reduce(loss, mesh.pp), mesh.dp)
    return float(loss)
