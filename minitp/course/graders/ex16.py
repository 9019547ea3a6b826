"""Checks for ex16: one tensor-parallel step's compute and communication seconds.

The learner's `tp_step_seconds(cfg, t, batch, cluster, efficiency)` against
`calc.step_time` (the course's analytical model, itself tested against the
papers) for Megatron-LM's weak-scaling family at t = 1, 2, 4, 8, on 8×V100 and
8×H100 nodes, at batch 8 and 20, and at an efficiency of 30% and 50%:

* compute seconds equal, to 1e-9 relative;
* communication seconds equal, to 1e-9 relative — with a hint that names the
  likely slip (something at t = 1, a factor of 2 or 4, the latency);
* the numbers were built from the pieces: `calc.step_time` and
  `Cluster.collective_seconds` are not called while the learner's code runs.

No process is launched: the grader is the calculator.
"""

from __future__ import annotations

from itertools import product

from ... import calc
from ...calc.network import cluster as cluster_module
from ..labs.scaling import megatron_family
from .base import Check, Stopped, attempt, no_shortcut

TS = (1, 2, 4, 8)
CLUSTERS = {"8xV100": calc.DGX2H_V100, "8xH100": calc.H100_80GB}
BATCHES = (8, 20)
EFFICIENCIES = (0.3, 0.5)
RELATIVE = 1e-9
NAMES = ["compute seconds equal calc.step_time's (family t = 1..8, V100 and H100)",
         "communication seconds equal calc.step_time's (all-reduces of every layer)",
         "built from the pieces: calc.step_time and collective_seconds not called"]
SHORTCUT = ("the point is to see where the time goes: write the FLOPs share and the ring's "
            "steps yourself")


def _cases():
    for (name, cluster), t, batch, eff in product(CLUSTERS.items(), TS, BATCHES, EFFICIENCIES):
        yield f"{name}, t={t}, batch {batch}, {eff:.0%} of peak", megatron_family(t), t, batch, \
            cluster, eff


class _Watch:
    """Counts calls of the calculator's shortcuts while the learner's code runs."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        self._step_time = calc.step_time
        self._collective = cluster_module.Cluster.collective_seconds
        watch = self

        def step_time(*args, **kwargs):
            watch.calls.append("calc.step_time")
            return watch._step_time(*args, **kwargs)

        def collective_seconds(self_, *args, **kwargs):
            watch.calls.append("Cluster.collective_seconds")
            return watch._collective(self_, *args, **kwargs)

        calc.step_time = step_time
        cluster_module.Cluster.collective_seconds = collective_seconds
        return self

    def __exit__(self, *exc):
        calc.step_time = self._step_time
        cluster_module.Cluster.collective_seconds = self._collective


def run(module) -> list[Check]:
    cases, answers = list(_cases()), []
    with _Watch() as watch:  # only the learner's code runs inside: the reference comes after
        try:
            for label, cfg, t, batch, cluster, eff in cases:
                answers.append(attempt(module.tp_step_seconds, cfg, t, batch, cluster, eff,
                                       names=NAMES, blank="tp_step_seconds", label=label,
                                       hint="return a pair: (compute, communication)"))
        except Stopped as stop:
            return stop.checks
    results = [(label, cfg, t, got, calc.step_time(cfg, cluster, tp=t, micro_batch=batch,
                                                   efficiency=eff))
               for (label, cfg, t, batch, cluster, eff), got in zip(cases, answers, strict=True)]
    return [_compute(results), _communication(results),
            no_shortcut(NAMES[2], watch.calls, SHORTCUT)]


def _relative(got, expected) -> float:
    return abs(got - expected) / max(abs(expected), 1e-30) if expected else abs(got)


def _compute(results) -> Check:
    for label, _cfg, _t, got, expected in results:
        error = _relative(got[0], expected.compute)
        if error > RELATIVE:
            return Check(NAMES[0], False, f"{label}: {got[0]:.4g} s, expected "
                         f"{expected.compute:.4g} s", tensor="compute", max_error=error,
                         hint="the FLOPs of one step of the whole batch, divided among the t "
                              "GPUs, at the fraction of peak you are given")
    return Check(NAMES[0], True, f"{len(results)} cases")


def _communication(results) -> Check:
    for label, _cfg, t, got, expected in results:
        error = _relative(got[1], expected.tp)
        if error <= RELATIVE:
            continue
        ratio = got[1] / expected.tp if expected.tp else None
        if t == 1:
            hint = "with one GPU there is nobody to all-reduce with"
        elif ratio and min(abs(ratio - k) for k in (0.25, 0.5, 2, 4)) < 1e-6:
            hint = (f"off by a factor of {ratio:g}: count the all-reduces per layer in both "
                    "passes again, and the steps of one ring")
        else:
            hint = ("each ring step pays the latency once and moves 1/t of the tensor; "
                    "the tensor is batch × seq_len × d_model values of 2 bytes")
        return Check(NAMES[1], False, f"{label}: {got[1]:.4g} s, expected {expected.tp:.4g} s",
                     tensor="communication", max_error=error, hint=hint)
    return Check(NAMES[1], True, f"{len(results)} cases")
