"""Checks for ex12: choose (dp, pp, tp, recompute, ZeRO stage) for a run under a memory cap.

The learner's `choose_plan(cfg, cluster, n_gpus, global_batch, memory_cap)` is asked
about five runs (`CASES`), each chosen so that a habit fails somewhere: GPT-3 on 1024
A100s (lesson 12's), on 64 (fits only with recomputation at t = 8), a 76B model whose
60 layers forbid a deeper pipeline on 128 GPUs under 40 GiB (only ZeRO fits fast),
22B under a 16 GiB cap (recomputation and a deeper pipeline), and 1.7B, where tensor
parallelism only costs. Each plan is measured with the calculator, as the exercise
states, and:

* is a valid split: dp·pp·tp = n_gpus, the model and the batch divide, known modes;
* fits: `calc.memory_per_gpu` of its busiest GPU at most the cap;
* is fast: `calc.step_time` within `TOLERANCE` of the fastest plan `calc.plan` finds
  in the same space (micro-batch 1, any ZeRO stage) — a slow one is told which part
  of its step (compute, tp, pp, dp, bubble) exceeds the best plan's the most;
* was chosen, not looked up: neither `calc.plan` nor `calc.search.every_configuration`
  is called while the learner's code runs.

No process is launched: the grader is the calculator (well under a second).
"""

from __future__ import annotations

import sys

from ... import calc
from ...calc import search
from ...calc.cluster import GiB
from ...model import GPTConfig
from ...rules import check_parallel_config
from .base import Check, crashed, no_shortcut, not_written

TOLERANCE = 0.10
KEYS = ("dp", "pp", "tp", "recompute", "zero_stage")
NAMES = ["every plan is a valid split of the GPUs, the model and the batch",
         "every plan fits under its memory cap (calc.memory_per_gpu)",
         f"every plan's step time within {TOLERANCE:.0%} of the best calc.plan finds",
         "chosen, not looked up: no planner called"]
SHORTCUT = ("the point is to choose: use calc.memory_per_gpu and calc.step_time to weigh the "
            "plans you consider, not the planner's answer")


def _gpt(h: int, a: int, layers: int) -> GPTConfig:
    return GPTConfig(vocab_size=51200, seq_len=2048, n_layer=layers, n_head=a, d_model=h)


GPT3 = _gpt(12288, 96, 96)
# (label, model, cluster, GPUs, global batch, memory cap in GiB)
CASES = (
    ("GPT-3 175B on 1024 A100s, batch 1536, 72 GiB", GPT3, calc.A100_80GB, 1024, 1536, 72),
    ("GPT-3 175B on 64 A100s, batch 64, 72 GiB", GPT3, calc.A100_80GB, 64, 64, 72),
    ("GPT 76B on 128 A100s, batch 512, 40 GiB", _gpt(10240, 80, 60), calc.A100_80GB, 128,
     512, 40),
    ("GPT 22B on 64 H100s, batch 256, 16 GiB", _gpt(6144, 64, 48), calc.H100_80GB, 64, 256,
     16),
    ("GPT 1.7B on 32 A100s, batch 512, 72 GiB", _gpt(2304, 24, 24), calc.A100_80GB, 32, 512,
     72),
)
_PLANS = {}  # label -> calc.plan's answer: the same every time, and calc.plan is the slow part

PART_HINTS = {
    "compute": "recomputation repeats forward work: spend it only where memory demands it, "
               "and on the cheapest kind that fits.",
    "tp": "tensor parallelism all-reduces in every layer, on the links its group spans: "
          "is your tp larger than this model or this node needs?",
    "pp": "every pipeline boundary sends each microbatch's activations, both ways.",
    "dp": "the gradient reduction grows with the parameters a stage holds and with the links "
          "its group spans; ZeRO 2 and 3 repeat it every microbatch.",
    "bubble": "the bubble is (p - 1)/m of a stage's busy time: deep pipelines with few "
              "microbatches per replica idle.",
}


class _Watch:
    """Records calls of the two functions that give the answer away, `calc.plan` and
    `calc.search.every_configuration`, while the learner's code runs. It patches the
    class each one looks up to build its answer (`Plan`, `Configuration`), so every
    call is seen however the learner imported the function (``from minitp.calc import
    plan`` binds it at import time, before any patch of ``calc.plan`` could catch it)."""

    ANSWER_CLASSES = ((calc.Plan, "calc.plan"),
                      (search.Configuration, "calc.search.every_configuration"))

    def __init__(self):
        self.calls = []
        self._patched = []

    def __enter__(self):
        for cls, called in self.ANSWER_CLASSES:
            module = sys.modules[cls.__module__]

            def recorded(*args, _cls=cls, _called=called, **kwargs):
                self.calls.append(_called)
                return _cls(*args, **kwargs)

            self._patched.append((module, cls))
            setattr(module, cls.__name__, recorded)
        return self

    def __exit__(self, *exc):
        for module, cls in self._patched:
            setattr(module, cls.__name__, cls)
        self._patched = []


