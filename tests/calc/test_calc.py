"""minitp.calc against the literature, and against itself.

Published numbers are quoted with their source. Where a number is recalled
from a paper rather than derivable, the comment says so; every test compares
the calculator with something computed independently of it (the paper's
printed equation written out again, a published value, a simulation, or
torch's FLOP counter), so each can fail.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import minitp as mt
import minitp.calc as calc
from minitp.recompute import Recomputed


def gpt(h, a, L, V=51200, s=2048):
    return mt.GPTConfig(vocab_size=V, seq_len=s, n_layer=L, n_head=a, d_model=h)


# --------------------------------------------------------------------------- parameters
# Shoeybi et al. 2019 (Megatron-LM), Table 1: hidden size per head 96, vocabulary
# 50,257 padded to 51,200, sequence 1024. name -> (h, a, l), published billions.
# Computed (Eq. 2): 1.2135, 2.4904, 4.1991, 8.3170 billion; the paper rounds to
# one decimal. At that precision Eq. 2 and our exact count (+2h) agree; the bare
# 12lh² does not (1.13 -> "1.1" for the 1.2B model).
MEGATRON_LM = {(1536, 16, 40): 1.2, (1920, 20, 54): 2.5, (2304, 24, 64): 4.2, (3072, 32, 72): 8.3}

# Narayanan et al. 2021, Table 1: V = 51,200, s = 2048. (h, a, l) -> published billions.
NARAYANAN = {
    (2304, 24, 24): 1.7, (3072, 32, 30): 3.6, (4096, 32, 36): 7.5, (6144, 48, 40): 18.4,
    (8192, 64, 48): 39.1, (10240, 80, 60): 76.1, (12288, 96, 80): 145.6,
    (16384, 128, 96): 310.1, (20480, 128, 105): 529.6, (25600, 160, 128): 1008.0,
}


@pytest.mark.parametrize("shape, published", MEGATRON_LM.items())
def test_megatron_lm_table1(shape, published):
    cfg = gpt(*shape, s=1024)
    assert round(calc.param_count(cfg) / 1e9, 1) == published
    assert round(calc.exact_param_count(cfg) / 1e9, 1) == published


def test_megatron_lm_table1_needs_more_than_the_matrices():
    h, a, L = 1536, 16, 40
    assert round(12 * L * h * h / 1e9, 1) != MEGATRON_LM[(h, a, L)]  # so the test above bites


@pytest.mark.parametrize("shape, published", NARAYANAN.items())
def test_narayanan_table1(shape, published):
    assert round(calc.param_count(gpt(*shape)) / 1e9, 1) == published


def test_param_count_is_eq2_as_printed():
    for h, a, L in NARAYANAN:
        V, s = 51200, 2048
        printed = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
        assert calc.param_count(gpt(h, a, L)) == pytest.approx(printed, rel=1e-12)


@pytest.mark.parametrize("kw", [
    {}, {"vocab_size": 10, "seq_len": 7, "n_layer": 3, "n_head": 2, "d_model": 6},
    {"vocab_size": 97, "n_layer": 1, "n_head": 8, "d_model": 32},
    {"bias": False}, {"bias": False, "vocab_size": 11, "d_model": 24, "n_head": 3},
])
def test_exact_param_count_is_minitps_gpt(kw):
    cfg = mt.GPTConfig(**kw)
    assert calc.exact_param_count(cfg) == mt.GPT(cfg).num_parameters()
    if cfg.bias:
        assert calc.exact_param_count(cfg) == calc.param_count(cfg) + 2 * cfg.d_model


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_params_per_rank_match_the_tensor_parallel_shard(tp):
    # The count tensor_parallel/test_tensor_parallel.py measures on launched shards (CFG there).
    cfg = mt.GPTConfig(vocab_size=10, seq_len=16, n_layer=2, n_head=12, d_model=24)
    h, s, L = cfg.d_model, cfg.seq_len, cfg.n_layer
    padded = -(-10 // tp) * tp
    expected = L * ((12 * h * h + 7 * h) // tp + 6 * h) + padded * h // tp + s * h + 2 * h
    assert calc.params_per_rank(cfg, tp=tp) == expected


def test_params_per_rank_add_up_to_the_model():
    cfg = gpt(3072, 32, 72, s=1024)  # V = 51,200 divides by every t here
    whole = calc.exact_param_count(cfg)
    h, s, L, V = cfg.d_model, cfg.seq_len, cfg.n_layer, cfg.vocab_size
    for tp in (1, 2, 4, 8):
        replicated = L * 6 * h + s * h + 2 * h  # copies on every TP rank
        assert tp * calc.params_per_rank(cfg, tp=tp) - (tp - 1) * replicated == whole
        for pp in (2, 4, 8):
            stages = calc.params_per_stage(cfg, tp=tp, pp=pp)
            # the last stage's copy of the tied embedding is the only duplicate
            assert sum(stages) - V * h // tp == calc.params_per_rank(cfg, tp=tp)
            assert calc.params_per_rank(cfg, tp, pp) == max(stages) == stages[0]


def test_params_per_rank_pads_the_vocabulary():
    cfg = mt.GPTConfig(vocab_size=10, n_layer=4)
    h = cfg.d_model
    assert calc.padded_vocab(10, 4) == 12
    last = calc.params_per_stage(cfg, tp=4, pp=2)[-1]
    assert last == 2 * calc.layer_params_per_rank(cfg, 4) + 2 * h + 12 * h // 4


def test_params_per_rank_rejects_bad_splits():
    with pytest.raises(ValueError, match="not divisible by tp"):
        calc.params_per_rank(mt.GPTConfig(n_head=4), tp=3)
    with pytest.raises(ValueError, match="n_layer=4"):
        calc.params_per_rank(mt.GPTConfig(n_layer=4), pp=3)


# --------------------------------------------------------------------------- model states
GB = 1e9


def test_zero_7_5b_example():
    # Rajbhandari et al. 2020 (ZeRO), Fig. 1 / Table 1: Ψ = 7.5B, K = 12, N_d = 64.
    psi = 7.5e9
    gb = {s: calc.model_state_bytes(psi, dp=64, zero_stage=s)["total"] / GB for s in range(4)}
    assert gb[0] == 120  # 16Ψ
    assert round(gb[1], 1) == 31.4  # 4Ψ + 12Ψ/64
    assert round(gb[2], 1) == 16.6  # 2Ψ + 14Ψ/64
    assert round(gb[3], 1) == 1.9  # 16Ψ/64 (1.875)
    # Table 1, 1T parameters over 1024 GPUs, stage 3 (recalled: 15.6 GB)
    assert round(calc.model_state_bytes(1e12, 1024, 3)["total"] / GB, 1) == 15.6


def test_model_state_layouts():
    n = 1000
    assert calc.model_state_bytes(n)["total"] == 16 * n
    assert calc.model_state_bytes(n, optimizer="megatron")["total"] == 18 * n
    # Megatron-LM's distributed optimizer (its docs' table): 18 -> 6 + 12/d, 16 -> 8 + 8/d
    for d in (1, 2, 8, 64):
        assert calc.model_state_bytes(n, d, 1, "megatron")["total"] == pytest.approx(
            (6 + 12 / d) * n)
        assert calc.model_state_bytes(n, d, 1, "adam-fp32")["total"] == pytest.approx(
            (8 + 8 / d) * n)
    zero2 = calc.model_state_bytes(n, 4, 2)
    assert zero2 == {"parameters": 2 * n, "gradients": n / 2, "optimizer": 3 * n,
                     "total": 5.5 * n}
    with pytest.raises(ValueError, match="optimizer"):
        calc.model_state_bytes(n, optimizer="sgd")
    with pytest.raises(ValueError, match="zero_stage"):
        calc.model_state_bytes(n, zero_stage=4)


# --------------------------------------------------------------------------- activations
# Korthikanti et al. 2022, Table 3: (a, h, L) of their four models; s = 2048, t = 8.
KORTHIKANTI = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105),
               "1T": (160, 25600, 128)}
SETTINGS = {  # Table 2 row -> (sp, recompute) with t = 8
    "none": (False, None), "tp": (False, None), "tp+sp": (True, None),
    "tp+selective": (False, "selective"), "tp+sp+selective": (True, "selective"),
    "full": (False, "full"),
}


def table2(s, b, h, a, t):
    """Korthikanti et al. 2022, Table 2, written out again from the paper."""
    sbh = s * b * h
    return {
        "none": sbh * (34 + Fraction(5 * a * s, h)),
        "tp": sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)),
        "tp+sp": Fraction(sbh, t) * (34 + Fraction(5 * a * s, h)),
        "tp+selective": sbh * (10 + Fraction(24, t)),
        "tp+sp+selective": Fraction(34 * sbh, t),
        "full": 2 * sbh,
    }


@pytest.mark.parametrize("name", KORTHIKANTI)
def test_activation_table2(name):
    a, h, L = KORTHIKANTI[name]
    cfg, b = gpt(h, a, L), 1
    rows = table2(2048, b, h, a, 8)
    for setting, (sp, recompute) in SETTINGS.items():
        t = 1 if setting == "none" else 8
        assert calc.activation_bytes_per_layer(cfg, b, t, sp, recompute) == rows[setting]


def test_activation_savings_at_t8():
    # Korthikanti et al., abstract: sequence parallelism and selective recomputation
    # "reduce activation memory by 5x" (against tensor parallelism alone). Computed
    # exactly from Table 2 at t = 8: 316/51 ≈ 6.2, 92/17 ≈ 5.4, 84/17 ≈ 4.9, 4.9.
    expected = {"22B": Fraction(316, 51), "175B": Fraction(92, 17), "530B": Fraction(84, 17),
                "1T": Fraction(84, 17)}
    for name, (a, h, L) in KORTHIKANTI.items():
        cfg = gpt(h, a, L)
        ratio = (calc.activation_bytes_per_layer(cfg, 1, 8) /
                 calc.activation_bytes_per_layer(cfg, 1, 8, sp=True, recompute="selective"))
        assert ratio == pytest.approx(float(expected[name]), rel=1e-12)
        assert 4.9 < ratio < 6.3


def test_selective_recompute_share():
    # Korthikanti et al. §5: 5as/h = 80 for GPT-3 and 64 for MT-NLG, so selective
    # recomputation saves 70% and 65% of the activations (without parallelism).
    for name, term, saved in (("175B", 80, 70), ("530B", 64, 65)):
        a, h, L = KORTHIKANTI[name]
        assert 5 * a * 2048 // h == term
        cfg = gpt(h, a, L)
        ratio = (calc.activation_bytes_per_layer(cfg, 1, recompute="selective") /
                 calc.activation_bytes_per_layer(cfg, 1))
        assert round(100 * (1 - ratio)) == saved


def test_first_stage_holds_l_layers_whatever_p():
    # Korthikanti §4.2.3: with 1F1B the first stage holds p microbatches of l/p layers.
    a, h, L = 96, 12288, 96
    cfg = gpt(h, a, L)
    per_layer = calc.activation_bytes_per_layer(cfg, 1, 8, True, "selective")
    for pp in (1, 2, 4, 8, 16):
        assert calc.activation_bytes(cfg, 1, 8, True, "selective", pp=pp) == per_layer * L
        # fewer microbatches than stages: only m in flight
        assert calc.activation_bytes(cfg, 1, 8, True, "selective", pp=pp,
                                     microbatches=1) == per_layer * L // pp
        # GPipe keeps all of them
        assert calc.activation_bytes(cfg, 1, 8, True, "selective", pp=pp, microbatches=32,
                                     schedule="gpipe") == per_layer * L // pp * 32


@pytest.mark.parametrize("pp, v", [(2, 2), (4, 2), (8, 3), (35, 3)])
def test_interleaved_first_stage(pp, v):
    # Korthikanti's closed form L(1 + (p−1)/(pv)) against Megatron-LM's interleaved
    # warm-up on the first rank: 2(p−1) + (v−1)p forward chunks, plus one, of l/(pv) layers.
    L = pp * v * 2
    cfg = gpt(64, 4, L, V=100, s=32)
    per_layer = calc.activation_bytes_per_layer(cfg, 2, recompute="full")
    chunks = 2 * (pp - 1) + (v - 1) * pp + 1
    expected = per_layer * Fraction(chunks * L, pp * v)
    assert calc.activation_bytes(cfg, 2, recompute="full", pp=pp, virtual=v) == expected


# --------------------------------------------------------------------------- communication
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tp_comm_narayanan(t):
    cfg, b = gpt(12288, 96, 96), 1
    bsh = b * cfg.seq_len * cfg.d_model
    # §3.3: 8bsh(t−1)/t values per layer per microbatch per device
    assert calc.tp_comm_bytes(cfg, b, t, bytes_per_value=1) == 8 * bsh * (t - 1) // t
    # ... = four all-reduces of bsh 16-bit values, by the trace's own ring accounting
    one = mt.rules.ring_wire_bytes("all_reduce", 2 * bsh, t)
    assert calc.tp_comm_bytes(cfg, b, t) == 4 * one
    # full recomputation: Megatron reruns both forward all-reduces, torch's checkpoint one
    assert calc.tp_comm_bytes(cfg, b, t, recompute="full") == 6 * one
    assert calc.tp_comm_bytes(cfg, b, t, recompute="full", early_stop=True) == 5 * one


def test_tp_comm_matches_minitps_trace_test():
    # tensor_parallel/test_tensor_parallel.py::test_collectives_per_layer measures, per layer in
    # float64: 4 * 2 * (tp − 1) * S // tp with S = batch * seq * hidden * 8.
    cfg = mt.GPTConfig(vocab_size=10, seq_len=16, n_layer=2, n_head=12, d_model=24)
    for tp in (2, 4):
        S = 4 * 16 * 24 * 8
        assert calc.tp_comm_bytes(cfg, 4, tp, bytes_per_value=8) == 4 * 2 * (tp - 1) * S // tp


def test_ring_bytes_agree_with_trace():
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for n in (1, 2, 3, 4, 8):
            assert calc.ring_wire_bytes(op, 24 * 1000, n) == mt.rules.ring_wire_bytes(op, 24000, n)


def test_pp_and_dp_comm():
    cfg, b = gpt(12288, 96, 96), 2
    bsh = b * cfg.seq_len * cfg.d_model
    assert calc.pp_comm_bytes(cfg, b) == 2 * bsh  # Narayanan §3.3: bsh values each way
    assert calc.pp_comm_bytes(cfg, b, tp=8, sp=True) == 2 * bsh // 8
    n = 10**9
    assert calc.dp_comm_bytes(n, 1) == 0
    assert calc.dp_comm_bytes(n, 8) == 2 * 7 * 2 * n // 8
    assert calc.dp_comm_bytes(n, 8, zero_stage=3) == 1.5 * calc.dp_comm_bytes(n, 8)  # ZeRO §7
    both = calc.comm_bytes(cfg, b, dp=4, pp=8, tp=8)
    assert both == {"tp": calc.tp_comm_bytes(cfg, b, 8), "pp": 2 * bsh,
                    "dp": calc.dp_comm_bytes(calc.params_per_rank(cfg, 8, 8), 4)}
    assert calc.comm_bytes(cfg, b)["pp"] == 0 == calc.comm_bytes(cfg, b)["tp"]


# --------------------------------------------------------------------------- FLOPs
def test_flops_are_the_printed_equations():
    for h, a, L in NARAYANAN:
        cfg, B, s, V = gpt(h, a, L), 512, 2048, 51200
        eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
        eq7 = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
        eq8 = 72 * B * s * L * h**2 * (1 + s / (3 * h) + V / (12 * L * h))
        assert calc.flops_per_iteration(cfg, B, "full") == pytest.approx(eq3, rel=1e-12)
        assert calc.model_flops(cfg, B) == pytest.approx(eq7, rel=1e-12)
        assert calc.flops_per_iteration(cfg, B, "selective") == pytest.approx(eq8, rel=1e-12)


def _counted_flops(cfg, batch, recompute=None):
    model = mt.GPT(cfg)
    if recompute == "selective":
        for block in model.blocks:
            block.attn.core = Recomputed(block.attn.core)
    if recompute == "full":
        model.blocks = torch.nn.ModuleList(Recomputed(block) for block in model.blocks)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    return counter.get_total_flops()


def test_model_flops_equal_torchs_count():
    # Eq. 7 counts exactly the matrix multiplies minitp's GPT runs, forward and backward.
    for kw in ({}, {"vocab_size": 50, "seq_len": 16, "n_layer": 2, "n_head": 2, "d_model": 8}):
        cfg = mt.GPTConfig(**kw)
        assert _counted_flops(cfg, 3) == calc.model_flops(cfg, 3)


def test_recomputed_flops_in_minitp():
    # Papers' recomputation reruns whole forwards; torch's non-reentrant checkpoint stops
    # as soon as backward has what it needs, so minitp executes less than Eq. 3 / Eq. 8:
    # full: every layer's last matmul (8Bsh²) is not rerun; selective: only QKᵀ
    # (2Bs²h) is, not ·V — where Eq. 8 charges 12Bs²h per layer.
    cfg, B = mt.GPTConfig(vocab_size=50, seq_len=16, n_layer=2, n_head=2, d_model=8), 3
    s, h, L = cfg.seq_len, cfg.d_model, cfg.n_layer
    full = calc.flops_per_iteration(cfg, B, "full")
    assert _counted_flops(cfg, B, "full") == full - L * 8 * B * s * h * h
    assert _counted_flops(cfg, B, "selective") == calc.model_flops(cfg, B) + L * 2 * B * s * s * h
    assert calc.flops_per_iteration(cfg, B, "selective") == (calc.model_flops(cfg, B)
                                                             + L * 12 * B * s * s * h)


# Korthikanti et al. 2022, Table 5 (recalled): GPUs, global batch, seconds per
# iteration with SP + selective recomputation, MFU %, HFU %. A100 peak 312 TFLOP/s.
TABLE5 = {"22B": (8, 4, 1.10, 41.5, 43.7), "175B": (64, 64, 13.75, 51.4, 52.8),
          "530B": (280, 280, 37.83, 56.0, 57.0), "1T": (512, 512, 71.49, 56.3, 57.0)}


@pytest.mark.parametrize("name", TABLE5)
def test_korthikanti_table5_mfu_and_hfu(name):
    # MFU from Eq. 7 and HFU from Eq. 8, with the printed times (± half their last digit),
    # must reach the printed percentages (± half their last digit).
    gpus, B, seconds, mfu_pub, hfu_pub = TABLE5[name]
    a, h, L = KORTHIKANTI[name]
    cfg, peak = gpt(h, a, L), calc.A100_80GB.peak_flops
    for flops, published in ((calc.model_flops(cfg, B), mfu_pub),
                             (calc.flops_per_iteration(cfg, B, "selective"), hfu_pub)):
        slow = 100 * calc.mfu(flops, seconds + 0.005, gpus, peak)
        fast = 100 * calc.mfu(flops, seconds - 0.005, gpus, peak)
        assert slow <= published + 0.05 and fast >= published - 0.05, (slow, fast, published)


def test_korthikanti_recompute_overhead():
    # §5 (recalled): selective recomputation costs 2.7% more FLOPs for GPT-3, 1.6% for MT-NLG.
    for name, overhead in (("175B", 2.7), ("530B", 1.6)):
        a, h, L = KORTHIKANTI[name]
        cfg = gpt(h, a, L)
        ratio = calc.flops_per_iteration(cfg, 1, "selective") / calc.model_flops(cfg, 1)
        assert round(100 * (ratio - 1), 1) == overhead


def test_narayanan_throughput_and_training_time():
    peak = calc.A100_80GB.peak_flops
    # Table 1, 1008B: 502 PFLOP/s on 3072 GPUs, 163 TFLOP/s per GPU, 52% of peak
    assert round(502e15 / 3072 / 1e12) == 163
    assert round(100 * calc.mfu(163e12, 1.0, 1, peak)) == 52
    # §5.1 (recalled), Eq. 4: GPT-3 175B on 300B tokens, 1024 GPUs at 140 TFLOP/s:
    # about 34 days; the 1T model on 450B tokens, 3072 GPUs at 163 TFLOP/s: 84 days.
    day = 86400
    gpt3 = calc.param_count(gpt(12288, 96, 96))
    assert round(calc.training_seconds(300e9, gpt3, 1024, 140e12) / day) == 34
    big = calc.param_count(gpt(25600, 160, 128))
    assert round(calc.training_seconds(450e9, big, 3072, 163e12) / day) == 84


def test_megatron_lm_throughput():
    # Shoeybi et al. 2019: 39 TFLOP/s on one V100 is 30% of peak; 15.1 PFLOP/s on 512
    # GPUs is 76% scaling efficiency against it.
    assert round(100 * calc.mfu(39e12, 1.0, 1, calc.DGX2H_V100.peak_flops)) == 30
    assert round(100 * 15.1e15 / (512 * 39e12)) == 76


# --------------------------------------------------------------------------- bubble
def _gpipe_makespan(p, m, forward=1, backward=2):
    """Simulate GPipe on p stages: all forwards, then all backwards, each waiting for
    the previous stage (or next, backward) and for the stage's previous microbatch."""
    fwd = [[0] * m for _ in range(p)]
    for j in range(p):
        for i in range(m):
            ready = max(fwd[j - 1][i] if j else 0, fwd[j][i - 1] if i else 0)
            fwd[j][i] = ready + forward
    bwd = [[0] * m for _ in range(p)]
    for j in reversed(range(p)):
        for i in range(m):
            ready = max(bwd[j + 1][i] if j < p - 1 else fwd[p - 1][m - 1],
                        bwd[j][i - 1] if i else fwd[j][m - 1])
            bwd[j][i] = ready + backward
    return bwd[0][m - 1]


