"""Lesson 22: an optimizer that needs the whole matrix. Each answer recomputed by the
arithmetic of what travels and what is kept, matrix by matrix and rank by rank, never by
the question's own formula (which is `mt.calc`'s).

Not checked: none."""

from answers_common import GiB, MiB, asked, close

import minitp as mt

NOT_CHECKED: set[str] = set()


def _gpt(h, layers):
    return [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)] * layers


def test_21_owner_bytes_counts_each_run_to_its_home_and_back():
    for _, p, right in asked("22.owner-bytes"):
        n, matrices = p["n"], _gpt(p["h"], p["l"])
        homes = mt.optim.lpt_owners([mt.optim.ns_flops(r, c) for r, c in matrices], n)
        sent = [0] * n  # values each GPU sends: its run of a matrix homed elsewhere goes
        for (r, c), home in zip(matrices, homes, strict=True):  # in; the home sends the
            run = r * c // n                                     # others' runs back
            for rank in range(n):
                sent[rank] += run if rank != home else (n - 1) * run
        assert close(right, sum(sent) / n * 2 / MiB), p


def test_21_state_bytes_is_one_momentum_a_matrix_value_two_moments_the_rest_sharded():
    for _, p, right in asked("22.state-bytes"):
        matrix, rest = 12 * p["l"] * p["h"] ** 2, p["v"] * p["h"]
        assert close(right, (4 * matrix + 2 * 4 * rest) / p["n"] / GiB), p


def _by_hand(p):
    """Each strategy's values per GPU (bf16 bytes ×2 left out: the order is the same),
    from what each collective carries on a ring / an all-to-all."""
    dp, tp, u, s = p["dp"], p["tp"], 1024, 1024 * p["k"]
    whole, block = 8 * u * s, 8 * u * s / tp  # the matrices; one tp rank's blocks of them
    over_tp = (tp - 1) / tp * whole            # gathering the blocks over tp
    over_dp = (dp - 1) / dp * block if p["zero"] else 0  # gathering the runs over dp
    found = {"gather": over_dp + over_tp,
             "owner": (2 * (dp - 1) / dp ** 2 * block if p["zero"] else (dp - 1) / dp * block)
             + over_tp / dp}
    if tp > 1:  # per matrix: the squared norm, then a u×u Gram all-reduce per iteration
        found["tp"] = over_dp + 8 * 2 * (tp - 1) / tp * (5 * u * u + 1)
    return found


def test_21_which_strategy_sends_the_fewest_bytes_counted_by_hand():
    letters, rights = {"gather": "a", "owner": "b", "tp": "c"}, set()
    for _, p, right in asked("22.which-strategy"):
        found = _by_hand(p)
        best = min(found, key=found.get)
        assert sorted(found.values())[1] > 1.2 * found[best], p  # no near-tie drawn
        assert right == letters[best], p
        rights.add(right)
    assert rights == {"a", "b", "c"}  # the 50 seeds draw every kind of answer
