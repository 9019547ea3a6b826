"""Checks for ex22: Muon's owner strategy, its assignment and its exchange.

One launch of 4 ranks (dp = 4), float64. The reference is Newton–Schulz of each whole
matrix summed over the ranks, cut into each rank's rows, never the exercise's code:

* (a) `lpt_owners` on five cost lists (ties, more ranks than matrices): a map of valid
  ranks whose busiest rank carries no more work than longest-processing-time-first's.
  Named: an unbalanced owner map (round robin, everything on one rank), a map whose
  length or ranks are wrong;
* (b) `owner_update` with the grader's owner map, so it is judged alone: each rank's rows
  of every matrix against one device's; named: a partial gradient orthogonalised (the
  home's own `local`, not summed over dp), the home's gradient with only its rows summed
  (DeepSpeed PR #8090), a shard orthogonalised (each rank its own rows alone); then the
  work: exactly two all-to-alls and no other collective, each matrix orthogonalised once,
  on its home (every rank doing every matrix is gather's work, not owner's);
* (c) the learner's (a) and (b) together: equal to one device, and the busiest rank's
  Newton–Schulz FLOPs under the learner's map beside LPT's.

The run on the ranks is ex22_rank.py; this module judges what it found.
"""

from __future__ import annotations

from types import SimpleNamespace

from ...calc.footprint.muon import lpt_owners, ns_flops
from ...runtime.launch import launch
from .base import Check, judge_parts, kept_failure, run_per_size
from .ex22_rank import COSTS, DP, SHAPES, _in_rank

TIMEOUT = 60.0
TOLERANCE = 1e-10
NAMES = ["(a) lpt_owners: each matrix's home, the busiest rank's work no more than LPT's",
         "(b) owner_update: one all-to-all in, one Newton–Schulz per matrix on its home, one "
         "all-to-all back; every rank's rows equal one device's",
         "(c) your (a) and (b) together on dp = 4: equal to one device, the work balanced"]
HINT_B = ("send each of your rows (mine[j], summed) to matrix j's home; the home stacks the "
          "four ranks' rows into the whole summed matrix, orthogonalises it once, and sends "
          "each rank its rows back")
MISTAKES = {
    "partial": "its home orthogonalised its own gradient (`local`), not summed over dp: a "
               "partial gradient orthogonalised",
    "patchwork": "its home orthogonalised its own gradient with only its own rows summed "
                 "(DeepSpeed PR #8090: after ZeRO's reduce-scatter only a rank's slice is "
                 "summed)",
    "shard": "each rank orthogonalised its own rows alone: a shard orthogonalised (Newton–Schulz "
             "of a slice is not the slice of Newton–Schulz)"}


def run(module) -> list[Check]:
    fns = SimpleNamespace(lpt_owners=module.lpt_owners, owner_update=module.owner_update)
    return run_per_size((DP,), lambda n: list(NAMES),
                        lambda n: launch(_in_rank, n, fns, timeout=TIMEOUT), _judge,
                        what="the owner strategy", size="dp")


def _judge(n, names, per_rank) -> list[Check]:
    return judge_parts(names, (_judge_a, _judge_b, _judge_c), per_rank)


def makespan(costs, owners, ranks) -> int:
    """The busiest rank's work under `owners`."""
    load = [0] * ranks
    for cost, home in zip(costs, owners, strict=True):
        load[home] += cost
    return max(load)


def _judge_a(record):
    if isinstance(record["a"], dict):
        return kept_failure("lpt_owners", record["a"]["raised"], "longest processing time first")
    for (costs, ranks), got in zip(COSTS, record["a"], strict=True):
        where = f"costs {costs} over {ranks} ranks"
        if (not isinstance(got, list) or len(got) != len(costs)
                or not all(isinstance(o, int) and 0 <= o < ranks for o in got)):
            return False, f"{where}: got {got!r}, not one rank in 0..{ranks - 1} per matrix", \
                "owners[j] is the rank of matrix j"
        mine, best = makespan(costs, got, ranks), makespan(costs, lpt_owners(costs, ranks),
                                                           ranks)
        if mine > best:
            kind = ("round robin (j mod ranks) " if got == [j % ranks for j in range(len(costs))]
                    else "")
            return False, f"{where}: an unbalanced owner map {kind}— its busiest rank " \
                f"carries {mine} where longest processing time first gives {best}: the step " \
                "waits for the busiest rank", "largest first, each to the least-loaded rank"
    return True, "on 5 cost lists, the busiest rank no busier than LPT's", ""


def _judge_update(run_, owners, label):
    if "raised" in run_:
        return kept_failure("owner_update", run_["raised"], HINT_B)
    errors = run_["errors"]
    for j, error in enumerate(errors["right"]):
        if error <= TOLERANCE:
            continue
        what = f"{label}matrix {j} {SHAPES[j]} (home: rank {owners[j]})"
        said = next((says for key, says in MISTAKES.items() if errors[key][j] <= TOLERANCE),
                    f"off by {error:.3g} from one device's")
        return False, f"{what}: {said}", HINT_B
    homed = sorted(SHAPES[j] for j, home in enumerate(owners) if home == run_["rank"])
    ops = run_["ops"]
    if ops.count("all_to_all") != 2 or set(ops) != {"all_to_all"}:
        ran = ", ".join(f"{ops.count(op)} {op}" for op in dict.fromkeys(ops)) or "none"
        gather = (" — gather's pattern: every rank gathers every matrix and orthogonalises it, "
                  "the work repeated on every rank" if "all_to_all" not in ops
                  and "all_gather" in ops else "")
        return False, f"{label}collectives: {ran}{gather}; the owner strategy sends one " \
            "all-to-all in and one back, nothing else", HINT_B
    if sorted(run_["calls"]) != homed:
        every = " (every matrix on every rank: gather's work)" if len(run_["calls"]) == len(
            SHAPES) else ""
        return False, f"{label}newton_schulz ran on shapes {sorted(run_['calls'])}; this " \
            f"rank's matrices are {homed}{every}", \
            "orthogonalise each matrix once, on its home, with the given newton_schulz"
    return True, "", ""


def _judge_b(record):
    run_ = dict(record["b"], rank=record.get("rank", 0))
    passed, detail, hint = _judge_update(run_, record["b"]["owners"], "")
    return passed, detail or "2 all-to-alls, each matrix orthogonalised once on its home, " \
        "every rank's rows as one device's", hint


def _judge_c(record):
    run_ = dict(record["c"], rank=record.get("rank", 0))
    owners = record["c"]["owners"]
    if "raised" in run_ and run_["raised"][0] == "blank" and owners is None:
        return False, "not checked: lpt_owners gave no map of the 4 ranks", "write (a) first"
    passed, detail, hint = _judge_update(run_, owners, "with your map: ")
    if not passed:
        return passed, detail, hint
    costs = [ns_flops(r, c) for r, c in SHAPES]
    mine, best = makespan(costs, owners, DP), makespan(costs, lpt_owners(costs, DP), DP)
    if mine > best:
        return False, f"equal to one device, but unbalanced: the busiest rank ran {mine:,} " \
            f"Newton–Schulz FLOPs where LPT's map gives {best:,}", "see (a)"
    return True, f"equal to one device; the busiest rank ran {mine:,} of {sum(costs):,} " \
        "FLOPs (gather: every rank all of them)", ""
