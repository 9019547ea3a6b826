"""Checks for ex04: the vocab-parallel cross-entropy, forward and backward.

At t = 2, 3 and 4 ranks, in float64, against ``F.cross_entropy`` on the gathered
logits (computed on every rank from the same seed, an independent reference):

* the loss, and the gradient of the logits (each rank's columns), on logits
  with one row shifted by +1000 (exp would overflow without the max);
* ignored targets (-100): left out of the mean, and their rows get no gradient;
* a padded vocabulary (11 ids, padded to 12): the padded columns, filled with
  large values, take no part in the loss and get no gradient;
* communication: exactly three all-reduces in the forward, each of one number
  per token, and nothing at all in the backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import world
from .base import Check, run_per_size

WORLD_SIZES = (2, 3, 4)
TOLERANCE = 1e-12  # float64
BATCH, SEQ = 2, 5  # 10 tokens
# name -> (real vocabulary, padded vocabulary, ignored token positions)
CASES = {
    "plain": (12, 12, ()),
    "ignored": (12, 12, (0, 3, 4, 9)),
    "padded": (11, 12, (2,)),
}
HINTS = {
    "loss": "loss_n = log S - (z_y - m) with m and S over the WHOLE vocabulary (all-reduce max, "
            "then sum); the mean divides by the number of kept tokens",
    "grad": "the gradient is (softmax - one_hot(target)) / count, with softmax = exp(z - m) / S "
            "using the all-reduced m and S; subtract 1 only on the rank that owns the target",
    "ignored": "leave tokens whose target is ignore_index out of the sum AND the count, and "
               "zero their rows of the gradient",
    "padded": "mask columns with id >= vocab_size to -inf before the max and the sum: exp(-inf) "
              "= 0 gives them no say in the loss and a zero gradient",
}


def _case(name, generator):
    vocab, padded, ignored = CASES[name]
    logits = torch.randn(BATCH * SEQ, padded, generator=generator, dtype=torch.float64)
    if name == "plain":
        logits[1] += 1000.0  # a row whose exp overflows without subtracting the max
    logits[:, vocab:] = 30.0  # padding: large, so that using it changes everything
    targets = torch.randint(0, vocab, (BATCH * SEQ,), generator=generator)
    targets[list(ignored)] = -100
    return vocab, padded, logits, targets


def _in_rank(vocab_parallel_cross_entropy):
    """Runs on every rank: the learner's loss against F.cross_entropy, per case."""
    axis = world()
    t = axis.size
    found = {}
    for index, name in enumerate(CASES):
        vocab, padded, full, targets = _case(name, torch.Generator().manual_seed(400 + index))
        full, targets = full.to(device()), targets.to(device())  # drawn on the CPU
        reference = full[:, :vocab].clone().requires_grad_()
        expected = F.cross_entropy(reference, targets, ignore_index=-100)
        expected.backward()
        expected_grad = torch.cat(
            [reference.grad, torch.zeros(len(targets), padded - vocab, dtype=torch.float64,
                                         device=device())], 1)
        width = padded // t
        columns = slice(axis.rank * width, (axis.rank + 1) * width)
        local = full[:, columns].reshape(BATCH, SEQ, width).clone().requires_grad_()
        entry = {"vocab": vocab}
        first = len(trace.events())
        try:
            loss = vocab_parallel_cross_entropy(local, targets.view(BATCH, SEQ), axis,
                                                ignore_index=-100, vocab_size=vocab)
        except NotImplementedError as exc:  # a blank: every rank raises it at the same point
            entry["missing"] = ("forward", str(exc))
            found[name] = entry
            continue
        entry["forward_ops"] = [(e.op, e.shape) for e in trace.events()[first:]]
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            entry["problem"] = f"returned {type(loss).__name__}, not a one-element tensor"
            found[name] = entry
            continue
        entry["loss_error"] = abs(loss.item() - expected.item())
        entry["loss"], entry["expected"] = loss.item(), expected.item()
        first = len(trace.events())
        try:
            loss.backward()
        except NotImplementedError as exc:
            entry["missing"] = ("backward", str(exc))
            found[name] = entry
            continue
        entry["backward_ops"] = [e.op for e in trace.events()[first:]]
        if local.grad is None:
            entry["problem"] = "the logits got no gradient"
            found[name] = entry
            continue
        difference = (local.grad.reshape(-1, width) - expected_grad[:, columns]).abs()
        entry["grad_error"] = difference.max().item()
        kept = (targets != -100).unsqueeze(1)
        entry["ignored_rows_error"] = difference.masked_fill(kept, 0.0).max().item()
        padding = torch.arange(columns.start, columns.stop, device=device()) >= vocab
        entry["padding_error"] = (local.grad.reshape(-1, width)[:, padding].abs().max().item()
                                  if padding.any() else 0.0)
        found[name] = entry
    return found


def run(module) -> list[Check]:
    def launch_at(t):
        return launch(_in_rank, t, module.vocab_parallel_cross_entropy, timeout=10.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, blank=_blank,
                        what="vocab_parallel_cross_entropy", size="t")


