# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex28
# Made from solutions/ex28_find_the_bug.py by `python -m minitp.course.make_exercises`.
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
    # hint: a key of mt.debug.museum.MUSEUM: the lesson's report of your run, matched
    # hint: against each bug's symptom, mesh and setting
    raise NotImplementedError(
        "a key of mt.debug.museum.MUSEUM: the lesson's report of your run, matched against "
        "each bug's symptom, mesh and setting"
    )


def fix() -> str:
    # hint: one of mt.debug.museum.FIXES, copied as it is
    raise NotImplementedError(
        'one of mt.debug.museum.FIXES, copied as it is'
    )
