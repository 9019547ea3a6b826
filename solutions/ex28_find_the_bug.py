"""Exercise 28: find the bug in your broken run, and fix it.

Lesson 28 ran a broken run drawn from the bug museum (`mt.debug.museum`) by your name:
its loss beside one device's, its first divergence (or its hang), the trace of its
collectives. It did not say which bug it is. Here you say it, and how to fix it.

(a) `NAME`: the name you typed as the lesson's SEED. The grader draws your run from it,
    as the lesson did (the same name, the same bug).
(b) `diagnosis()`: the museum key of the bug in your run, one of
    ``mt.debug.museum.MUSEUM`` (e.g. "kv_replicas_not_summed"). Read the lesson's report
    in order: drift or hang; in the GPT's step or beside it; forward or backward; which
    module on which mesh; then match a symptom (``mt.debug.museum.MUSEUM[key].symptom``).
(c) `fix()`: the fix you would apply, one of ``mt.debug.museum.FIXES`` (each a setting
    or a few lines, in words; the list is sorted, so its order says nothing).

Grade it with `mt.grade("ex28")` in a notebook or `python -m minitp.course.grade ex28`:
the grader checks (b) against your run, then runs your run on 4 ranks with your fix
applied, and passes it if the run then equals one device (or, for a hang, completes).
"""

NAME = "learner"  # your name: the lesson's SEED


def diagnosis() -> str:
    # BEGIN SOLUTION
    # hint: a key of mt.debug.museum.MUSEUM: the lesson's report of your run, matched
    # hint: against each bug's symptom, mesh and setting
    # The lesson's run for "learner": a drift (no hang) in the GPT's step, a Llama-style GPT
    # at cp=4 on a packed batch; the loss departs at the step and the first divergence is
    # blocks.0.attn.rope's forward output: the rotation, under CP. Of the museum's two RoPE
    # bugs under CP, a packed batch brings its own positions (restarting at each document):
    # a row turned by positions not its own.
    return "packed_rope_under_cp"
    # END SOLUTION


def fix() -> str:
    # BEGIN SOLUTION
    # hint: one of mt.debug.museum.FIXES, copied as it is
    return ("rotate each row by its own positions (restarting at its documents), each cp "
            "rank's chunks of them")
    # END SOLUTION