@pytest.mark.parametrize("p, m", [(1, 4), (2, 4), (4, 8), (8, 8), (4, 3)])
def test_bubble_matches_a_simulated_pipeline(p, m):
    ideal = m * 3
    assert calc.bubble(p, m) == Fraction(_gpipe_makespan(p, m) - ideal, ideal)


def test_bubble_values():
    assert calc.bubble(1, 8) == 0
    assert calc.bubble(4, 8) == 0.375
    assert calc.bubble(4, 8, virtual=2) == 0.1875
    assert calc.bubble(8, 3) == 7 / 3


# --------------------------------------------------------------------------- step time
def test_step_time_parts():
    cfg = gpt(3072, 32, 72, s=1024)
    cluster = calc.DGX2H_V100
    one = calc.step_time(cfg, cluster, micro_batch=8, efficiency=0.5)
    assert one.tp == one.pp == one.dp == one.bubble == 0
    assert one.compute == pytest.approx(calc.model_flops(cfg, 8) / (0.5 * cluster.peak_flops))
    assert one.total == sum(one.as_dict()[k] for k in ("compute", "tp", "pp", "dp", "bubble"))

    t = calc.step_time(cfg, cluster, tp=8, micro_batch=8)
    S = 8 * 1024 * 3072 * 2
    per_ar = 2 * 7 * (cluster.intra_latency + S / 8 / cluster.intra_bandwidth)
    assert t.tp == pytest.approx(72 * 4 * per_ar)

    p = calc.step_time(cfg, calc.A100_80GB, dp=2, pp=4, tp=8, micro_batch=1,
                       global_batch=16, sp=True, virtual=2)
    m = 8
    assert p.bubble == pytest.approx((p.compute + p.tp + p.pp) * 3 / (2 * m))
    send = calc.A100_80GB.inter_latency + S / 8 / 8 / calc.A100_80GB.inter_bandwidth
    assert p.pp == pytest.approx(2 * m * 2 * send)  # tp*dp*pp = 64 spans nodes
    assert p.dp > 0


