"""Lesson 10: which context parallelism. Every answer is recomputed by counting what each
variant's collectives move (one rank's tensors, the hops of the ring, the (c-1)/c an
all-to-all or all-gather sends of a rank's share), and the heads limit from the rules
(`mt.check_parallel_config`), never by the question's own formula.

Not checked: none."""

from answers_common import MiB, asked, close

import minitp as mt

NOT_CHECKED: set[str] = set()


def _unit(s, c, d, heads):
    """Bytes of one head at one rank's s/c positions, bfloat16."""
    return s // c * (d // heads) * 2


def _a2a_sent(q_heads, kv_heads, c):
    """Heads' worth one rank sends through Ulysses' all-to-alls in one forward and backward:
    the four tensors each way (Q, K, V, O; dO, dQ, dK, dV), each all but its own 1/c."""
    tensors = [q_heads, kv_heads, kv_heads, q_heads] * 2
    return sum(t * (c - 1) / c for t in tensors)


def _kv_sent(kv_on_rank, c):
    """K/V heads the all-to-all carries: split as they are where c divides them, else
    one copy for each of the c ranks (the one its query heads read)."""
    return kv_on_rank if kv_on_rank % c == 0 else c


def _ring_sent(kv_heads, c):
    """Heads' worth one rank sends on the ring: K and V c-1 hops forward, c-1 again
    backward, and dK, dV c hops home."""
    return kv_heads * (2 * (c - 1) + 2 * (c - 1) + 2 * c)


def _allgather_sent(kv_heads, c, again=False):
    """K and V to the c-1 others forward; their gradients' reduce-scatter backward; with
    `again` (TransformerEngine's), K and V gathered a second time in backward first."""
    return kv_heads * (2 * (c - 1) + 2 * (c - 1) + (2 * (c - 1) if again else 0))


def _runs_a2a(heads, kv, tp, u):
    cfg = mt.GPTConfig(vocab_size=8, seq_len=4 * u, n_layer=1, n_head=heads,
                       d_model=heads * 2, n_kv_head=kv)
    try:
        mt.check_parallel_config(cfg, tp=tp, cp=u, cp_comm="a2a")
    except ValueError:
        return False
    return True


def test_09_a2a_bytes():
    for _, p, right in asked("10.a2a-bytes"):
        tp, c = p["tp"], p["c"]
        kv_on_rank = p["kv"] // tp if p["kv"] % tp == 0 else 1  # split over tp, or a copy
        assert kv_on_rank < c  # the question's point: the all-to-all copies them
        sent = _a2a_sent(p["heads"] // tp, _kv_sent(kv_on_rank, c), c)
        assert close(right, sent * _unit(p["s"], c, p["d"], p["heads"]) / MiB), p


def test_09_ring_over_a2a():
    for _, p, right in asked("10.ring-over-a2a"):
        c = p["c"]
        ring = _ring_sent(p["kv"], c)
        a2a = _a2a_sent(p["heads"], _kv_sent(p["kv"], c), c)
        assert close(right, ring / a2a), p


def test_09_ring_over_a2a_worked_answer_keeps_copied_kv_from_falling():
    # the all-to-all's bytes fall as 1/c only while c divides the K/V heads: copied K/V
    # (every draw here: c above the 8 K/V heads) stay c heads of s/c positions
    for q, p, _ in asked("10.ring-over-a2a"):
        worked, c = q.worked(p), p["c"]
        kv = _kv_sent(p["kv"], c)
        copied = p["kv"] % c != 0
        assert ("not its K and V" in worked) == copied, worked
        assert ("fall as 1/c: Q, O, K and V" in worked) == (not copied), worked
        if copied:
            share = 4 * kv * (c - 1) / c / _a2a_sent(p["heads"], kv, c)
            assert f"({share:.0%} of the all-to-alls' bytes here" in worked, worked

def _pick_sent(p):
    """Heads' worth each option sends: (b) is the all-gather as TransformerEngine runs it."""
    heads, kv, c = p["heads"], p["kv"], p["c"]  # no tensor parallelism
    sent = {"a": _ring_sent(kv, c), "b": _allgather_sent(kv, c, again=True)}
    if _runs_a2a(heads, kv, 1, c):
        sent["c"] = _a2a_sent(heads, _kv_sent(kv, c), c)
    u = c // 2
    if _runs_a2a(heads, kv, 1, u):  # the all-to-all over U, then a ring of c/U groups
        kv_u = _kv_sent(kv, u)
        # the ring's blocks: kv_u/U heads at U·s/c positions = kv_u heads' worth
        sent["d"] = _a2a_sent(heads, kv_u, u) + _ring_sent(kv_u, c // u)
    return sent


def test_09_pick_is_the_fewest_bytes_among_what_runs():
    for _, p, right in asked("10.pick"):
        sent = _pick_sent(p)
        best = min(sent.values())
        assert [k for k, v in sent.items() if v == best] == [right], (p, sent)
    answers = {right for _, _, right in asked("10.pick")}
    assert answers == {"b", "c"}, answers  # the numbers decide, not the question


def test_09_pick_worked_answer_says_when_the_kept_all_gather_flips_it():
    # minitp's all-gather that keeps K and V sends 2/3 of (b)'s: below every option for
    # some draws (Llama 3 70B at c = 8: 896 MiB against the all-to-all's 1,008)
    flipped = 0
    for q, p, right in asked("10.pick"):
        sent, worked = _pick_sent(p), q.worked(p)
        kept = _allgather_sent(p["kv"], p["c"])
        below = kept < min(sent.values())
        assert ("the answer flips" in worked) == (below and right != "b"), (p, worked)
        assert ("would send less still" in worked) == (below and right == "b"), (p, worked)
        assert f"({right}) sends least" in worked, worked
        flipped += below and right != "b"
    assert flipped, "no draw where the accounting decides"