def _names(t) -> list[str]:
    return [f"t={t}: loss equals F.cross_entropy", f"t={t}: gradient of the logits",
            f"t={t}: ignored targets (-100)", f"t={t}: padded vocabulary (11 -> 12)",
            f"t={t}: three all-reduces forward, none backward"]


def _judge(t, names, per_rank) -> list[Check]:
    missing = _missing(per_rank)
    if missing and missing[0] == "forward":
        return ([Check(names[0], False, "the forward is not written yet", hint=missing[1])]
                + [Check(n, False, "not checked: the forward is not written yet")
                   for n in names[1:]])
    return [_value(names[0], per_rank, "plain"),
            _gradient(names[1], per_rank, "plain", missing),
            _special(names[2], per_rank, "ignored", "ignored_rows_error", missing),
            _special(names[3], per_rank, "padded", "padding_error", missing),
            _communication(names[4], per_rank, t, missing)]


def _blank(per_rank, checks) -> str | None:
    """Without a forward nothing else can run, at any size; a missing backward is
    reported per check, and the other sizes still test the forward."""
    missing = _missing(per_rank)
    return "the forward is not written yet" if missing and missing[0] == "forward" else None


def _missing(per_rank):
    for entries in per_rank:
        for entry in entries.values():
            if "missing" in entry:
                return entry["missing"]
    return None


def _problem(name, per_rank, case):
    for rank, entries in enumerate(per_rank):
        if "problem" in entries[case]:
            return Check(name, False, f"rank {rank}, case '{case}': {entries[case]['problem']}",
                         rank=rank, hint="return loss (a 0-dim tensor) from forward and one "
                                         "gradient per input from backward")
    return None


def _worst(per_rank, case, key):
    return max((entries[case][key], rank) for rank, entries in enumerate(per_rank))


def _value(name, per_rank, case, hint_key="loss") -> Check:
    problem = _problem(name, per_rank, case)
    if problem:
        return problem
    error, rank = _worst(per_rank, case, "loss_error")
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    entry = per_rank[rank][case]
    return Check(name, False, f"rank {rank}, case '{case}': loss {entry['loss']:.6g}, expected "
                 f"{entry['expected']:.6g} (error {error:.3g})", rank=rank, tensor="loss",
                 max_error=error, hint=HINTS[hint_key])


def _gradient(name, per_rank, case, missing, hint_key="grad") -> Check:
    if missing:
        return Check(name, False, "the backward is not written yet", hint=missing[1])
    problem = _problem(name, per_rank, case)
    if problem:
        return problem
    error, rank = _worst(per_rank, case, "grad_error")
    if error <= TOLERANCE:
        return Check(name, True, f"largest error {error:.1e}", max_error=error)
    return Check(name, False, f"rank {rank}, case '{case}': gradient of the logits off by up to "
                 f"{error:.3g}", rank=rank, tensor="grad of the logits", max_error=error,
                 hint=HINTS[hint_key])


def _special(name, per_rank, case, key, missing) -> Check:
    value = _value(name, per_rank, case, hint_key=case)
    if not value.passed:
        return value
    gradient = _gradient(name, per_rank, case, missing, hint_key=case)
    if not gradient.passed:
        return gradient
    error, rank = _worst(per_rank, case, key)
    what = "ignored tokens' rows" if case == "ignored" else "padded columns"
    if error > TOLERANCE:
        return Check(name, False, f"rank {rank}: the {what} got a gradient of up to {error:.3g}",
                     rank=rank, tensor=f"grad of the {what}", max_error=error, hint=HINTS[case])
    worst = max(value.max_error, gradient.max_error)
    return Check(name, True, f"loss and gradient within {worst:.1e}; {what}: no gradient",
                 max_error=worst)


def _communication(name, per_rank, t, missing) -> Check:
    tokens = BATCH * SEQ
    for rank, entries in enumerate(per_rank):
        entry = entries["plain"]
        ops = entry.get("forward_ops", [])
        kinds = [op for op, _ in ops]
        if kinds != ["all_reduce"] * 3:
            shown = ", ".join(kinds) or "nothing"
            return Check(name, False, f"rank {rank}'s forward called {shown}", rank=rank,
                         hint="exactly three mt.comm.all_reduce calls: the max, the target "
                              "logit and the sum of exponentials; no gathers")
        for _, shape in ops:
            if shape != (tokens,):
                return Check(name, False, f"rank {rank} all-reduced a tensor of shape {shape}; "
                             f"expected ({tokens},), one number per token", rank=rank,
                             hint="reduce over your columns first (max / sum along dim -1), "
                                  "then all-reduce the per-token numbers")
        if missing:
            return Check(name, False, "the backward is not written yet", hint=missing[1])
        if entry.get("backward_ops"):
            used = ", ".join(entry["backward_ops"])
            return Check(name, False, f"rank {rank}'s backward called {used}", rank=rank,
                         hint="every rank already has softmax and the one-hot for its own "
                              "columns: the backward needs no communication")
    return Check(name, True, f"3 all-reduces of {tokens} numbers (one per token), backward silent")
