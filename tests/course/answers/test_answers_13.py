"""Lesson 13: data parallelism. Every question checked."""

from answers_common import asked, close

NOT_CHECKED = set()


def test_12_data_parallel():
    for _, p, right in asked("13.token-weight"):
        per_rank = p["rows"] * 1024
        assert close(right, (per_rank - p["ignored"]) / (p["d"] * per_rank - p["ignored"]))
    for _, p, right in asked("13.zero1-bytes"):
        psi = p["billions"] * 10**9  # ZeRO stage 1: 2 + 2 bytes whole, 12 sharded over d
        assert close(right, (4 * psi + 12 * psi / p["d"]) / 10**9)


def _wait_after_backward(k, T_ms, grad_bytes, alpha_s, bytes_per_s):
    """Play the buckets' timeline event by event: bucket i is complete at i·T/k, its
    all-reduce starts when it is complete and the previous one has finished."""
    done = 0.0
    for i in range(1, k + 1):
        start = max(i * T_ms / 1e3 / k, done)
        done = start + alpha_s + grad_bytes / k / bytes_per_s
    return done - T_ms / 1e3


def test_12_when_to_send_is_the_bucket_count_that_waits_least():
    counts = (1, 8, 64, 512)
    for _, p, right in asked("13.when-to-send"):
        waits = [_wait_after_backward(k, p["T"], p["mib"] * 2**20, p["alpha_us"] * 1e-6,
                                      p["gbs"] * 1e9) for k in counts]
        assert right == "abcd"[waits.index(min(waits))], (p, waits)
