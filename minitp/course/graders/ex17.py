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
* was reasoned, not searched: neither `calc.plan` nor `calc.search.every_configuration`
  runs, and `calc.memory_per_gpu` and `calc.step_time` together run at most
  `CALLS_PER_RUN` times per run. The reference makes at most 3 (one step_time, two
  memory checks); a search makes one or two per configuration, dozens to hundreds
  per run. Calls are counted by the functions' code objects (`sys.setprofile`), so
  every call is seen however the learner imported the function.

No process is launched: the grader is the calculator (well under a second).
"""

from __future__ import annotations

import sys
from collections import Counter

from ... import calc
from ...calc import search
from ...calc.cluster import GiB
from ...model import GPTConfig
from ...rules import check_parallel_config
from .base import Check, crashed, not_written

TOLERANCE = 0.10
MEMORY_TOLERANCE = 0.02  # relative: the calculator is exact; 2% lets a careful hand sum pass
BUBBLE_TOLERANCE = 1e-3  # relative: (p - 1)/m is exact arithmetic
CALLS_PER_RUN = 3
KEYS = ("dp", "pp", "tp", "recompute", "zero_stage")
WHY = ("memory_gib", "shallower_gib", "tp_stop", "bubble")
STOPS = {"node": "2·tp GPUs would span two nodes",
         "heads": "2·tp does not divide the heads",
         "cost": "2·tp was possible: it stopped for its cost, not a limit"}
NAMES = ["every plan is a valid split of the GPUs, the model and the batch",
         "every plan fits under its memory cap (calc.memory_per_gpu)",
         f"every plan's step time within {TOLERANCE:.0%} of the best calc.plan finds",
         f"why: the plan's memory and the shallower pipeline's, within {MEMORY_TOLERANCE:.0%}",
         "why: where tp stops (node, heads or cost) and the bubble (p - 1)/m",
         f"reasoned, not searched: no planner, at most {CALLS_PER_RUN} calculator calls a run"]
SHORTCUT = ("the point is to reason: the rules of lesson 17 give a plan, and a few calls of "
            "calc.memory_per_gpu and calc.step_time check it; the planner's answer is no reason")
SEARCH = ("a loop over the configurations that asks the calculator about each one is the "
          "planner again. Decide t, p, recompute and ZeRO with the rules (one GPU's worth "
          "first; tp up to a node; the shallowest pipeline that fits; ZeRO-1 is free; "
          "tp's all-reduces against the bubble), then check the plan")


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
    ("GPT 43B (60 heads) on 128 A100s, batch 512, 40 GiB", _gpt(7680, 60, 60), calc.A100_80GB,
     128, 512, 40),
)
_PLANS = {}  # label -> calc.plan's answer: the same every time, and calc.plan is the slow part

PART_HINTS = {
    "compute": "recomputation repeats forward work: spend it only where memory demands it, "
               "and on the cheapest kind that fits.",
    "tp": "tensor parallelism all-reduces in every layer, and a GPU's share of them does not "
          "shrink as tp grows: is your tp larger than this model needs, or than a faster GPU "
          "can hide (halve tp, double pp, and weigh the bubble)?",
    "pp": "every pipeline boundary sends each microbatch's activations, both ways.",
    "dp": "the gradient reduction grows with the parameters a stage holds and with the links "
          "its group spans; ZeRO 2 and 3 repeat it every microbatch.",
    "bubble": "the bubble is (p - 1)/m of a stage's busy time: deep pipelines with few "
              "microbatches per replica idle.",
}


class _Watch:
    """Counts, while the learner's code runs, the calls of the calculator's functions by
    their code objects (a profile hook): however the learner imported a function
    (``from minitp.calc import plan`` binds it before any patch could catch it), its
    code is the same object. ``runs`` holds one Counter per run."""

    WATCHED = {calc.plan.__code__: "calc.plan",
               search.every_configuration.__code__: "calc.search.every_configuration",
               calc.memory_per_gpu.__code__: "calc.memory_per_gpu",
               calc.step_time.__code__: "calc.step_time"}

    def __init__(self):
        self.runs: list[Counter] = []

    def new_run(self) -> None:
        self.runs.append(Counter())

    def _hook(self, frame, event, arg):
        if event == "call" and frame.f_code in self.WATCHED:
            self.runs[-1][self.WATCHED[frame.f_code]] += 1

    def __enter__(self):
        self._before = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._before)


def run(module) -> list[Check]:
    answers = []
    with _Watch() as watch:  # only the learner's code runs inside: the reference comes after
        for label, cfg, cluster, n_gpus, batch, cap in CASES:
            watch.new_run()
            try:
                answers.append(module.choose_plan(cfg, cluster, n_gpus, batch, cap * GiB))
            except NotImplementedError as exc:
                return not_written(NAMES, "choose_plan", str(exc))
            except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
                return crashed(NAMES, label, exc, "return a dict with the keys "
                               + ", ".join(KEYS) + " and why")
    judged = [_judge(case, plan) for case, plan in zip(CASES, answers, strict=True)]
    return [_valid(judged), _fits(judged), _fast(judged), _memory_why(judged),
            _stop_and_bubble(judged), _reasoned(watch.runs)]


def _reference(label, cfg, cluster, n_gpus, batch, cap):
    if label not in _PLANS:
        _PLANS[label] = calc.plan(cfg, cluster, batch, n_gpus, micro_batches=(1,),
                                  zero_stage=(0, 1, 2, 3), usable=cap * GiB / cluster.memory)
    return _PLANS[label]


def _describe(plan: dict) -> str:
    return " ".join(f"{key}={plan[key]}" for key in KEYS)


def _memory(cfg, n_gpus, batch, tp, pp, recompute, zero) -> dict:
    dp = n_gpus // (tp * pp)
    return calc.memory_per_gpu(cfg, 1, dp, pp, tp, tp > 1, recompute, zero, "megatron",
                               microbatches=batch // dp)


def _depths(cfg, n_gpus, tp, batch) -> list[int]:
    return [p for p in range(1, n_gpus // tp + 1) if cfg.n_layer % p == 0
            and n_gpus % (tp * p) == 0 and batch % (n_gpus // (tp * p)) == 0]


def _judge(case, plan) -> dict:
    """What the calculator says of one plan: why it is not valid, or its memory and time,
    and what its justification should say."""
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
    result["memory"] = _memory(cfg, n_gpus, batch, tp, pp, recompute, zero)
    result["time"] = calc.step_time(cfg, cluster, dp, pp, tp, 1, batch, sp, recompute,
                                    zero_stage=zero)
    result["zero"], result["pp"] = zero, pp
    reference = _reference(*case)
    result["best"] = reference.best
    result["needs zero"] = not any(  # no plan without ZeRO is fast enough: say so if slow
        c.zero_stage == 0 and c.time.total <= (1 + TOLERANCE) * reference.best.time.total
        for c in reference.candidates)
    if zero == 0 and dp > 1:  # what the same plan needs with the distributed optimizer
        result["with zero 1"] = _memory(cfg, n_gpus, batch, tp, pp, recompute, 1)["total"]
    result["why"] = plan.get("why")
    result["expected"] = _expected(case, plan)
    return result


def _expected(case, plan) -> dict:
    """The justification the calculator gives for this plan, and the usual slips."""
    label, cfg, cluster, n_gpus, batch, cap = case
    dp, pp, tp, recompute, zero = (plan[k] for k in KEYS)
    memory = _memory(cfg, n_gpus, batch, tp, pp, recompute, zero)
    shallower = [q for q in _depths(cfg, n_gpus, tp, batch) if q < pp]
    twice, m = 2 * tp, batch // dp
    stop = ("node" if twice > cluster.gpus_per_node
            else "heads" if cfg.n_head % twice else "cost")
    expected = {
        "memory_gib": memory["total"] / GiB,
        "memory slips": {
            "in GB (10^9 bytes), not GiB (2^30)": memory["total"] / 1e9,
            "in bytes, not GiB": memory["total"],
            "the model states alone, without the activations":
                (memory["total"] - memory["activations"]) / GiB,
            "the activations alone, without the model states": memory["activations"] / GiB,
        },
        "shallower": shallower[-1] if shallower else None,
        "shallower_gib": None,
        "shallower slips": {},
        "tp_stop": stop,
        "stop reason": (f"2·tp = {twice} GPUs, a node has {cluster.gpus_per_node}" if
                        stop == "node" else f"{cfg.n_head} heads do not divide by {twice}"
                        if stop == "heads" else f"{twice} GPUs fit in a node of "
                        f"{cluster.gpus_per_node} and divide the {cfg.n_head} heads"),
        "bubble": calc.bubble(pp, m),
        "bubble slips": {
            "(p - 1)/(m + p - 1), the bubble's share of the whole step; the fraction asked "
            "is of the busy time, (p - 1)/m": (pp - 1) / (m + pp - 1),
            f"m taken as the global batch {batch}; each replica runs m = {batch}/{dp} = "
            f"{m} microbatches": (pp - 1) / batch,
            "p/m: the bubble is (p - 1)/m, the first stage idles while p - 1 others fill":
                pp / m,
        },
    }
    if zero:
        expected["memory slips"][f"the plan without ZeRO-{zero} (18 bytes per parameter)"] = (
            _memory(cfg, n_gpus, batch, tp, pp, recompute, 0)["total"] / GiB)
    if shallower:
        q = shallower[-1]
        expected["shallower_gib"] = _memory(cfg, n_gpus, batch, tp, q, recompute,
                                            zero)["total"] / GiB
        slips = expected["shallower slips"]
        for rc in ("selective", "full", None):
            for z in range(4):
                if (rc, z) != (recompute, zero):
                    slips[f"pp={q} with recompute={rc} and ZeRO-{z}; keep the plan's "
                          f"recompute={recompute} and ZeRO-{zero}"] = _memory(
                        cfg, n_gpus, batch, tp, q, rc, z)["total"] / GiB
        deeper = [d for d in _depths(cfg, n_gpus, tp, batch) if d > pp]
        if deeper:
            slips[f"the deeper pipeline pp={deeper[0]}, not the shallower pp={q}"] = _memory(
                cfg, n_gpus, batch, tp, deeper[0], recompute, zero)["total"] / GiB
    return expected


def _close(value, target, tolerance) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value - target) <= tolerance * max(abs(target), 1e-12)


def _slip(value, slips: dict, tolerance) -> str:
    """The name of the usual mistake that ``value`` matches, or ''."""
    return next((name for name, number in slips.items() if _close(value, number, tolerance)),
                "")


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
        hint = ("model states shrink with pp and tp (and with ZeRO, over dp); activations "
                "with tp (sequence parallel) and recomputation")
        if r.get("with zero 1", float("inf")) <= r["cap"] * GiB:
            hint = (f"with ZeRO-1 (the distributed optimizer: 6 + 12/dp bytes per parameter) "
                    f"the same plan needs {r['with zero 1'] / GiB:.1f} GiB, and costs the "
                    "same time in this model")
        return Check(NAMES[1], False, f"{r['label']}: {r['plan']} needs "
                     f"{memory['total'] / GiB:.1f} GiB on its busiest GPU (model states "
                     f"{states / GiB:.1f}, activations {memory['activations'] / GiB:.1f}), over "
                     f"the {r['cap']} GiB cap", tensor="memory",
                     max_error=memory["total"] / (r["cap"] * GiB) - 1, hint=hint)
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


def _why_of(r) -> tuple[dict | None, str]:
    """The learner's justification of a valid plan, or why there is none to check."""
    why = r["why"]
    if not isinstance(why, dict):
        return None, f"{r['label']}: the plan has no \"why\" (got {why!r})"
    missing = [k for k in WHY if k not in why]
    if missing:
        return None, f"{r['label']}: \"why\" lacks {', '.join(missing)}"
    return why, ""


