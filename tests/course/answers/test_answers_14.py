"""Lesson 14: when a rank dies. Every question checked, each from first principles: Young's
interval found by searching the first-order cost for its minimum, a rank's bytes by adding
up what each rank of one tp block writes, and the asynchronous stall by playing the saves'
timeline event by event."""

import math

from answers_common import asked, close

NOT_CHECKED = set()


def test_14_young_is_the_minimum_of_the_lost_time():
    for _, p, right in asked("14.young"):
        save = p["gpus"] * p["gb"] * 1e9 / (p["tbps"] * 1e12)  # every GPU through the storage
        mtbf = p["gpu_mtbf_kh"] * 1000 * 3600 / p["gpus"]  # any GPU stops the job
        lo, hi = 1.0, 100 * mtbf
        for _ in range(300):  # golden section on C/τ + τ/2M
            a, b = hi - 0.618034 * (hi - lo), lo + 0.618034 * (hi - lo)
            if save / a + a / (2 * mtbf) < save / b + b / (2 * mtbf):
                hi = b
            else:
                lo = a
        assert math.isclose(right, (lo + hi) / 2 / 60, rel_tol=1e-5), p


def test_14_zero1_writes_adds_up_to_one_block():
    for _, p, right in asked("14.zero1-writes"):
        block = p["billions"] * 10**9 // p["t"]
        written = [(4 * block if d == 0 else 0) + 8 * block / p["d"] for d in range(p["d"])]
        assert math.isclose(sum(written), 12 * block)  # every byte once over the dp ranks
        assert close(right, written[p["dp_rank"]] / 1e9), p


def test_14_zero1_writes_worked_answer_says_what_the_rule_costs_beside_dcp():
    # the lowest-holder rule loads dp rank 0 with every weight (70B, t 4, d 16: 78.75 GB
    # against 8.75); PyTorch DCP's dedup balances replicated tensors across the holders
    for q, p, _ in asked("14.zero1-writes"):
        block, d, worked = p["billions"] * 10**9 // p["t"], p["d"], q.worked(p)
        first, other = (4 * block + 8 * block / d) / 1e9, 8 * block / d / 1e9
        assert f"dp rank 0 writes {first:.2f} GB, every other dp rank {other:.2f} GB " \
            f"({first / other:.0f}×)" in worked, worked
        assert f"= {12 * block / d / 1e9:.2f} GB each" in worked, worked
        assert "torch/distributed/checkpoint/_dedup_save_plans.py" in worked

def _steady_stall(T, N, h, w, saves=40):
    """Play the run: N steps, a save's copy (h, blocking) after waiting for the previous
    write, that write (w) in the background; the stall of the last save."""
    clock, write_done, stall = 0.0, 0.0, 0.0
    for _ in range(saves):
        clock += N * T
        start = max(clock, write_done)  # the copy waits for the previous write
        stall = start + h - clock
        clock = start + h
        write_done = clock + w
    return stall


def test_14_async_stall_is_the_timelines():
    for _, p, right in asked("14.async-stall"):
        T, N, h, w = p["T"], p["N"], p["h"], p["w_over"] * p["N"] * p["T"]
        stall = _steady_stall(T, N, h, w)
        options = {"a": h + w, "b": h, "c": h + (w - N * T), "d": 0.0}
        assert math.isclose(options[right], stall, rel_tol=1e-9), (p, stall)
