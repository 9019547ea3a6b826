"""Bytes per rank per step, measured by the kernel's counter: minitp's ZeRO-3, torch's
FSDP2 and HSDP 2×2 on 4 ranks (`minitp.torch_parallel.measure`), each against the
bytes its collectives must send (worked out here from the parameter counts), and the
state each keeps between steps. docs/torch-parallel.md explains each difference."""

import pytest

import minitp as mt
from minitp.runtime import io_counters
from minitp.torch_parallel.measure import measure_here

CFG = dict(vocab_size=256, seq_len=32, n_layer=2, n_head=4, d_model=64)


@pytest.mark.skipif(not io_counters.available(), reason="no /proc/self/io: bytes not measurable")
def test_bytes_and_kept_state_side_by_side():
    cfg = mt.GPTConfig(**CFG)
    params = mt.GPT(cfg).num_parameters()
    S, W = 4 * params, 4 * cfg.vocab_size * cfg.d_model  # float32 bytes: model, embedding
    # per rank: all-gather (n-1)/n·S forward and again backward; gloo's reduce-scatter
    # sends an all-reduce's 2(n-1)/n·S (DESIGN.md, "The collectives")
    fsdp = (0.75 + 0.75 + 1.5) * S
    hsdp = (0.5 + 0.5 + 1.0) * S + 2 * 0.5 * (S / 2)  # inside pairs; the half-shard across
    minitp = fsdp + (0.75 + 0.75 + 1.5) * W  # the tied embedding: a unit for each use
    run = mt.launch(measure_here, 4, cfg, 4, hsdp=2, batch=8, steps=2, timeout=120)
    for costs in run:
        by = {c.name: c for c in costs}
        ours, theirs, hybrid = by["minitp ZeRO-3"], by["torch FSDP2"], by["torch HSDP 2x2"]
        for cost, expected in ((ours, minitp), (theirs, fsdp), (hybrid, hsdp)):
            assert expected <= cost.sent <= 1.03 * expected, (cost, expected)  # + headers
        assert abs(ours.loss - theirs.loss) < 1e-5 and abs(hybrid.loss - theirs.loss) < 1e-5
        # Adam in float32: parameter, gradient, two moments, each 1/4 (HSDP: 1/2) a rank
        assert ours.kept == theirs.kept == pytest.approx(S, rel=0.01)
        assert hybrid.kept == pytest.approx(2 * S, rel=0.01)
