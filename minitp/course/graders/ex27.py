"""Checks for ex27: multi-head latent attention's tensor-parallel plan.

(a) and (b) are judged in this process against the library's own plan: the rule
`minitp.tensor_parallel.plan.TENSOR_PARALLEL_PLAN` gives each latent-attention module
(column-parallel, row-parallel, or none: replicated), and `minitp.model.mla.REPLICATED`,
which the plan tags ``grad_partial_over_tp``, the gradients summed over tp. Each usual
mistake is named: a down-projection or the rotary key's W^KR split, a latent's RMSNorm
split, an up-projection replicated or cut by rows, W^O not row-parallel; W^KR's sum left
out (torchtitan PR #1373's review), the down-projections' sums left out, a split module's
gradient summed.

(c) runs on 2 ranks (gloo, float64): the library's plan, with the learner's (b) deciding
which latent-attention gradients the step sums, one AdamW step at tp = 2 against one
device. A wrong (b) shows there as the parameter that departs, and the two ranks' copies
of W^KR drifting apart. `RANKS` off (the grader's tests) leaves the run out.
"""

from __future__ import annotations

from ...runtime.errors import LaunchError
from .base import Check, Stopped, attempt, failure_check, file_lacks

MODULES = ("q_down", "q_norm", "q_up", "kv_down", "kv_norm", "kv_up", "k_rope", "proj")
KINDS = ("column", "row", "replicated")
NAMES = ["(a) split_of: each projection column-, row-parallel or replicated, as the "
         "library's plan splits it",
         "(b) summed_over_tp: the gradients partial on each tp rank",
         "(c) your sums on 2 ranks: an AdamW step of a latent-attention GPT at tp = 2 equals "
         "one device's"]
TIMEOUT, TOLERANCE, WORLD = 90.0, 1e-10, 2
RANKS = True

# (module, the learner's kind) -> why it is wrong
SPLIT_SLIPS = {
    ("kv_down", "column"): "the down-projection split: every head's K and V are made from "
    "the WHOLE latent (kv_up reads all kv_lora_rank values), so no rank's heads could use "
    "1/tp of it without an all-gather a layer. It is small (DeepSeek-V3: 512 values a "
    "token against 128 heads' 2·128 each), so Megatron-LM and torchtitan keep it whole",
    ("q_down", "column"): "the query's down-projection split: every head's query is made "
    "from the whole query latent c_Q, so each rank needs all of it: keep it whole",
    ("k_rope", "column"): "the rotary key split: k^R is ONE key that every head "
    "concatenates to its own K, so every rank's heads need all rope_dim values of it",
    ("kv_norm", "column"): "a latent's RMSNorm split: it divides by the root mean square of "
    "ALL the latent's features, so it needs the whole latent, and its weight stays whole",
    ("kv_up", "replicated"): "the up-projection replicated: every rank would make every "
    "head's K and V, tp times the work, and attention would not be split at all. The heads "
    "are what tp splits: kv_up's output is head by head, so cut it by columns",
    ("kv_up", "row"): "a row split cuts the up-projection's INPUT, the latent, and leaves "
    "each rank a partial sum of every head's K and V (an all-reduce a layer); cut its "
    "output by heads instead: column",
    ("proj", "column"): "W^O reads the heads' outputs, which tp has split by heads: it is "
    "row-parallel, each rank multiplying its own heads' outputs, and g sums the partials",
}
SPLIT_SLIPS.update({("q_norm", "column"): SPLIT_SLIPS[("kv_norm", "column")],
                    ("q_up", "replicated"): SPLIT_SLIPS[("kv_up", "replicated")],
                    ("q_up", "row"): SPLIT_SLIPS[("kv_up", "row")],
                    ("proj", "replicated"): SPLIT_SLIPS[("proj", "column")]})
ROPE = ("W^KR's gradient not summed: k^R reaches every head directly, through no "
        "up-projection, so each rank's heads give back only their share of its gradient. "
        "Left partial, the copies on the tp ranks step apart (the bug torchtitan PR #1373's "
        "review found)")
DOWN = ("the up-projections read the replicated latents with no f of their own (the plan's "
        "one f is on the input h), so each rank's heads send back only their share of the "
        "latent's gradient: everything before it, the norm and the down-projection, gets a "
        "partial gradient, summed over tp")
SPLIT_SUMMED = ("a split module's gradient is whole for its own block (its heads' columns, "
                "or rows): summing over tp would add the OTHER ranks' blocks, gradients of "
                "other heads' weights")