def _memory_why(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    hint = ("the busiest GPU in GiB (2^30 bytes): calc.memory_per_gpu(...)['total'] / 2**30, "
            "model states and activations together; the shallower plan keeps tp, recompute "
            "and the ZeRO stage and takes the next valid depth below pp")
    for r in valid:
        why, problem = _why_of(r)
        if problem:
            return Check(NAMES[3], False, problem, tensor="why", hint=hint)
        e = r["expected"]
        given = why["memory_gib"]
        if not _close(given, e["memory_gib"], MEMORY_TOLERANCE):
            slip = _slip(given, e["memory slips"], MEMORY_TOLERANCE)
            return Check(NAMES[3], False, f"{r['label']}: memory_gib is {_shown(given)}, but "
                         f"calc.memory_per_gpu gives {r['plan']} {e['memory_gib']:.2f} GiB"
                         + (f": {_shown(given)} is {slip}" if slip else ""), tensor="memory_gib",
                         max_error=_error(given, e["memory_gib"]), hint=hint)
        given, target = why["shallower_gib"], e["shallower_gib"]
        if target is None and given is not None:
            return Check(NAMES[3], False, f"{r['label']}: shallower_gib is {_shown(given)}, but "
                         f"pp={r['pp']} is already the shallowest valid "
                         "depth at this tp: expected None", tensor="shallower_gib", hint=hint)
        if target is not None and not _close(given, target, MEMORY_TOLERANCE):
            slip = _slip(given, e["shallower slips"], MEMORY_TOLERANCE)
            detail = (f"{r['label']}: shallower_gib is {_shown(given)}, but the same plan at "
                      f"pp={e['shallower']}, the next valid depth below, needs "
                      f"{target:.2f} GiB ({'over' if target > r['cap'] else 'under'} the "
                      f"{r['cap']} GiB cap)")
            if slip:
                detail += f": {_shown(given)} is {slip}"
            return Check(NAMES[3], False, detail, tensor="shallower_gib",
                         max_error=_error(given, target), hint=hint)
    return (_not_checked(NAMES[3], judged, valid)
            or Check(NAMES[3], True, f"{len(judged)} runs"))


def _shown(value) -> str:
    """A learner's number as the report shows it: four figures, or as it came."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return repr(value)


def _error(given, target) -> float | None:
    if isinstance(given, bool) or not isinstance(given, int | float):
        return None
    return abs(given / target - 1) if target else None


def _stop_and_bubble(judged) -> Check:
    valid = [r for r in judged if "memory" in r]
    for r in valid:
        why, problem = _why_of(r)
        if problem:
            return Check(NAMES[4], False, problem, tensor="why",
                         hint="return the plan's keys and a \"why\" dict with "
                              + ", ".join(WHY))
        e = r["expected"]
        stop = why["tp_stop"]
        if stop != e["tp_stop"]:
            known = "" if stop in STOPS else f" (one of {', '.join(map(repr, STOPS))})"
            return Check(NAMES[4], False, f"{r['label']}: tp_stop is {stop!r}{known}, but for "
                         f"{r['plan']} it is {e['tp_stop']!r}: {e['stop reason']}",
                         tensor="tp_stop", hint="; ".join(f"{k!r}: {v}"
                                                          for k, v in STOPS.items()))
        given = why["bubble"]
        if not _close(given, e["bubble"], BUBBLE_TOLERANCE) and not (
                e["bubble"] == 0 and given == 0):
            slip = _slip(given, e["bubble slips"], BUBBLE_TOLERANCE)
            return Check(NAMES[4], False, f"{r['label']}: bubble is {_shown(given)}, but (p - 1)/m "
                         f"for {r['plan']} is {e['bubble']:.4f}"
                         + (f": {_shown(given)} is {slip}" if slip else ""), tensor="bubble",
                         max_error=_error(given, e["bubble"]),
                         hint="Narayanan et al. 2021, §2.2: the bubble is (p - 1)/m of the "
                              "ideal time, m = global_batch / dp microbatches per replica")
    return (_not_checked(NAMES[4], judged, valid)
            or Check(NAMES[4], True, f"{len(judged)} runs"))


def _reasoned(runs: list[Counter]) -> Check:
    planner = sorted({name for calls in runs for name in calls
                      if name in ("calc.plan", "calc.search.every_configuration")})
    if planner:
        return Check(NAMES[5], False, f"your code called {', '.join(planner)}", hint=SHORTCUT)
    counted = [sum(calls.values()) for calls in runs]
    worst = max(range(len(runs)), key=counted.__getitem__)
    if counted[worst] > CALLS_PER_RUN:
        calls = runs[worst]
        each = " and ".join(f"{name} {calls[name]} times" for name in
                            ("calc.memory_per_gpu", "calc.step_time") if calls[name])
        return Check(NAMES[5], False, f"{CASES[worst][0]}: your code called {each}, "
                     f"{counted[worst]} in all where {CALLS_PER_RUN} are allowed: that is a "
                     "search", tensor="calls", hint=SEARCH)
    return Check(NAMES[5], True, f"at most {max(counted)} calculator calls in a run")
