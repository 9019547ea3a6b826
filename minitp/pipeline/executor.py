"""The pipeline's executor: `run_schedule` runs one rank's order of forwards, backwards
and deferred weight gradients over its stages (`minitp.pipeline.stages`).

Activations go forward and gradients backward through `minitp.runtime.comm` p2p, each
message tagged by what it carries, sends posted without waiting (so a rank blocks only on
a receive it needs, and a valid order cannot deadlock), compute recorded as trace regions
"F3" / "B3" (with ":k" for chunk k when v > 1; `minitp.rules.unit_label`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from ..rules import rank_and_chunk, stage_of, unit_label
from ..runtime import comm, trace
from ..runtime.mesh import Mesh
from ..tensor_parallel.weight_grad import DeferredWeightGrads


def run_schedule(order, chunks, mesh: Mesh, microbatches, weights, before_backward=None,
                 placement: str = "loop"):
    """Run one rank's `order` of ("F"/"B"/"W", chunk, microbatch).

    microbatches: list of (x, y) or (x, y, positions) — a packed batch's positions, the
    whole sequence's (every stage passes them to its chunk); weights: each microbatch's
    share of the loss.
    `before_backward(chunk_index, microbatch)` is called before each backward and each
    weight pass (data parallelism arms its gradient sync there). A "B" whose (chunk,
    microbatch) also has a "W" in the order computes the input gradient and leaves the
    linear layers' weight gradients to that "W" (`minitp.tensor_parallel.weight_grad`: the
    microbatch's forward already keeps those weights out of the graph). placement: where the chunks
    sit ("v": a stage whose neighbour is on this rank hands it the tensor directly).
    Returns the sum of the weighted losses this rank computed (0 off the last stage),
    float64.
    """
    pp, v = mesh.pp, len(chunks)
    p, r, m = pp.size, pp.rank, len(microbatches)
    n = p * v
    sp, tp = chunks[0].sequence_parallel, mesh.tp
    cfg = chunks[0].cfg
    dtype, device = chunks[0].activation_dtype, next(chunks[0].parameters()).device
    split = check_split_order(order, v, m)
    deferred: dict[tuple[int, int], DeferredWeightGrads] = {}
    inputs, outputs, sends = {}, {}, []
    here = {}  # tag -> tensor a stage handed to a neighbouring stage on this same rank
    loss_sum = torch.zeros((), dtype=torch.float64)

    def local(g):
        return rank_and_chunk(p, g, placement)[0] == r

    def send(tensor, g, tag_):
        if local(g):
            here[tag_] = tensor.detach().clone()  # as a message would: a copy, no graph
        else:
            sends.append(comm.isend(tensor, pp.ranks[rank_and_chunk(p, g, placement)[0]], tag_))

    def receive(buf, g, tag_):
        if local(g):
            return here.pop(tag_)
        return comm.irecv(buf, pp.ranks[rank_and_chunk(p, g, placement)[0]], tag_).wait()

    def tag(kind, g, i):  # unique per message: activation into / gradient out of chunk g
        return 2 * (g * m + i) + (kind == "B")

    for kind, k, i in order:
        g = stage_of(p, r, k, placement)
        chunk = chunks[k]
        x, y, *packed = microbatches[i]
        positions = packed[0] if packed else None
        if kind == "F":
            if g == 0:
                inp = x
            else:
                T = x.shape[1] // tp.size if sp else x.shape[1]
                buf = torch.empty((x.shape[0], T, cfg.d_model), dtype=dtype,
                                  device=device)  # (B, T or T/t, C)
                with trace.label("pipeline"), trace.phase("fwd"):
                    inp = receive(buf, g - 1, tag("F", g, i))
                inp.requires_grad_()
            store = deferred.setdefault((k, i), DeferredWeightGrads()) if (k, i) in split else None
            with trace.region(unit_label("F", i, k, v), "fwd"), weight_grads_to(chunk, store):
                out, loss = chunk(inp, y if g == n - 1 else None, positions)
                if g == n - 1 and weights[i] == 0:  # no targets: its mean is 0/0; learn nothing
                    out = out.sum() * 0.0
                elif g == n - 1:
                    out = loss * weights[i]  # what backward starts from
                    loss_sum += out.detach().double().cpu()
            inputs[(k, i)], outputs[(k, i)] = inp, out
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("fwd"):
                    send(out, g + 1, tag("F", g + 1, i))
        elif kind == "B":
            out, inp = outputs.pop((k, i)), inputs.pop((k, i))
            grad = None
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("bwd"):
                    grad = receive(torch.empty_like(out), g + 1, tag("B", g, i))
            if before_backward is not None:
                before_backward(k, i)
            store = deferred.get((k, i))  # (a recomputed forward runs inside B: set it again)
            with trace.region(unit_label("B", i, k, v), "bwd"), weight_grads_to(chunk, store):
                torch.autograd.backward(out, grad)
            if g > 0:
                with trace.label("pipeline"), trace.phase("bwd"):
                    send(inp.grad, g - 1, tag("B", g - 1, i))
        else:  # "W": the weight gradients its B left
            if before_backward is not None:
                before_backward(k, i)
            with trace.region(unit_label("W", i, k, v), "bwd"):
                deferred.pop((k, i)).run()
    for pending in sends:
        pending.wait()
    return loss_sum


def check_split_order(order, chunks: int, microbatches: int) -> set[tuple[int, int]]:
    """The (chunk, microbatch) pairs whose backward `order` splits into B and W, after
    checking what the executor relies on: each W after its B, at most one of each, and
    each chunk's last B or W the last microbatch's (so a gradient sync armed for it
    sees every gradient final)."""
    seen_b, split, last = set(), set(), {}
    for kind, k, i in order:
        if not (0 <= k < chunks and 0 <= i < microbatches):
            raise ValueError(f"schedule unit {(kind, k, i)} names a chunk or microbatch that "
                             f"does not exist ({chunks} chunks, {microbatches} microbatches)")
        if kind == "W":
            if (k, i) not in seen_b or (k, i) in split:
                raise ValueError(f"schedule: W of chunk {k}, microbatch {i} comes before its "
                                 "B, or twice: a weight pass needs the B that stored its work")
            split.add((k, i))
        if kind == "B":
            seen_b.add((k, i))
        if kind in ("B", "W"):
            last[k] = i
    if split and any(i != microbatches - 1 for i in last.values()):
        raise ValueError("schedule: a chunk's last B or W must be the last microbatch's (the "
                         "data-parallel gradient sync starts with it)")
    return split


@contextlib.contextmanager
def weight_grads_to(chunk: nn.Module, store: DeferredWeightGrads | None):
    """While inside, the chunk's linear layers leave their weight gradients in `store`
    (None: they compute them at once, a whole backward)."""
    layers = [mod for mod in chunk.modules() if hasattr(mod, "weight_grads")]
    for layer in layers:
        layer.weight_grads = store
    try:
        yield
    finally:
        for layer in layers:
            layer.weight_grads = None
