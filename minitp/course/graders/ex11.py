"""Checks for ex11: the learner's 1F1B executor, run on a real pipeline.

On 4 processes, a float64 GPT cut into 4 stages (`parallelize` with pp = 4)
takes one training step at m = 5 and one at m = 2 (fewer microbatches than
stages: a warm-up cut short), each stage run by the learner's
``one_f_one_b_step(stage, m)``. `Stage` hands the learner the computing
(forward, backward, a receive buffer) and records, on the way, which units
ran in which order and what the learner still holds. Per m:

* the step ends (a deadlock is a `CollectiveTimeout`, reported as the ranks
  that never met), and the loss and every gradient equal the plain GPT's;
* every stage ran its forwards and backwards in 1F1B's order;
* one activation went forward and one gradient back per microbatch and
  boundary, every send waited for;
* no stage held more than p − r microbatches' activations at once — a
  microbatch counts from its forward until its backward, and after that for
  as long as the learner still references its input or output — and none
  once the step returned (a leak).
"""

from __future__ import annotations

import gc
import re
import weakref

import torch

from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...pipeline import schedules
from ...rules import unit_label
from ...runtime import trace
from ...runtime._device import device
from ...runtime.errors import CollectiveTimeout, LaunchError
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from .base import Check, failure_check

PP, MS = 4, (5, 2)  # m = 2 < p: rank 0's warm-up is cut short by the microbatches
ROWS = 2  # rows per microbatch
CFG = dict(vocab_size=16, seq_len=8, n_layer=4, n_head=2, d_model=8)
TOLERANCE = 1e-12  # float64; the pipeline sums the microbatches' gradients in another order
TIMEOUT = 10.0  # seconds a rank may wait for a message before the run counts as a deadlock


class Stage:
    """One pipeline stage as the learner sees it: it computes; the learner moves
    and keeps. It also watches: the order of the units, and which microbatches'
    activations (the learner's x and out) are still alive at each unit."""

    def __init__(self, chunk, mesh: Mesh, x, y, m: int):
        self.chunk, self.m = chunk, m
        self.r, self.p = mesh.pp.rank, mesh.pp.size
        self.prev = None if mesh.pp.is_first else mesh.pp.prev
        self.next = None if mesh.pp.is_last else mesh.pp.next
        self.param = next(chunk.parameters())
        self.x = x.to(self.param.device).chunk(m)
        self.y = y.to(self.param.device).chunk(m)
        self.loss = 0.0
        self.order: list[str] = []
        self.refs: dict[int, list[weakref.ref]] = {}  # microbatch -> its x and out
        self.backward_at: dict[int, int] = {}  # microbatch -> index of its backward unit
        self.peak, self.kept_after = 0, []  # kept_after: (microbatch, unit) alive too long

    def activation_buffer(self) -> torch.Tensor:
        return torch.empty((ROWS, CFG["seq_len"], CFG["d_model"]), dtype=self.param.dtype,
                           device=self.param.device)

    def forward(self, i: int, x):
        i = self._unit("F", i)
        if self.prev is None:
            if x is not None:
                raise ValueError("the first stage reads the tokens itself: pass x=None")
            x = self.x[i]
        elif not isinstance(x, torch.Tensor):
            raise ValueError(f"stage {self.r} needs the activation from stage {self.r - 1} "
                             f"as x, got {type(x).__name__}")
        elif not x.requires_grad:
            raise ValueError("x must require grad (x.requires_grad_()), so that backward "
                             "leaves in x.grad the gradient to send back")
        with trace.region(unit_label("F", i), "fwd"):
            out, loss = self.chunk(x, self.y[i] if self.next is None else None)
            if self.next is None:
                out = loss / self.m  # equal microbatches: the batch mean is their mean
                self.loss += out.item()
        self.refs[i] = [weakref.ref(t) for t in (x, out) if t.requires_grad]
        return out

    def backward(self, i: int, out, grad) -> None:
        i = self._unit("B", i)
        if (grad is None) != (self.next is None):
            raise ValueError("pass the gradient received from the next stage as g "
                             "(None only on the last stage)")
        with trace.region(unit_label("B", i), "bwd"):
            torch.autograd.backward(out, grad)
        self.backward_at[i] = len(self.order) - 1

    def _unit(self, kind: str, i) -> int:
        """Record one unit; count the microbatches held as it starts."""
        i = int(i)
        if not 0 <= i < self.m:
            raise ValueError(f"microbatch {i} is not one of 0 … {self.m - 1}")
        if i in (self.refs if kind == "F" else self.backward_at):
            raise ValueError(f"{kind}{i} runs twice")
        if kind == "B" and i not in self.refs:
            raise ValueError(f"B{i} before F{i}")
        unit = len(self.order)
        self.order.append(f"{kind}{i}")
        held = {i} if kind == "F" else set()
        for j, refs in self.refs.items():
            if j not in self.backward_at:
                held.add(j)  # its graph, the saved activations, lives until its backward
            elif self.backward_at[j] < unit - 1 and any(ref() is not None for ref in refs):
                # A name that still points at the last backward's tensors is fine (a
                # loop variable); two units later, something is keeping them.
                held.add(j)
                self.kept_after.append((j, self.order[-1]))
        self.peak = max(self.peak, len(held))
        return i

    def left_behind(self) -> list[int]:
        """Microbatches whose activations are still alive: never backpropagated, or
        referenced by something that outlived the step."""

        gc.collect()  # a reference cycle keeps its tensors only until the collector runs
        return sorted(j for j, refs in self.refs.items()
                      if j not in self.backward_at or any(ref() is not None for ref in refs))


