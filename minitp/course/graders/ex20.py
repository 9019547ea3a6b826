"""Checks for ex20: two numbers popular claims rest on, computed from first principles.

The learner's `model_states_gb(n_params, optimizer)` against
`calc.model_state_bytes(...)["total"]` in GB (10**9 bytes), for four model sizes
(GPT-3's 174.6B, its 43.68B per GPU at t = 4, 22B over 8 GPUs, 1.3B) in both
mixed-precision layouts ("adam-mixed", 16 bytes a parameter; "megatron", 18); and
`training_days(tokens, n_params, n_gpus, peak_flops, efficiency, recompute)` against
`calc.training_seconds` (Narayanan et al. 2021, Eq. 4: 8TP/(nX), with recomputation;
6/8 of it without) in days, for five runs with different GPUs, efficiencies and
recomputation:

* the GB equal, to 1e-9 relative;
* the days equal, to 1e-9 relative;
* built from first principles: neither function is called, nor `calc.OPTIMIZERS` read,
  while the learner's code runs.

A wrong answer is matched against the usual slips, each a factor on every case's right
answer (a missing fp32 row, 6·N·D where the run recomputes, the peak for the achieved
FLOP/s, GiB for GB, seconds for days, ...), one slip or two of different kinds, and the
hint names them. No process is launched: the grader is the calculator.
"""

from __future__ import annotations

import math
from itertools import combinations
from numbers import Real

from ... import calc
from ...calc.counts import flops as flops_module
from ...calc.footprint import memory as memory_module
from ...model import GPTConfig
from .base import Check

GB, DAY, RELATIVE = 10**9, 86400, 1e-9
NAMES = ["model states in GB equal calc.model_state_bytes's (16 and 18 bytes a parameter)",
         "training days equal calc.training_seconds's (8·N·D with recomputation, 6·N·D "
         "without)",
         "from first principles: calc.model_state_bytes, calc.OPTIMIZERS and "
         "calc.training_seconds not used"]
SHORTCUT = ("the point is to see where the number comes from: add up the bytes and count the "
            "FLOPs yourself")