def test_tp_leaves_the_node_when_it_must():
    cfg = gpt(4096, 32, 4)
    c = calc.A100_80GB
    assert c.link(8) == (c.intra_latency, c.intra_bandwidth)
    assert c.link(16) == (c.inter_latency, c.inter_bandwidth)
    inside = calc.step_time(cfg, c, tp=8, micro_batch=4).tp
    across = calc.step_time(cfg, c, tp=16, micro_batch=4).tp
    assert across > 5 * inside


def test_weak_scaling_efficiency_falls_with_tp():
    # Megatron-LM Table 1 family on DGX-2H, t GPUs for the t-th model: FLOP/s per GPU
    # relative to t = 1 falls, as the paper's measured 100/96/82/77% does (Fig. 5).
    def per_gpu(shape, t):
        cfg = gpt(*shape, s=1024)
        seconds = calc.step_time(cfg, calc.DGX2H_V100, tp=t, micro_batch=8).total
        return calc.model_flops(cfg, 8) / seconds / t

    rates = [per_gpu(shape, t) for shape, t in zip(MEGATRON_LM, (1, 2, 4, 8), strict=True)]
    assert all(later < earlier for earlier, later in zip(rates, rates[1:], strict=False))


def test_step_time_rejects_bad_batches():
    with pytest.raises(ValueError, match="global_batch=10"):
        calc.step_time(gpt(1024, 16, 4), calc.H100_80GB, dp=4, global_batch=10)