def _reference(x, y):
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**CFG)).double()
    _, loss = ref(x, y)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in ref.named_parameters()}


def _in_rank(step, x, y):
    """Every rank: one pipeline step per m, run by the learner's executor."""
    mesh = Mesh(pp=PP)
    found = []
    # What exists now (torch, the preloaded library) is no one's leak: frozen, the
    # collector skips it, and `left_behind`'s collection takes milliseconds, not seconds.
    gc.freeze()
    try:
        for m in MS:
            torch.manual_seed(0)
            model = parallelize(GPT(GPTConfig(**CFG)).double().to(device()), mesh)
            stage = Stage(model.chunks[0], mesh, x[:ROWS * m].to(device()),
                          y[:ROWS * m].to(device()), m)
            first = len(trace.events())
            step(stage, m)
            events = trace.events()[first:]
            left = stage.left_behind()
            model.sync_embedding_grads()  # the tied embedding's two uses, summed (lesson 11)
            grads = model.full_grad_dict()
            ref_loss, ref_grads = _reference(x[:ROWS * m], y[:ROWS * m])
            worst = max(((grads[n] - g).abs().max().item(), n) for n, g in ref_grads.items())
            found.append({
                "loss": (stage.loss, ref_loss), "grad": worst, "order": stage.order,
                "messages": [(e.op, e.peer) for e in events if e.op in ("send", "recv")],
                "peak": stage.peak, "kept_after": stage.kept_after[:1], "left": left,
            })
    finally:
        gc.unfreeze()  # in case this process lives on (a launch in place, under torchrun)
    return found


def run(module) -> list[Check]:
    names = [name for m in MS for name in _names(m)]
    generator = torch.Generator().manual_seed(7)
    x = torch.randint(0, CFG["vocab_size"], (ROWS * max(MS), CFG["seq_len"]),
                      generator=generator)
    y = torch.randint(0, CFG["vocab_size"], x.shape, generator=generator)
    try:
        per_rank = launch(_in_rank, PP, module.one_f_one_b_step, x, y, timeout=TIMEOUT)
    except LaunchError as error:
        failed = failure_check(names[0], error, "one_f_one_b_step")
        why = "the run above failed"
        if isinstance(error, CollectiveTimeout):
            failed.detail, why = _deadlock(error), "the step deadlocked (see above)"
            failed.hint = ("a stage waited for a message its neighbour never sent: each stage "
                           "must receive in the order its neighbours send (how many forwards "
                           "does a stage run before its first backward?)")
        elif "not written yet" in failed.detail:
            why = failed.detail
        return [failed] + [Check(name, False, f"not run: {why}") for name in names[1:]]
    checks = []
    for k, m in enumerate(MS):
        these = _names(m)
        found = [rank_found[k] for rank_found in per_rank]
        checks += [_numbers(these[0], found), _order(these[1], found, m),
                   _messages(these[2], found, m), _held(these[3], found)]
    return checks


def _deadlock(error: CollectiveTimeout) -> str:
    """Who waited for what, in the pipeline's words: from rank r−1 comes an activation,
    from rank r+1 a gradient."""
    waits = []
    for r, op in sorted(error.waiting.items()):
        peer = re.search(r"recv on peer rank (\d+)", op)
        if peer:
            src = int(peer[1])
            what = "an activation" if src < r else "a gradient"
            waits.append(f"rank {r} waits for {what} from rank {src}")
        else:
            waits.append(f"rank {r} waits in {op}")
    done = f"; ranks {error.finished} had returned" if error.finished else ""
    return f"deadlock after {TIMEOUT:g} s: " + "; ".join(waits) + done


