"""Lesson 12: data parallelism.

Not checked (a reasoning, not a number the library computes): 12.when-to-send."""

from answers_common import asked, close

NOT_CHECKED = {"12.when-to-send"}


def test_12_data_parallel():
    for _, p, right in asked("12.token-weight"):
        per_rank = p["rows"] * 1024
        assert close(right, (per_rank - p["ignored"]) / (p["d"] * per_rank - p["ignored"]))
    for _, p, right in asked("12.zero1-bytes"):
        psi = p["billions"] * 10**9  # ZeRO stage 1: 2 + 2 bytes whole, 12 sharded over d
        assert close(right, (4 * psi + 12 * psi / p["d"]) / 10**9)
