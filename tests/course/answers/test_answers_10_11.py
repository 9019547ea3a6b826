"""Lessons 10 and 11: pipelines.

Not checked (a reasoning, not a number the library computes): 11.clip-sync."""

from answers_common import asked, close

import minitp as mt

NOT_CHECKED = {"11.clip-sync"}


def test_10_and_11_pipelines():
    for _, p, right in asked("10.bubble"):
        assert close(right, (p["p"] - 1) / (p["v"] * p["m"]))  # Narayanan et al. 2021, §2.2.2
    for _, p, right in asked("10.in-flight"):
        assert close(right, min(p["p"] - p["r"], p["m"]) * p["gib"])  # 1F1B: p - r in flight
    for _, p, right in asked("10.halve-bubble"):
        assert right == "b"
        assert close(mt.calc.bubble(p["p"], p["m"], 2), mt.calc.bubble(p["p"], p["m"], 1) / 2)
    for _, p, right in asked("11.zb-h1-idle"):
        assert close(right, (p["p"] - 1) * (p["F"] + p["B"] - p["W"]))  # Qi et al. 2023, ZB-H1
    for _, p, right in asked("11.zb-h1-memory"):
        # ZB-H1 keeps 1F1B's bound (Qi et al. 2023): at most p microbatches, at least 1F1B's
        assert (p["p"] - p["r"]) * p["gib"] <= right <= p["p"] * p["gib"], p