def library_plan() -> tuple[dict, set]:
    """({module: kind}, {modules tagged partial}) read from the library's plan."""
    from ...sharding.plan import matches
    from ...tensor_parallel import plan
    from ...tensor_parallel.plan import TENSOR_PARALLEL_PLAN

    kind_of_rule = {plan._q: "column", plan._column: "column", plan._row: "row"}
    kinds = {}
    for module in MODULES:
        name = f"blocks.0.attn.{module}"
        rule = next((r for pattern, r in TENSOR_PARALLEL_PLAN if matches(name, pattern)), None)
        kinds[module] = kind_of_rule.get(rule, "replicated")
    return kinds, set(plan.REPLICATED)


def run(module) -> list[Check]:
    missing = [n for n in ("split_of", "summed_over_tp") if not hasattr(module, n)]
    if missing:
        return file_lacks(NAMES, ", ".join(missing))
    kinds, partial = library_plan()
    checks = []
    for judge in (_judge_split, _judge_sums):
        try:
            checks.append(judge(module, kinds, partial))
        except Stopped as stop:
            checks.append(Check(NAMES[len(checks)], False, stop.checks[0].detail,
                                hint=stop.checks[0].hint))
    summed = getattr(checks[1], "summed", None)
    if summed is None:
        return checks + [Check(NAMES[2], False, "not checked: (b) did not give a set of "
                               "module names")]
    if not RANKS:
        return checks + [Check(NAMES[2], checks[1].passed, "not run (the grader's tests)")]
    return checks + [_on_ranks(summed, partial)]


def _call(function, i):
    return attempt(function, names=NAMES[i:i + 1], blank=function.__name__,
                   label=f"{function.__name__}()", hint="see the exercise's docstring")


def _judge_split(module, kinds, partial) -> Check:
    got = _call(module.split_of, 0)
    if not isinstance(got, dict):
        return Check(NAMES[0], False, f"split_of() returned {type(got).__name__}",
                     hint="return a dict {module name: 'column', 'row' or 'replicated'}")
    for name in MODULES:
        mine, real = got.get(name), kinds[name]
        if mine not in KINDS:
            return Check(NAMES[0], False, f"{name}: {mine!r}",
                         hint=f"every name of MODULES needs one of {', '.join(KINDS)}")
        if mine != real:
            hint = SPLIT_SLIPS.get((name, mine), f"which dim of {name} holds whole heads?")
            return Check(NAMES[0], False, f"{name} as {mine}; the plan makes it {real}",
                         tensor=name, hint=hint)
    return Check(NAMES[0], True, "every module as the library's plan splits it: the "
                 "down-projections, their norms and W^KR whole, the up-projections by heads, "
                 "W^O by rows")


def _judge_sums(module, kinds, partial) -> Check:
    got = _call(module.summed_over_tp, 1)
    try:
        got = {str(name) for name in got}
    except TypeError:
        return Check(NAMES[1], False, f"summed_over_tp() returned {got!r}",
                     hint="return a set of module names")
    unknown = sorted(got - set(MODULES))
    if unknown:
        return Check(NAMES[1], False, f"{unknown} are not names of MODULES",
                     hint="name the modules as MODULES does")
    check = _sums_check(got, partial)
    check.summed = got  # for (c)
    return check


def _sums_check(got: set, partial: set) -> Check:
    if "k_rope" not in got:
        return Check(NAMES[1], False, "k_rope's gradient is left partial", tensor="k_rope",
                     hint=ROPE)
    left = sorted(partial - got)
    if left:
        return Check(NAMES[1], False, f"{', '.join(left)}: left partial", hint=DOWN)
    extra = sorted(got - partial)
    if extra:
        return Check(NAMES[1], False, f"{', '.join(extra)}: summed, though split",
                     hint=SPLIT_SUMMED)
    return Check(NAMES[1], True, "the replicated modules' gradients, and only theirs: "
                 f"{', '.join(sorted(partial))}")


def _on_ranks(summed: set, partial: set) -> Check:
    from ...runtime.launch import launch
    from .ex27_rank import in_rank

    try:
        per_rank = launch(in_rank, WORLD, sorted(summed), timeout=TIMEOUT)
    except LaunchError as error:
        return failure_check(NAMES[2], error, "the grader's run of your sums")
    for rank, found in enumerate(per_rank):
        gap, name = found["param_gap"]
        if found["loss_gap"] > TOLERANCE or gap > TOLERANCE:
            drift = (f"; the two ranks' copies of W^KR differ by {found['copies_apart']:.2g}"
                     if found["copies_apart"] > TOLERANCE else "")
            return Check(NAMES[2], False, f"after one step {name} differs from one device's by "
                         f"{gap:.2g}{drift}", rank=rank, tensor=name, max_error=gap,
                         hint=_sums_check(summed, partial).hint or "see (b)")
    return Check(NAMES[2], True, f"every loss and parameter within {TOLERANCE:g} of one "
                 "device's, W^KR's two copies identical")
