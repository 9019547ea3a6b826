"""Checks for ex28: find the bug in a broken run drawn from the museum, and fix it.

The learner's run is drawn from their `NAME` as lesson 28 draws it (`labs.find_the_bug.
yours`: the walked bug left out). Two checks:

* the diagnosis (in this process): `diagnosis()` must be that run's museum key. Nothing
  about the run is said before an answer; a wrong key is told only how the bug it names
  would show (drift or hang, its symptom), which the learner can set beside their report;
* the fix (on 4 ranks): the learner's run is run with `fix()` applied, one of
  `mt.debug.museum.FIXES`. A fix applies to the bug it was written for: the run's own fix
  makes it its fixed run, any other leaves it broken. It passes if the run then departs
  from one device by less than `EXACT` (or, for a hang, completes within the short
  timeout). A blank, or a fix not on the list, runs nothing.
"""

from __future__ import annotations

from ...debug import museum
from ..labs.find_the_bug import yours
from .base import Check, Stopped, attempt, file_lacks

EXACT = 1e-12  # float64's rounding of a few sums (the fixes land at 0 or near 3e-15)
NAMES = ["diagnosis: the museum key of the bug in your broken run",
         "fix: your run, with your fix applied on 4 ranks, equals one device"]


def run(module) -> list[Check]:
    missing = [n for n in ("NAME", "diagnosis", "fix") if not hasattr(module, n)]
    if missing:
        return file_lacks(NAMES, ", ".join(missing))
    try:
        key = yours(module.NAME)
    except ValueError as error:
        return [Check(n, False, str(error), hint="set NAME to the name you typed as the "
                      "lesson's SEED") for n in NAMES]
    return [_diagnosis(module, key), _fix(module, key)]


def _answer(function, name: str, hint: str):
    try:
        return attempt(function, names=[name], blank=function.__name__ + "()", label="()",
                       hint=hint), None
    except Stopped as stopped:
        return None, stopped.checks[0]


def _diagnosis(module, key: str) -> Check:
    said, stopped = _answer(module.diagnosis, NAMES[0], "return a key of "
                            "mt.debug.museum.MUSEUM")
    if stopped is not None:
        return stopped
    if said not in museum.MUSEUM:
        return Check(NAMES[0], False, f"{said!r} is not a museum key",
                     hint=f"one of: {', '.join(museum.MUSEUM)}")
    if said == key:
        bug = museum.MUSEUM[key]
        return Check(NAMES[0], True, f"{key}: {bug.citation}")
    named = museum.MUSEUM[said]
    looks = museum.MUSEUM[key].looks
    hint = (f"{said} {'hangs' if named.looks == 'hang' else 'drifts'}; your run "
            f"{'hangs' if looks == 'hang' else 'drifts'}" if named.looks != looks else
            f"{said} would show as: {named.symptom}; it breaks this: {named.setting}. Set "
            "that beside your run's report (its mesh, options, first divergence)")
    return Check(NAMES[0], False, f"{said} is not the bug in your run", hint=hint)


def _fix(module, key: str) -> Check:
    said, stopped = _answer(module.fix, NAMES[1], "return one of mt.debug.museum.FIXES")
    if stopped is not None:
        return stopped
    if said not in museum.FIXES:
        return Check(NAMES[1], False, f"{said!r} is not one of mt.debug.museum.FIXES",
                     hint="copy one of mt.debug.museum.FIXES as it is")
    visit = museum.reproduce(key, fixed=said == museum.MUSEUM[key].fix)[key]
    if visit.hung:
        return Check(NAMES[1], False, "with your fix, the run still hangs",
                     hint="a fix for a hang makes every rank call the same collectives")
    if not visit.departure < EXACT:
        return Check(NAMES[1], False, "with your fix, the run still departs from one "
                     f"device by {visit.departure:.1e}", max_error=visit.departure,
                     hint="that fix is for another bug: read your run's first divergence "
                          "again, and which setting produces it")
    if museum.MUSEUM[key].looks == "hang":
        return Check(NAMES[1], True, "your run completes on 4 ranks: every rank joined every "
                     "collective")
    return Check(NAMES[1], True, f"your run equals one device (within {EXACT:.0e}) on 4 ranks",
                 max_error=visit.departure)
