"""Pipeline parallelism: the layers cut into stages, microbatches flowing through.

With p stages and m microbatches, each of forward time t_f and backward t_b
per stage, a schedule that keeps every stage busy once the pipeline is full
still waits (p−1)(t_f + t_b) to fill and drain it: the bubble, as a fraction of
the useful time m(t_f + t_b), is (p−1)/m for GPipe and for 1F1B (Huang et al.
2019; Narayanan et al. 2021). 1F1B does not shrink the bubble; it bounds the
activations in flight to p microbatches instead of m. Interleaving gives each
rank v chunks of layers (chunk k of rank r is model chunk k·p + r); each
forward/backward is then 1/v as long and the bubble (p−1)/(v·m).

A schedule is a plain function ``(p, r, m, v) -> [(kind, chunk, microbatch)]``:
the order in which rank r runs its forwards "F" and backwards "B". `run_schedule`
executes such a list: activations go forward and gradients backward through
`minitp.comm` p2p, each message tagged by what it carries, sends posted
without waiting (so a rank blocks only on a receive it needs, and a valid
order cannot deadlock), compute recorded as trace regions "F3" / "B3"
(with ":k" for chunk k when v > 1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from . import comm, trace
from .mesh import Axis, Mesh, layout
from .partial_grads import sum_partial_grads


# --------------------------------------------------------------------------- schedules
def gpipe(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """All forwards, then all backwards (GPipe; "AFAB")."""
    return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]


def one_f_one_b(p: int, r: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """Warm-up: p−r−1 forwards fill the pipeline below this stage. Steady: one
    forward, one backward. Cool-down: the backwards left. At most p−r
    microbatches' activations are alive at once (PipeDream-Flush)."""
    warmup = min(p - r - 1, m)
    order = [("F", 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", 0, warmup + i), ("B", 0, i)]
    return order + [("B", 0, i) for i in range(m - warmup, m)]


def interleaved(p: int, r: int, m: int, v: int = 2) -> list[tuple[str, int, int]]:
    """1F1B over v chunks per rank, Megatron-LM's order: microbatches go through
    a chunk in groups of p before the rank moves to its next chunk. Warm-up is
    2(p−r−1) + (v−1)p forwards; then one forward, one backward; then cool-down."""
    if m % p:
        raise ValueError(f"the interleaved schedule needs microbatches ({m}) divisible by pp ({p})")
    total = m * v

    def unit(i, backward):
        k = (i // p) % v
        return (v - 1 - k if backward else k), (i // (p * v)) * p + i % p

    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [("F", *unit(i, False)) for i in range(warmup)]
    for i in range(total - warmup):
        order += [("F", *unit(warmup + i, False)), ("B", *unit(i, True))]
    return order + [("B", *unit(i, True)) for i in range(total - warmup, total)]


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved}


def simulate(schedule: str, p: int, m: int, v: int = 1) -> dict:
    """Run the schedule on paper: every forward and backward takes one tick per
    chunk, a unit starts when its rank is free and its input has arrived.
    Returns {"ticks", "busy", "bubble"}: bubble = idle / busy per rank."""
    orders = [SCHEDULES[schedule](p, r, m, v) for r in range(p)]
    done, clock, pos = {}, [0] * p, [0] * p
    n = p * v
    while any(pos[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if pos[r] == len(orders[r]):
                continue
            kind, k, i = orders[r][pos[r]]
            g = k * p + r
            need = [("F", g - 1, i)] if kind == "F" and g > 0 else []
            if kind == "B":
                need = [("F", g, i)] + ([("B", g + 1, i)] if g < n - 1 else [])
            if all(d in done for d in need):
                start = max([clock[r]] + [done[d] for d in need])
                clock[r] = done[(kind, g, i)] = start + 1
                pos[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule} deadlocks for p={p}, m={m}, v={v}")
    busy = 2 * m * v
    ticks = max(clock)
    return {"ticks": ticks, "busy": busy, "bubble": (ticks - busy) / busy}


# --------------------------------------------------------------------------- the model
def embedding_axis(mesh: Mesh) -> Axis | None:
    """The group of the first and last pipeline stage of this rank's pipeline,
    which both hold the tied embedding (Megatron's embedding group). Every rank
    creates every such group, in the same order, as process groups require;
    None on ranks in neither stage or without a pipeline."""
    if mesh.pp.size == 1:
        return None
    mine = None
    for ranks in layout(mesh.dp_size, mesh.pp_size, mesh.tp_size)["pp"]:
        pair = [ranks[0], ranks[-1]]
        group = dist.new_group(pair)
        if mesh.rank in pair:
            mine = Axis("embedding", tuple(pair), pair.index(mesh.rank), group)
    return mine


class PipelineGPT(nn.Module):
    """This rank's chunks of a pipelined GPT (one per virtual stage), each a
    `ParallelGPT` over the tensor-parallel axis."""

    def __init__(self, chunks, mesh: Mesh, embedding: Axis | None, dense: dict):
        super().__init__()
        self.chunks, self.mesh, self.embedding = nn.ModuleList(chunks), mesh, embedding
        self._dense = dense  # plain name -> (shape, dtype) of the dense model's parameters
        self.cfg, self.sequence_parallel = chunks[0].cfg, chunks[0].sequence_parallel

    def forward(self, *args, **kwargs):
        raise TypeError("a pipelined model runs through mt.train_step (its stages live on "
                        "several ranks); call a chunk, model.chunks[k], to run one stage")

    def partial_grad_parameters(self) -> list[nn.Parameter]:
        return [p for c in self.chunks for p in c.partial_grad_parameters()]

    def sync_partial_grads(self) -> None:
        """Sum the sequence-parallel partial gradients over tp, all chunks at once."""
        sum_partial_grads(self.partial_grad_parameters(), self.mesh.tp)

    def sync_embedding_grads(self) -> None:
        """The tied embedding has a copy on the first and the last stage; each got
        the gradient of its use (lookup, output projection). The true gradient is
        their sum, so both copies take the same step and stay equal."""
        if self.embedding is None:
            return
        chunk = self.chunks[0] if self.chunks[0].first else self.chunks[-1]
        weight = chunk.wte.weight
        grad = weight.grad if weight.grad is not None else torch.zeros_like(weight)
        with trace.label("embedding grads"), trace.phase("bwd"):
            weight.grad = comm.all_reduce(grad, self.embedding)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's parameters under the plain names, on every rank:
        gathered over tp by each chunk, then broadcast over pp from the stage that
        holds each one."""
        return self._gather(lambda c: c.full_state_dict())

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        return self._gather(lambda c: c.full_grad_dict())

    def _gather(self, dense_of) -> dict[str, torch.Tensor]:
        pp, per_chunk = self.mesh.pp, len(self.chunks[0].blocks)
        mine = {}
        for c in self.chunks:
            mine.update(dense_of(c))
        out, device = {}, next(self.parameters()).device
        with trace.paused():
            for name, (shape, dtype) in self._dense.items():
                if name.startswith("blocks."):
                    owner = (int(name.split(".")[1]) // per_chunk) % pp.size
                elif name.startswith(("ln_f.",)):
                    owner = pp.size - 1
                else:  # wte, wpe: the first stage
                    owner = 0
                value = mine.get(name) if pp.rank == owner else None
                if value is None:
                    value = torch.zeros(shape, dtype=dtype, device=device)
                out[name] = comm.broadcast(value, pp, src=owner)
        return out


# --------------------------------------------------------------------------- execution
def run_schedule(order, chunks, mesh: Mesh, microbatches, weights, before_backward=None):
    """Run one rank's `order` of ("F"/"B", chunk, microbatch).

    microbatches: list of (x, y); weights: each microbatch's share of the loss.
    `before_backward(chunk_index, microbatch)` is called before each backward
    (data parallelism arms its gradient sync there). Returns the sum of the
    weighted losses this rank computed (0 off the last stage), float64.
    """
    pp, v = mesh.pp, len(chunks)
    p, r, m = pp.size, pp.rank, len(microbatches)
    n = p * v
    sp, tp = chunks[0].sequence_parallel, mesh.tp
    cfg = chunks[0].cfg
    param = next(chunks[0].parameters())
    inputs, outputs, sends = {}, {}, []
    loss_sum = torch.zeros((), dtype=torch.float64)

    def rank_of(g):
        return pp.ranks[g % p]

    def tag(kind, g, i):  # unique per message: activation into / gradient out of chunk g
        return 2 * (g * m + i) + (kind == "B")

    def name(kind, k, i):
        return f"{kind}{i}" + (f":{k}" if v > 1 else "")

    for kind, k, i in order:
        g = k * p + r
        chunk = chunks[k]
        x, y = microbatches[i]
        if kind == "F":
            if g == 0:
                inp = x
            else:
                T = x.shape[1] // tp.size if sp else x.shape[1]
                buf = torch.empty((x.shape[0], T, cfg.d_model), dtype=param.dtype,
                                  device=param.device)  # (B, T or T/t, C)
                with trace.label("pipeline"), trace.phase("fwd"):
                    inp = comm.irecv(buf, rank_of(g - 1), tag("F", g, i)).wait()
                inp.requires_grad_()
            with trace.region(name("F", k, i), "fwd"):
                out, loss = chunk(inp, y if g == n - 1 else None)
                if g == n - 1 and weights[i] == 0:  # no targets: its mean is 0/0; learn nothing
                    out = out.sum() * 0.0
                elif g == n - 1:
                    out = loss * weights[i]  # what backward starts from
                    loss_sum += out.detach().double().cpu()
            inputs[(k, i)], outputs[(k, i)] = inp, out
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("fwd"):
                    sends.append(comm.isend(out, rank_of(g + 1), tag("F", g + 1, i)))
        else:
            out, inp = outputs.pop((k, i)), inputs.pop((k, i))
            grad = None
            if g < n - 1:
                with trace.label("pipeline"), trace.phase("bwd"):
                    grad = comm.irecv(torch.empty_like(out), rank_of(g + 1),
                                      tag("B", g, i)).wait()
            if before_backward is not None:
                before_backward(k, i)
            with trace.region(name("B", k, i), "bwd"):
                torch.autograd.backward(out, grad)
            if g > 0:
                with trace.label("pipeline"), trace.phase("bwd"):
                    sends.append(comm.isend(inp.grad, rank_of(g - 1), tag("B", g - 1, i)))
    for pending in sends:
        pending.wait()
    return loss_sum
