"""`flops_per_iteration`'s attention conventions: ``causal`` (Megatron-LM's halved core) and
``doc_lengths`` (packed documents, Σ Lᵢ² per row); the defaults are the papers' full s²."""

from __future__ import annotations

import pytest

import minitp as mt
import minitp.calc as calc

CFG = mt.GPTConfig(vocab_size=50, seq_len=12, n_layer=3, n_head=2, d_model=8)
CORE = {None: 12, "selective": 24, "full": 16}  # the printed equations' s²h coefficients


@pytest.mark.parametrize("recompute", list(CORE))
def test_causal_halves_exactly_the_core_term(recompute):
    B, s, h, L = 3, CFG.seq_len, CFG.d_model, CFG.n_layer
    full = calc.flops_per_iteration(CFG, B, recompute)
    half = calc.flops_per_iteration(CFG, B, recompute, causal=True)
    assert full - half == CORE[recompute] * B * L * s * s * h // 2


def test_packed_documents_count_the_sum_of_squares():
    B, s, h, L = 2, CFG.seq_len, CFG.d_model, CFG.n_layer
    full = calc.model_flops(CFG, B)
    packed = calc.model_flops(CFG, B, doc_lengths=[5, 4, 3])
    assert full - packed == 12 * B * L * h * (s * s - (25 + 16 + 9))
    # per row, and with the causal half on top
    rows = calc.model_flops(CFG, B, causal=True, doc_lengths=[[12], [6, 6]])
    assert full - rows == 12 * L * h * (2 * s * s - (s * s + 36 + 36) // 2)


def test_one_document_a_row_is_the_unpacked_count():
    assert calc.model_flops(CFG, 4, doc_lengths=[CFG.seq_len]) == calc.model_flops(CFG, 4)
    assert (calc.flops_per_iteration(CFG, 2, "full", True, [[12], [12]])
            == calc.flops_per_iteration(CFG, 2, "full", causal=True))


def test_causal_llama_flops_are_megatrons_identity():
    # Megatron-LM's num_floating_point_operations per token: 6 × the weight matrices'
    # parameters (q, k, v, o, the SwiGLU's three, the output layer) + 6·s·h·L.
    h, L, s, V, K, f = 64, 3, 32, 100, 2, 160
    cfg = mt.GPTConfig.llama(vocab_size=V, seq_len=s, n_layer=L, n_head=4, d_model=h,
                             n_kv_head=K, ffn_hidden=f)
    weights = L * (2 * h * h + 2 * K * (h // 4) * h + 3 * h * f) + h * V
    assert calc.model_flops(cfg, 5, causal=True) == 5 * s * (6 * weights + 6 * s * h * L)


@pytest.mark.parametrize("lengths, match", [([5, 5], "sum to seq_len=12"),
                                            ([12, 0], "positive"),
                                            ([[12]], "1 rows for global_batch=2")])
def test_bad_doc_lengths_are_refused(lengths, match):
    with pytest.raises(ValueError, match=match):
        calc.model_flops(CFG, 2, doc_lengths=lengths)


def test_step_time_computes_the_causal_half_when_asked():
    cluster, B = calc.H100_80GB, 4
    full = calc.step_time(CFG, cluster, micro_batch=B, efficiency=0.5)
    half = calc.step_time(CFG, cluster, micro_batch=B, efficiency=0.5, causal=True)
    saved = 12 * B * CFG.n_layer * CFG.seq_len ** 2 * CFG.d_model // 2
    assert full.compute - half.compute == pytest.approx(saved / (0.5 * cluster.peak_flops))
    assert full.tp == half.tp and full.dp == half.dp