def run(module) -> list[Check]:
    answers = []
    with _Watch() as watch:  # only the learner's code runs inside: the reference comes after
        for label, cfg, cluster, n_gpus, batch, cap in CASES:
            try:
                answers.append(module.choose_plan(cfg, cluster, n_gpus, batch, cap * GiB))
            except NotImplementedError as exc:
                return not_written(NAMES, "choose_plan", str(exc))
            except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
                return crashed(NAMES, label, exc, "return a dict with the keys " + ", ".join(KEYS))
    judged = [_judge(case, plan) for case, plan in zip(CASES, answers, strict=True)]
    return [_valid(judged), _fits(judged), _fast(judged),
            no_shortcut(NAMES[3], watch.calls, SHORTCUT)]


def _reference(label, cfg, cluster, n_gpus, batch, cap):
    if label not in _PLANS:
        _PLANS[label] = calc.plan(cfg, cluster, batch, n_gpus, micro_batches=(1,),
                                  zero_stage=(0, 1, 2, 3), usable=cap * GiB / cluster.memory)
    return _PLANS[label]


def _describe(plan: dict) -> str:
    return " ".join(f"{key}={plan[key]}" for key in KEYS)


def _judge(case, plan) -> dict:
    """What the calculator says of one plan: why it is not valid, or its memory and time."""
    label, cfg, cluster, n_gpus, batch, cap = case
    result = {"label": label, "cap": cap}
    if not isinstance(plan, dict) or set(KEYS) - set(plan):
        missing = ", ".join(k for k in KEYS if not isinstance(plan, dict) or k not in plan)
        result["invalid"] = f"{label}: got {plan!r}, a dict without {missing}"
        return result
    result["plan"] = _describe(plan)
    dp, pp, tp, recompute, zero = (plan[k] for k in KEYS)
    sp = tp > 1 if isinstance(tp, int) else False
    try:
        check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, sequence_parallel=sp,
                              recompute=recompute, zero_stage=zero, world_size=n_gpus)
        if batch % dp:
            raise ValueError(f"the global batch {batch} does not split over dp={dp} replicas")
    except ValueError as exc:
        result["invalid"] = f"{label}: {result['plan']}: {exc}"
        return result
    result["memory"] = calc.memory_per_gpu(cfg, 1, dp, pp, tp, sp, recompute, zero, "megatron",
                                           microbatches=batch // dp)
    result["time"] = calc.step_time(cfg, cluster, dp, pp, tp, 1, batch, sp, recompute,
                                    zero_stage=zero)
    result["zero"] = zero
    reference = _reference(*case)
    result["best"] = reference.best
    result["needs zero"] = not any(  # no plan without ZeRO is fast enough: say so if slow
        c.zero_stage == 0 and c.time.total <= (1 + TOLERANCE) * reference.best.time.total
        for c in reference.candidates)
    return result


def _valid(judged) -> Check:
    for r in judged:
        if "invalid" in r:
            return Check(NAMES[0], False, r["invalid"], tensor="plan",
                         hint="dp · pp · tp must be the GPU count, tp must divide the heads "
                              "(and the hidden size and sequence), pp the layers, dp the "
                              "global batch")
    return Check(NAMES[0], True, f"{len(judged)} runs")


def _fitting(r) -> bool:
    return "memory" in r and r["memory"]["total"] <= r["cap"] * GiB


def _not_checked(name, judged, checked) -> Check | None:
    skipped = [r["label"] for r in judged if r not in checked]
    if skipped:
        return Check(name, False, f"not checked for {'; '.join(skipped)}: see above")
    return None


def _fits(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    for r in valid:
        if _fitting(r):
            continue
        memory = r["memory"]
        states = memory["total"] - memory["activations"]
        return Check(NAMES[1], False, f"{r['label']}: {r['plan']} needs "
                     f"{memory['total'] / GiB:.1f} GiB on its busiest GPU (model states "
                     f"{states / GiB:.1f}, activations {memory['activations'] / GiB:.1f}), over "
                     f"the {r['cap']} GiB cap", tensor="memory",
                     max_error=memory["total"] / (r["cap"] * GiB) - 1,
                     hint="model states shrink with pp and tp (and with ZeRO, over dp); "
                          "activations with tp (sequence parallel) and recomputation")
    return (_not_checked(NAMES[1], judged, valid)
            or Check(NAMES[1], True, f"{len(judged)} runs"))


def _fast(judged) -> Check:
    fitting = [r for r in judged if _fitting(r)]
    for r in fitting:
        mine, best = r["time"], r["best"].time
        slower = mine.total / best.total - 1
        if slower <= TOLERANCE:
            continue
        excess = {part: getattr(mine, part) - getattr(best, part) for part in PART_HINTS}
        part = max(excess, key=excess.get)
        hint = PART_HINTS[part]
        if r["zero"] == 0 and r["needs zero"]:
            hint += (" Here no plan without ZeRO comes within "
                     f"{TOLERANCE:.0%} of the best: what does sharding over dp free?")
        return Check(NAMES[2], False, f"{r['label']}: {r['plan']} takes {mine.total:.3g} s per "
                     f"step, {slower:.0%} slower than the best plan that fits "
                     f"({best.total:.3g} s); the most of it is {part}: "
                     f"{getattr(mine, part):.3g} s against {getattr(best, part):.3g} s",
                     tensor=part, max_error=slower, hint=hint)
    worst = max(r["time"].total / r["best"].time.total - 1 for r in fitting) if fitting else 0
    return (_not_checked(NAMES[2], judged, fitting)
            or Check(NAMES[2], True, f"{len(judged)} runs, the slowest {worst:+.1%} "
                     "against the best"))
