"""Checks for ex17: choose (dp, pp, tp, recompute, ZeRO stage) for a run, and say why.

The learner's `choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap)` is asked
about six runs (`CASES`), each chosen so that a habit fails somewhere: GPT-3 on 1024
A100s (lesson 17's), on 64 (fits only with recomputation at t = 8), a 76B model whose
60 layers forbid a deeper pipeline on 128 GPUs under 40 GiB (only ZeRO fits fast), 22B
on 64 H100s under 16 GiB (t = 8, the obvious rule, is 21% slower than t = 4), 1.7B,
where tensor parallelism only costs, and 43B with 60 heads (t stops at 4). Each plan is
measured with the calculator, as the exercise states, and:

* is a valid split: dp·pp·tp = n_gpus, the model and the batch divide, known modes;
* fits: `calc.memory_per_gpu` of its busiest GPU at most the cap;
* is fast: `calc.step_time` within `TOLERANCE` of the fastest plan `calc.plan` finds
  in the same space (micro-batch 1, any ZeRO stage) — a slow one is told which part
  of its step (compute, tp, pp, dp, bubble) exceeds the best plan's the most;
* is justified: its ``why`` gives the memory of the plan and of the next shallower
  pipeline within `MEMORY_TOLERANCE` of `calc.memory_per_gpu`, why tp stops ("node",
  "heads", "cost": exactly) and the bubble (p − 1)/m within `BUBBLE_TOLERANCE`; a wrong
  number is named in a sentence (GB for GiB, the states without activations, ZeRO
  forgotten, the bubble as a share of the step, m for the whole batch, ...);
* was reasoned, not searched: neither `calc.plan` nor `calc.planning.search.every_configuration`
  runs, and `calc.memory_per_gpu` and `calc.step_time` together run at most
  `CALLS_PER_RUN` times per run. The reference makes at most 3 (one step_time, two
  memory checks); a search makes one or two per configuration, dozens to hundreds
  per run. Calls are counted by the functions' code objects (`sys.setprofile`), so
  every call is seen however the learner imported the function.

No process is launched: the grader is the calculator (well under a second).

Its parts: ex17_cases.py (the runs, tolerances and words), ex17_reference.py (the
calculator's verdict on a plan), ex17_checks.py (the six checks); this module runs them.
"""

from __future__ import annotations

from ... import calc
from ...calc.network.cluster import GiB
from ...calc.planning import search
from .base import Check, Stopped, attempt
from .ex17_cases import CASES, KEYS, NAMES
from .ex17_checks import _fast, _fits, _memory_why, _reasoned, _stop_and_bubble, _valid
from .ex17_reference import _judge
from .watch import CallWatch

# The calculator's functions a plan is checked with (counted) or found by (forbidden).
WATCHED = {calc.plan: "calc.plan",
           search.every_configuration: "calc.planning.search.every_configuration",
           calc.memory_per_gpu: "calc.memory_per_gpu", calc.step_time: "calc.step_time"}


def run(module) -> list[Check]:
    answers = []
    with CallWatch(WATCHED) as watch:  # only the learner's code inside: the reference after
        try:
            for label, cfg, cluster, n_gpus, batch, cap in CASES:
                watch.new_run()
                answers.append(attempt(module.choose_plan, cfg, cluster, n_gpus, batch,
                                       cap * GiB, names=NAMES, blank="choose_plan", label=label,
                                       hint="return a dict with the keys " + ", ".join(KEYS)
                                       + " and why"))
        except Stopped as stop:
            return stop.checks
    judged = [_judge(case, plan) for case, plan in zip(CASES, answers, strict=True)]
    return [_valid(judged), _fits(judged), _fast(judged), _memory_why(judged),
            _stop_and_bubble(judged), _reasoned(watch.runs)]