# --------------------------------------------------------------------------- planner
def test_plan_gpt3_on_1024_a100s():
    cfg = gpt(12288, 96, 96)
    result = calc.plan(cfg, calc.A100_80GB, global_batch=1536, n_gpus=1024)
    best = result.best
    assert best.tp <= calc.A100_80GB.gpus_per_node  # tensor parallelism stays in a node
    assert best.dp * best.pp * best.tp == 1024
    assert 0 < len(result.candidates) < result.tried
    times = [c.time.total for c in result.candidates]
    assert times == sorted(times)
    assert all(c.memory["total"] <= 0.9 * calc.A100_80GB.memory for c in result.candidates)
    text = result.explain()
    assert "tp groups span 8 consecutive GPUs: inside a node" in text
    assert str(best) in text


def test_plan_says_when_nothing_fits():
    result = calc.plan(gpt(12288, 96, 96), calc.A100_80GB, global_batch=8, n_gpus=8)
    assert result.candidates == []
    with pytest.raises(ValueError, match="none of the .* fits in 80 GiB"):
        _ = result.best


# --------------------------------------------------------------------------- ZeRO stages 2, 3
def test_step_time_counts_zero_communication():
    """Stage 1 communicates as plain data parallelism; stage 2 reduce-scatters every
    microbatch; stage 3 also gathers the parameters before each microbatch's forward
    and backward: for m = 1 one more all-gather (1.5× the bytes, ZeRO §7)."""
    cfg, c = gpt(1024, 16, 4), calc.H100_80GB
    psi = calc.params_per_rank(cfg, 1, 1)
    gather = c.collective_seconds("all_gather", psi * 2, 8, span=8)
    scatter = c.collective_seconds("reduce_scatter", psi * 2, 8, span=8)
    dp = {(s, m): calc.step_time(cfg, c, dp=8, global_batch=8 * m, zero_stage=s).dp
          for s in range(4) for m in (1, 4)}
    assert dp[(1, 1)] == dp[(2, 1)] == dp[(0, 1)] == dp[(0, 4)]
    assert dp[(3, 1)] == pytest.approx(dp[(0, 1)] + gather)
    assert dp[(2, 4)] == pytest.approx(dp[(0, 1)] + 3 * scatter)
    assert dp[(3, 4)] == pytest.approx(dp[(0, 1)] + 3 * scatter + 7 * gather)
    with pytest.raises(ValueError, match="zero_stage"):
        calc.step_time(cfg, c, dp=8, zero_stage=4)


def test_plan_searches_zero_stages():
    """A model whose states overflow one GPU fits with ZeRO-3 over 8 ranks; searching
    every stage finds stage 3 among the fits and never tries a stage on dp = 1."""
    cfg = gpt(4096, 32, 32)  # ~6.7B parameters: 16 bytes each is more than 80 GiB
    only_dp = dict(global_batch=8, n_gpus=8, micro_batches=(1,), recompute=("full",))
    none = calc.plan(cfg, calc.A100_80GB, **only_dp, optimizer="adam-mixed")
    every = calc.plan(cfg, calc.A100_80GB, **only_dp, optimizer="adam-mixed",
                      zero_stage=(0, 1, 2, 3))
    assert {c.zero_stage for c in none.candidates} == {0}
    zero3 = [c for c in every.candidates if c.zero_stage == 3]
    assert zero3 and all(c.dp > 1 for c in every.candidates if c.zero_stage)
    assert (8, 1, 1) in {(c.dp, c.pp, c.tp) for c in zero3}
    assert (8, 1, 1) not in {(c.dp, c.pp, c.tp) for c in none.candidates}
    assert "zero=3" in str(zero3[0])
