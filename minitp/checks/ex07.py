"""Checks for ex07: the 1F1B order of one pipeline rank.

The learner's ``one_f_one_b(p, r, m)`` is compared with the library's schedule
(`minitp.schedules.one_f_one_b`) on every rank for several (p, m), including
fewer microbatches than stages; then it is run for real: a 4-stage pipeline of
a float64 GPT takes one training step in the learner's order (passed to
`train_step` as its schedule), and its loss must equal the plain model's.
"""

from __future__ import annotations

import torch

from minitp import schedules
from minitp.errors import LaunchError
from minitp.launch import launch
from minitp.mesh import Mesh
from minitp.model import GPT, GPTConfig
from minitp.parallelize import parallelize
from minitp.step import train_step

from .base import Check, failure_check

CASES = ((2, 4), (4, 4), (4, 8), (4, 2), (3, 5))  # (p, m); m = 2 < p = 4: a short warm-up
CFG = dict(vocab_size=32, seq_len=8, n_layer=4, n_head=2, d_model=16)
PP, MICROBATCHES = 4, 8
TOLERANCE = 1e-10  # float64; a schedule only reorders work


def _reference(p, r, m):
    return [(kind, i) for kind, _, i in schedules.one_f_one_b(p, r, m)]


def _show(order):
    return " ".join(f"{kind}{i}" for kind, i in order)


def _order_check(module, p, m) -> Check:
    name = f"p={p}, m={m}: every rank's order is 1F1B's"
    for r in range(p):
        try:
            got = module.one_f_one_b(p, r, m)
        except NotImplementedError as error:
            return Check(name, False, "one_f_one_b is not written yet",
                         hint=str(error) or "replace the NotImplementedError with your code")
        except Exception as error:  # the learner's bug, reported rather than raised
            return Check(name, False, f"rank {r} raised {type(error).__name__}: {error}", rank=r)
        want = _reference(p, r, m)
        try:
            got = [(str(kind), int(i)) for kind, i in got]
        except (TypeError, ValueError):
            return Check(name, False, f"rank {r}: returned {got!r}", rank=r,
                         hint='return a list of ("F" or "B", microbatch) pairs')
        if got != want:
            return Check(name, False, f"rank {r}: got {_show(got)}; expected {_show(want)}",
                         rank=r, hint=f"warm-up: min(p - r - 1, m) = {min(p - r - 1, m)} "
                         "forwards; then F of the next, B of the oldest; then the Bs left")
    return Check(name, True, "")


def _valid(order, m) -> str:
    """Why an order cannot run (empty when it can): each unit once, B after its F."""
    try:
        units = [(str(kind), int(i)) for kind, i in order]
    except (TypeError, ValueError):
        return 'it is not a list of ("F" or "B", microbatch) pairs'
    if sorted(units) != sorted((kind, i) for kind in "FB" for i in range(m)):
        return "it does not run each forward and each backward exactly once"
    seen = set()
    for kind, i in units:
        if kind == "B" and ("F", i) not in seen:
            return f"B{i} comes before F{i}"
        seen.add((kind, i))
    return ""


def _in_rank(one_f_one_b, x, y):
    """One float64 training step of a 4-stage pipeline in the learner's order."""

    def schedule(p, r, m, v=1):  # the built-in schedules' signature: units (kind, chunk, i)
        return [(kind, 0, i) for kind, i in one_f_one_b(p, r, m)]

    mesh = Mesh(pp=PP)
    torch.manual_seed(0)
    model = parallelize(GPT(GPTConfig(**CFG)).double(), mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return train_step(model, (x, y), mesh, optimizer, schedule=schedule,
                      microbatches=MICROBATCHES)


def run(module) -> list[Check]:
    checks = [_order_check(module, p, m) for p, m in CASES]
    name = f"a real {PP}-stage pipeline, m={MICROBATCHES}: loss equals the plain GPT, no deadlock"
    blank = next((c for c in checks if "not written yet" in c.detail), None)
    if blank is not None:
        return checks + [Check(name, False, "not run: one_f_one_b is not written yet",
                               hint=blank.hint)]
    for r in range(PP):
        try:
            why = _valid(module.one_f_one_b(PP, r, MICROBATCHES), MICROBATCHES)
        except Exception as error:
            why = f"it raised {type(error).__name__}: {error}"
        if why:
            return checks + [Check(name, False, f"not run: rank {r}'s order cannot run: {why}",
                                   rank=r, hint="every unit once, a backward after its forward")]
    generator = torch.Generator().manual_seed(7)
    x = torch.randint(0, CFG["vocab_size"], (2 * MICROBATCHES, CFG["seq_len"]),
                      generator=generator)
    y = torch.randint(0, CFG["vocab_size"], x.shape, generator=generator)
    torch.manual_seed(0)
    _, expected = GPT(GPTConfig(**CFG)).double()(x, y)
    try:
        losses = launch(_in_rank, PP, module.one_f_one_b, x, y, timeout=10.0)
    except LaunchError as error:
        return checks + [failure_check(name, error, "one_f_one_b")]
    error = max(abs(loss - expected.item()) for loss in losses)
    if error <= TOLERANCE:
        return checks + [Check(name, True, f"largest loss difference {error:.1e}",
                               max_error=error)]
    return checks + [Check(name, False, f"largest loss difference {error:.3g}", max_error=error,
                           hint="each microbatch must run exactly once forward and backward")]