GPT3 = GPTConfig(vocab_size=51200, seq_len=2048, n_layer=96, n_head=96, d_model=12288)
SIZES = (("GPT-3", calc.param_count(GPT3)),
         ("GPT-3 at t = 4, per GPU", calc.params_per_rank(GPT3, tp=4)),
         ("22B over 8 GPUs", 22 * 10**9 // 8), ("a 1.3B model", 1_300_000_000))
STATES = [(f"{name} ({n / 1e9:.2f}B parameters), {optimizer!r}", (n, optimizer))
          for name, n in SIZES for optimizer in ("adam-mixed", "megatron")]
A100, H100, V100 = (c.peak_flops for c in (calc.A100_80GB, calc.H100_80GB, calc.DGX2H_V100))
_RUNS = (  # (tokens, parameters, GPUs, peak FLOP/s, efficiency, recompute)
    (300e9, SIZES[0][1], 1024, A100, 140e12 / A100, True),
    (300e9, SIZES[0][1], 1024, A100, 0.45, False),
    (450e9, 10**12, 3072, A100, 0.52, True),
    (26e9, 1_300_000_000, 8, H100, 0.40, False),
    (100e9, 22 * 10**9, 64, V100, 0.30, True),
)
RUNS = [(f"{n / 1e9:.4g}B parameters, {t / 1e9:.0f}B tokens, {g} GPUs at {e:.0%} of "
         f"{p / 1e12:.0f} TFLOP/s, {'recomputing' if r else 'no recomputation'}",
         (t, n, g, p, e, r)) for t, n, g, p, e, r in _RUNS]


def _layout(adam_mixed: float, megatron: float):
    return lambda args: (adam_mixed / 16 if args[1] == "adam-mixed" else megatron / 18)


# The usual slips, in kinds: each is the factor it puts on a case's right answer. One slip,
# or two of different kinds, are recognised (their factors multiply).
STATE_SLIPS = [
    {"an fp32 row is missing, 4 bytes a parameter: Adam's master copy of the weights (what "
     "it updates), or one of its two moments": _layout(12, 14),
     "the gradients are counted in 16 bits under 'megatron', which accumulates them in "
     "fp32 (4 bytes)": _layout(16, 16),
     "the gradients are counted in fp32 under 'adam-mixed', which keeps them in 16 bits, as "
     "the weights": _layout(18, 18),
     "the gradients are missing: 2 bytes a parameter under 'adam-mixed', 4 under "
     "'megatron'": _layout(14, 14),
     "that is the 16-bit weights alone, 2 bytes a parameter: enough to run the model, not "
     "to train it": _layout(2, 2)},
    {"that is GiB (2**30 bytes); the claims, and this exercise, count GB (10**9 bytes)":
     lambda args: GB / 2**30,
     "that is bytes: divide by 10**9 for GB": lambda args: GB},
]
DAY_SLIPS = [
    {"6·N·D where the run recomputes: full recomputation runs the forward again, 8 FLOPs a "
     "parameter a token": lambda a: 6 / 8 if a[5] else 1,
     "8·N·D where the run does not recompute: forward 2 and backward 4 FLOPs a parameter a "
     "token make 6": lambda a: 1 if a[5] else 8 / 6,
     "2·N·D counts the forward only: the backward costs twice the forward": (
         lambda a: 2 / (8 if a[5] else 6))},
    {"the peak FLOP/s is not what a GPU achieves: multiply it by the efficiency":
     lambda a: a[4],
     "the efficiency divides the peak: the GPUs achieve efficiency × peak, less than peak":
     lambda a: a[4] ** 2},
    {"the GPUs share the work: divide by their number": lambda a: a[2]},
    {"that is seconds: a day has 86,400": lambda a: DAY,
     "that is hours: a day has 24": lambda a: 24},
]
HINTS = ["2 (16-bit weights) + 4 (fp32 master) + 4 + 4 (Adam's moments) + the gradients, "
         "bytes a parameter; a GB is 10**9 bytes",
         "FLOPs: (8 with recomputation, else 6) × parameters × tokens; divide by what the GPUs "
         "achieve together, n × efficiency × peak FLOP/s, then by 86,400 s a day"]


def _reference_states(args) -> float:
    n_params, optimizer = args
    return calc.model_state_bytes(n_params, optimizer=optimizer)["total"] / GB


def _reference_days(args) -> float:
    tokens, n_params, n_gpus, peak, efficiency, recompute = args
    seconds = calc.training_seconds(tokens, n_params, n_gpus, efficiency * peak)
    return seconds * (1 if recompute else 6 / 8) / DAY  # Eq. 4 is the 8-FLOP rule


class _Watch:
    """Records the calculator's answers being used while the learner's code runs: the two
    functions, wherever they were imported to (calc, its module, the learner's own file),
    and every read of a row of `calc.OPTIMIZERS` (its rows are swapped, in place, for
    tuples that record being read)."""

    FUNCTIONS = ((memory_module, "model_state_bytes"), (flops_module, "training_seconds"))

    def __init__(self, learner):
        self.learner, self.calls, self._undo = learner, [], []

    def _swap(self, namespace: dict, key, value):
        self._undo.append((namespace, key, namespace[key]))
        namespace[key] = value

    def __enter__(self):
        for module, name in self.FUNCTIONS:
            original = getattr(module, name)

            def recorded(*args, _f=original, _name=f"calc.{name}", **kwargs):
                self.calls.append(_name)
                return _f(*args, **kwargs)

            for namespace in (vars(calc), vars(module), vars(self.learner)):
                for key in [k for k, v in namespace.items() if v is original]:
                    self._swap(namespace, key, recorded)
        rows = memory_module.OPTIMIZERS
        if any(v is held for v in vars(self.learner).values()
               for held in (rows, *rows.values())):
            self.calls.append("calc.OPTIMIZERS")  # a row, or the table, held since import
        for key, row in list(rows.items()):
            self._swap(rows, key, _Row(row, self.calls))
        return self

    def __exit__(self, *exc):
        for namespace, key, value in reversed(self._undo):
            namespace[key] = value
        self._undo = []


class _Row(tuple):
    """A row of `calc.OPTIMIZERS` that records being read (indexed or iterated)."""

    def __new__(cls, row, calls):
        self = super().__new__(cls, row)
        self.calls = calls
        return self

    def __getitem__(self, index):
        self.calls.append("calc.OPTIMIZERS")
        return super().__getitem__(index)

    def __iter__(self):
        self.calls.append("calc.OPTIMIZERS")
        return super().__iter__()


def run(module) -> list[Check]:
    with _Watch(module) as watch:  # only the learner's code runs inside: the references after
        states = _ask(module.model_states_gb, STATES, NAMES[0], "GB")
        days = _ask(module.training_days, RUNS, NAMES[1], "days")
    checks = [_judge(states, STATES, _reference_states, NAMES[0], "GB", STATE_SLIPS, HINTS[0]),
              _judge(days, RUNS, _reference_days, NAMES[1], "days", DAY_SLIPS, HINTS[1])]
    if all(isinstance(a, Check) and "not written" in a.detail for a in (states, days)):
        return checks + [Check(NAMES[2], False, "not checked: nothing is written yet")]
    calls = sorted(set(watch.calls))
    if calls:
        return checks + [Check(NAMES[2], False, f"your code used {', '.join(calls)}",
                               hint=SHORTCUT)]
    return checks + [Check(NAMES[2], True, "no shortcut taken")]


def _ask(function, cases, name: str, unit: str):
    """The learner's answer for every case, or the failed check that says why there is none."""
    answers = []
    for label, args in cases:
        try:
            answer = function(*args)
        except NotImplementedError as exc:
            return Check(name, False, f"{function.__name__} is not written yet", hint=str(exc))
        except Exception as exc:  # noqa: BLE001 - the learner's bug, reported politely
            return Check(name, False, f"{label}: raised {type(exc).__name__}: {exc}",
                         hint=f"return one number, in {unit}")
        if not isinstance(answer, Real) or isinstance(answer, bool):
            return Check(name, False, f"{label}: returned {answer!r}",
                         hint=f"return one number, in {unit}")
        answers.append(float(answer))
    return answers


def _judge(answers, cases, reference, name: str, unit: str, slips, hint: str) -> Check:
    if isinstance(answers, Check):
        return answers
    expected = [reference(args) for _, args in cases]
    errors = [abs(got - want) / want for got, want in zip(answers, expected, strict=True)]
    if max(errors) <= RELATIVE:
        return Check(name, True, f"{len(cases)} cases")
    first = next(i for i, e in enumerate(errors) if e > RELATIVE)
    found = _slips([got / want for got, want in zip(answers, expected, strict=True)],
                   [args for _, args in cases], slips)
    if found:
        hint = ("every answer is what this slip gives: " if len(found) == 1 else
                "every answer is what these two slips give together: ") + "; and ".join(found)
    return Check(name, False, f"{cases[first][0]}: {answers[first]:.6g} {unit}, expected "
                 f"{expected[first]:.6g} {unit}", tensor=unit, max_error=max(errors),
                 hint=hint)


def _slips(ratios, cases, kinds) -> list[str] | None:
    """The slip (or two, of different kinds) whose factors turn every right answer into the
    learner's; None if no such one."""
    ones = [[slip] for kind in kinds for slip in kind.items()]
    twos = [[a, b] for k1, k2 in combinations(kinds, 2) for a in k1.items() for b in k2.items()]
    for found in ones + twos:
        if all(math.isclose(ratio, math.prod(f(args) for _, f in found), rel_tol=RELATIVE)
               for ratio, args in zip(ratios, cases, strict=True)):
            return [text for text, _ in found]
    return None
