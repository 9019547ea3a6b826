"""Lessons 11 and 12: pipelines.

Every question is checked: the bubble and the in-flight counts from `mt.calc` and the
schedules' own orders played on paper (`minitp.pipeline.simulate`), the zero-bubble ones
against Qi et al. 2024 (Table 2; §2.3 for what worker i of ZB-H1 holds); the two design
questions by playing every option's premise on paper; the uneven stages by trying every split.
Not checked: none."""

from answers_common import asked, close

import minitp as mt
from minitp.pipeline import SCHEDULES, simulate

NOT_CHECKED = set()


def _peak_bytes(order, before_b, before_w):
    """Walk one stage's order: a forward adds `before_b`, its B swaps that for `before_w`
    (or frees it, when the backward is whole), its W frees `before_w`; the most held."""
    split = {i for kind, _, i in order if kind == "W"}
    held = most = 0
    for kind, _, i in order:
        if kind == "F":
            held += before_b
        elif kind == "B":
            held += (before_w if i in split else 0) - before_b
        else:
            held -= before_w
        most = max(most, held)
    return most


def test_10_and_11_pipelines():
    for _, p, right in asked("11.bubble"):
        assert close(right, (p["p"] - 1) / (p["v"] * p["m"]))  # Narayanan et al. 2021, §2.2.2
    for _, p, right in asked("11.in-flight"):
        assert close(right, min(p["p"] - p["r"], p["m"]) * p["gib"])  # 1F1B: p - r in flight
    for _, p, right in asked("11.halve-bubble"):
        # (b): 1F1B over 2m microbatches of b/2 halves the bubble and fits the stage's room
        # (what it holds now); GPipe's halves too but does not fit; more stages do not halve
        assert right == "b"
        n, r, m, b, x = p["p"], p["r"], p["m"], p["b"], p["gib"]
        room = _peak_bytes(SCHEDULES["1f1b"](n, r, m), b * x, 0)
        for schedule in ("1f1b", "gpipe"):
            assert close(simulate(schedule, n, 2 * m)["bubble"], mt.calc.bubble(n, m) / 2)
        assert _peak_bytes(SCHEDULES["1f1b"](n, r, 2 * m), b // 2 * x, 0) <= room
        assert _peak_bytes(SCHEDULES["gpipe"](n, r, 2 * m), b // 2 * x, 0) > room
        assert simulate("1f1b", 2 * n, m)["bubble"] > mt.calc.bubble(n, m)
    for _, p, right in asked("12.zb-h1-idle"):
        assert close(right, (p["p"] - 1) * (p["F"] + p["B"] - p["W"]))  # Qi et al. 2024, Table 2
    for _, p, right in asked("12.zb-h1-memory"):
        i = p["r"] + 1  # Qi et al. 2024, §2.3: worker i of p (from 1) holds (p-i+1)M_B + (i-1)M_W
        assert close(right, (p["p"] - i + 1) * p["mb"] + (i - 1) * p["mw"])
        assert close(right, _peak_bytes(SCHEDULES["zb-h1"](p["p"], p["r"], p["m"]), p["mb"],
                                        p["mw"]))
    for _, p, right in asked("12.clip-sync"):
        # (c): with the norm's all-reduce every stage steps when the last one ends, so the
        # step is the whole played-out length; ZB-H2's is strictly the shortest
        assert right == "c"
        ticks = {name: simulate(name, p["p"], p["m"], costs={k: p[k] for k in "FBW"})["ticks"]
                 for name in ("1f1b", "zb-h1", "zb-h2")}
        assert ticks["zb-h2"] < ticks["zb-h1"] < ticks["1f1b"], (p, ticks)


def test_11_uneven_stages():
    for _, p, right in asked("11.uneven-stages"):
        # every split of the l layers over the 2 stages, the last also running the head's H
        # layers' worth: the one split whose slower stage is least, and it is the answer
        slower = {k: max(k, p["l"] - k + p["H"]) for k in range(p["l"] + 1)}
        assert [k for k, c in slower.items() if c == min(slower.values())] == [right], p