def _names(m) -> list[str]:
    head = f"p={PP}, m={m}"
    return [f"{head}: the step ends, loss and every gradient equal the plain GPT's",
            f"{head}: every stage runs 1F1B's order",
            f"{head}: one message per microbatch each way, every send waited for",
            f"{head}: at most p − r microbatches held, none after the step"]


def _numbers(name, found) -> Check:
    got, want = found[-1]["loss"]  # the last stage computes the loss
    loss_error = abs(got - want)
    error, rank, tensor = max((f["grad"][0], r, f["grad"][1]) for r, f in enumerate(found))
    if loss_error > TOLERANCE:
        return Check(name, False, f"loss {got:.12f}, plain GPT {want:.12f}", rank=PP - 1,
                     max_error=loss_error, hint="every microbatch runs forward exactly once, "
                     "on the activation the previous stage sent for it")
    if error <= TOLERANCE:
        return Check(name, True, f"largest gradient error {error:.1e}", max_error=error)
    return Check(name, False, f"rank {rank}, {tensor}.grad: largest error {error:.3g}",
                 rank=rank, tensor=tensor, max_error=error,
                 hint="backward each microbatch from its own out, with the gradient the next "
                      "stage sent for that microbatch, and send back its x.grad")


def _order(name, found, m) -> Check:
    for r, f in enumerate(found):
        want = [f"{kind}{i}" for kind, _, i in schedules.one_f_one_b(PP, r, m)]
        if f["order"] != want:
            pairs = zip(f["order"], want, strict=False)  # unequal lengths: the shorter one
            at = next((k for k, (a, b) in enumerate(pairs) if a != b),
                      min(len(f["order"]), len(want)))
            ran = " ".join(f["order"][:at + 1])
            return Check(name, False, f"rank {r} ran {ran} …, where 1F1B runs "
                         f"{want[at] if at < len(want) else 'nothing more'}",
                         rank=r, hint="a stage runs forwards until the stages after it are "
                         "busy and its first gradient can come back; then one forward, one "
                         "backward; then the backwards left")
    return Check(name, True, "")


def _messages(name, found, m) -> Check:
    for r, f in enumerate(found):
        want = []
        if r > 0:
            want += [("recv", r - 1), ("send", r - 1)]
        if r < PP - 1:
            want += [("send", r + 1), ("recv", r + 1)]
        for op, peer in want:
            count = f["messages"].count((op, peer))
            if count != m:
                what = "activations" if (op == "send") == (peer > r) else "gradients"
                verb = "sent to" if op == "send" else "received from"
                hint = ("wait() for every isend before returning: a send never waited for "
                        "may not have been delivered" if op == "send" and count < m else
                        "one activation forward and one gradient back, per microbatch")
                return Check(name, False, f"rank {r} {verb} rank {peer} {count} {what} "
                             f"(waited for); expected {m}", rank=r, hint=hint)
        extra = sorted(set(f["messages"]) - set(want))
        if extra:
            return Check(name, False, f"rank {r} exchanged messages with rank {extra[0][1]}",
                         rank=r, hint="a stage talks only to stage.prev and stage.next")
    return Check(name, True, f"{m} per neighbour each way")


def _held(name, found) -> Check:
    for r, f in enumerate(found):
        if f["left"]:
            return Check(name, False, f"rank {r} still holds microbatches {f['left']} after "
                         "the step (a leak)", rank=r, hint="every forward needs its backward, "
                         "and nothing may keep a microbatch's x or out once the step returns")
        if f["kept_after"]:
            j, unit = f["kept_after"][0]
            return Check(name, False, f"rank {r} still held microbatch {j}'s x or out at {unit}, "
                         "after its backward", rank=r, hint="once its backward has run, drop "
                         "what you kept for it")
        if f["peak"] > PP - r:
            return Check(name, False, f"rank {r} held {f['peak']} microbatches at once; 1F1B "
                         f"needs at most p − r = {PP - r}", rank=r,
                         hint="start each backward as soon as the schedule allows")
    peaks = [f["peak"] for f in found]
    return Check(name, True, f"at most {peaks} on ranks 0 … {PP - 1}")
