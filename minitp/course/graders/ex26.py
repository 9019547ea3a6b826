"""Checks for ex26: expert parallelism's dispatch and combine.

One launch of 4 ranks, in float64. First the learner's `dispatch_and_combine`
alone, at ep = 4 (the whole world; E = 8 experts, 2 per rank, top-2, some
assignments dropped, gates not 1): every rank knows every rank's tokens and
routing, so it knows what each step of its run should hold, and checks:

* the split sizes: a counts exchange (an all-to-all of integers) before the
  rows move; the dispatch's splits (send: rows for each rank's experts; recv:
  rows from each rank) and the combine's, swapped. Every all-to-all is watched:
  the ranks compare their splits before it runs, so splits that do not match
  stop every rank with a diagnosis, never a hang;
* the output equals the one-device layer's (`minitp.model.moe.LocalDispatch` with all
  E experts). If not, the first step that went wrong is named: the rows sent,
  the results sent back (the regroup not undone, or undone by itself), the
  un-permute (by `order` rather than its inverse) or the gates (forgotten, or
  applied twice);
* the gradients of the tokens, the gates and this rank's experts equal one
  device's (backward runs through the learner's all-to-alls).

Then the function is installed as every MoE layer's dispatch of a GPT made by
`parallelize` on ``Mesh(dp=4, ep=2)`` (E = 4, 2 per rank), and one AdamW step's
loss and every parameter after it must equal the plain GPT's.

Its parts: ex26_rank.py (the run on the ranks), ex26_diagnosis.py (what a rank should
hold, and its checks of its own run); this module runs them and gathers the verdicts.
"""

from __future__ import annotations

from ...runtime.launch import launch
from .base import Check, run_per_size
from .ex26_rank import _in_rank

WORLD = 4
TIMEOUT = 30.0
STEP_CHECK = True  # the training step on Mesh(dp=4, ep=2) (its tests may leave it out)
NAMES = ["ep=4: counts exchanged, rows dispatched and combined with the right split sizes",
         "ep=4: the output equals the one-device layer's",
         "ep=4: the gradients of the tokens, the gates and this rank's experts equal one device's",
         "dp=4, ep=2: a training step of the MoE GPT equals one device's"]


def run(module) -> list[Check]:
    def launch_at(n):  # STEP_CHECK is read here, in the parent, where a test may set it
        return launch(_in_rank, n, module.dispatch_and_combine, STEP_CHECK, timeout=TIMEOUT)

    return run_per_size((WORLD,), lambda n: list(NAMES), launch_at, _judge,
                        what="dispatch_and_combine", size="n")


def _judge(n, names, per_rank) -> list[Check]:
    checks = []
    for i, name in enumerate(names):
        results = [r["checks"][i] for r in per_rank]
        failed = [(rank, res) for rank, res in enumerate(results) if not res[0]]
        if not failed:  # the numbers: the largest error over the ranks
            errors = [res[3] for res in results if res[3] is not None]
            worst = max(errors) if errors and i in (1, 2) else None
            detail = results[0][1] if worst is None else f"largest error {worst:.1e}"
            checks.append(Check(name, True, detail, max_error=worst))
            continue
        # the first rank that names its mistake, else the first that failed
        rank, (_, detail, hint, error, *_) = max(
            failed, key=lambda item: (len(item[1]) > 4 and item[1][4], -item[0]))
        checks.append(Check(name, False, detail, rank=rank, max_error=error, hint=hint))
    return checks
