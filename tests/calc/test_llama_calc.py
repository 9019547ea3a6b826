"""minitp.calc for the Llama-style parts (issue 25, item 3): RMSNorm, rotary positions,
SwiGLU, grouped-query and multi-query attention — against minitp's own models.

* parameters: `exact_param_count` = `GPT(cfg).num_parameters()` for every combination of
  the parts; per tp rank = the parallelized model's parameters on every rank of one
  4-rank launch, with K/V heads split (t divides K) and replicated (t above K);
* FLOPs: `model_flops` = torch's FlopCounterMode on the real model, forward and backward
  (and minitp's recomputation: what torch's checkpoint reruns, as tests/calc/test_calc.py);
* activation bytes per layer: the `ActivationLedger`'s bytes = the formula + every byte
  of the gap named (`GAP_ITEMS`, each found among the ledger's entries by a rule that
  does not read the formula), nothing unexplained: on the plain model in this process
  (none, selective, full) and at t = 4 in the launch (tp, sp, selective, full).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import minitp as mt
import minitp.calc as calc
from minitp.memory import ActivationLedger
from minitp.recompute import apply_recompute
from minitp.rules import layer_label

SIZES = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=8, d_model=32)  # head_dim 4
TP = 4


def llama(**kw) -> mt.GPTConfig:
    return mt.GPTConfig.llama(**{**SIZES, **kw})


# --------------------------------------------------------------------------- parameters
# every combination GPTConfig accepts (rotary positions need the q and kv projections)
PARTS = [parts for parts in itertools.product(("layernorm", "rmsnorm"), ("learned", "rope"),
                                              ("gelu", "swiglu"), (None, 8, 2, 1), (True, False))
         if not (parts[1] == "rope" and parts[3] is None)]


@pytest.mark.parametrize("norm, positions, mlp, n_kv_head, bias", PARTS)
def test_exact_param_count_is_minitps_gpt_for_every_part(norm, positions, mlp, n_kv_head, bias):
    cfg = mt.GPTConfig(**SIZES, norm=norm, positions=positions, mlp=mlp, n_kv_head=n_kv_head,
                       bias=bias)
    assert calc.exact_param_count(cfg) == mt.GPT(cfg).num_parameters()


def test_exact_param_count_follows_the_mlp_width():
    for mlp in ("gelu", "swiglu"):
        cfg = llama(mlp=mlp, ffn_hidden=40)
        assert calc.exact_param_count(cfg) == mt.GPT(cfg).num_parameters()


def test_llama_counts_by_hand():
    # Touvron et al. 2023's layer: q h×h, kv h×2Kd, proj h×h, fc h×2f, proj f×h, 2 RMSNorms
    cfg = llama(n_kv_head=2)
    V, L, h, K, d, f = 16, 2, 32, 2, 4, cfg.ffn_width
    assert f == 96  # 8h/3 = 85.3, up to a multiple of 16
    layer = 2 * h * h + 2 * K * d * h + 3 * h * f + 2 * h
    assert calc.exact_param_count(cfg) == L * layer + V * h + h  # no positions, no biases
    assert calc.layer_params_per_rank(cfg) == layer
    # t = 2 divides K: kv split by heads; t = 4 above K: kv whole on every rank
    kv = 2 * K * d * h
    assert calc.layer_params_per_rank(cfg, 2) == (2 * h * h + kv + 3 * h * f) // 2 + 2 * h
    assert calc.layer_params_per_rank(cfg, 4) == (2 * h * h + 3 * h * f) // 4 + kv + 2 * h
    # pipeline stages: the first the embedding, the last ln_f and its own copy of it
    first, last = calc.params_per_stage(cfg, tp=4, pp=2)
    layer4 = calc.layer_params_per_rank(cfg, 4)
    assert (first, last) == (layer4 + V * h // 4, layer4 + h + V * h // 4)
    # with biases: q's h, kv's 2Kd and fc's 2f split with their weights; proj's whole
    biased = llama(n_kv_head=2, bias=True)
    weights, row_biases, norms = 2 * h * h + 3 * h * f, 2 * h, 2 * h
    assert calc.layer_params_per_rank(biased, 2) == (
        (weights + 2 * K * d * h + h + 2 * K * d + 2 * f) // 2 + row_biases + norms)
    assert calc.layer_params_per_rank(biased, 4) == (
        (weights + h + 2 * f) // 4 + 2 * K * d * h + 2 * K * d + row_biases + norms)


def test_param_count_is_eq2_for_gpt2_and_generalized_otherwise():
    V, s, L, h = 16, 8, 2, 32
    eq2 = 12 * L * h * h + 13 * L * h + (V + s) * h
    assert calc.param_count(mt.GPTConfig(**SIZES)) == eq2
    assert calc.param_count(mt.GPTConfig(**SIZES, bias=False)) == eq2  # as printed
    assert calc.param_count(SimpleNamespace(**SIZES, bias=True)) == eq2  # a bare shape: GPT-2's
    for cfg in (llama(), llama(n_kv_head=1), mt.GPTConfig(**SIZES, ffn_hidden=64)):
        final_norm = 2 * h if cfg.norm == "layernorm" and cfg.bias else h
        assert calc.param_count(cfg) == calc.exact_param_count(cfg) - final_norm
    assert calc.param_count(mt.GPTConfig(**SIZES, ffn_hidden=64)) != eq2


# --------------------------------------------------------------------------- FLOPs
FLOP_CFGS = [
    dict(n_kv_head=2), dict(n_kv_head=1), dict(n_kv_head=8),
    dict(n_kv_head=2, mlp="gelu", norm="layernorm", bias=True, ffn_hidden=48),
    dict(n_kv_head=None, positions="learned"),  # fused qkv with a SwiGLU
]


def _counted_flops(cfg, batch, recompute=None):
    model = mt.GPT(cfg)
    apply_recompute(model, recompute)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))
    with FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("kw", FLOP_CFGS)
def test_model_flops_equal_torchs_count(kw):
    # the matrices minitp's Llama-style GPT runs, forward and backward: RoPE, RMSNorm, silu
    # and the gate's product are elementwise (torch's counter counts no FLOPs for them either)
    cfg = llama(**kw)
    assert _counted_flops(cfg, 3) == calc.model_flops(cfg, 3)


def test_a_vision_language_models_flops_equal_torchs_count():
    """The encoder's 3× forward counted too; torch runs one matmul less than 3×: the patch
    embedding's input is pixels, which want no gradient (2·B·P·8·w)."""
    cfg = mt.GPTConfig.vlm(**{**SIZES, "vocab_size": 256, "seq_len": 16}, vision_width=16)
    B, P, w = 3, cfg.vision_patches, cfg.vision_width
    assert calc.model_flops(cfg, B) > calc.model_flops(mt.GPTConfig.llama(
        **{**SIZES, "vocab_size": 256, "seq_len": 16}), B)
    assert _counted_flops(cfg, B) == calc.model_flops(cfg, B) - 2 * B * P * 8 * w


@pytest.mark.parametrize("kw", FLOP_CFGS[:2])
def test_recomputed_flops_in_minitp(kw):
    # torch's checkpoint stops once backward has what it needs (tests/calc/test_calc.py):
    # full recomputation skips each layer's last matmul, here mlp.proj's 2Bsfh;
    # selective reruns QKᵀ only, 2Bs²h, K/V heads repeated to all a query heads
    cfg, B = llama(**kw), 3
    s, h, L, f = cfg.seq_len, cfg.d_model, cfg.n_layer, cfg.ffn_width
    assert _counted_flops(cfg, B, "full") == (calc.flops_per_iteration(cfg, B, "full")
                                              - L * 2 * B * s * f * h)
    assert _counted_flops(cfg, B, "selective") == calc.model_flops(cfg, B) + L * 2 * B * s * s * h


def test_layer_matrix_flops_by_hand():
    h, d, L = 32, 4, 2
    for K in (8, 2, 1):
        cfg = llama(n_kv_head=K)
        f = cfg.ffn_width
        # 2 per weight: q and proj 2h², kv 2Kd·h, SwiGLU 3hf
        assert calc.layer_matrix_flops(cfg) == L * (4 * h * h + 4 * K * d * h + 6 * h * f)
    assert calc.layer_matrix_flops(mt.GPTConfig(**SIZES)) == L * 24 * h * h


# --------------------------------------------------------------------------- activations
# What the ledger finds beyond the formula for these parts, each found by a rule on the
# entries that never reads the formula (the GPT-2 items as minitp.course.labs.activations'
# GAP_ITEMS names them, and the Llama parts' own).
GAP_ITEMS = {
    "norm stats": "LayerNorm's mean and 1/σ, RMSNorm's 1/rms: small (b, s, 1) buffers",
    "norm in float32": "torch's RMSNorm on CPU (a composite) computes in float32: it keeps a "
                       "float32 copy of its input (4 bytes a value where the formula counts "
                       "2) and the float32 x/rms for its weight's gradient; a fused RMSNorm "
                       "(Megatron-LM, Apex) keeps the 16-bit input and 1/rms",
    "rope tables": "the cos and sin tables (s × d) the rotation multiplies by, one pair per "
                   "layer (q and k share them)",
    "storage beyond the tensor": "selective recomputation keeps the core's V, a view of the "
                                 "kv projection's output, whose storage also holds the "
                                 "unrotated K (rotary positions made a new K)",
    "gathered inputs": "sequence parallelism: q and fc keep their input as all-gathered, b·s·h "
                       "each, not the b·s·h/t shard",
    "causal mask": "the s×s bool causal mask masked_fill keeps",
    "16-bit masks": "the residual dropouts' masks kept as 16-bit noise by torch's CPU "
                    "nn.Dropout, not 1 byte",
    "rng state": "the RNG state torch.utils.checkpoint keeps to redraw the dropout masks",
    "scalars": "√d, kept by autograd as an 8-byte tensor",
}
BYTES = 2  # bfloat16, the formula's 16-bit activations


def _root(e):
    return e.index if e.shares is None else e.shares


def explain_gap(entries, t: int, sp: bool) -> dict[str, int]:
    """The bytes of each `GAP_ITEMS` item among one layer's ledger entries."""
    items = dict.fromkeys(GAP_ITEMS, 0)
    seen_norm_input = set()
    checkpointed: dict[int, list] = {}
    for e in entries:
        norm = e.op in ("layer_norm", "rms_norm")
        if norm and e.shape[-1] == 1:
            items["norm stats"] += e.nbytes
        elif norm:
            if e.dtype == "float32" and e.nbytes:
                first = e.module not in seen_norm_input  # the input; after it, x/rms
                seen_norm_input.add(e.module)
                items["norm in float32"] += e.nbytes - (e.numel * BYTES if first else 0)
        elif e.module.endswith(".attn.rope"):
            items["rope tables"] += e.nbytes
        elif e.op == "checkpoint":
            checkpointed.setdefault(_root(e), []).append(e)
        elif sp and e.module_type == "ColumnParallelLinear" and e.op == "linear":
            items["gathered inputs"] += e.nbytes - e.nbytes // t
        elif e.op == "masked_fill" and e.dtype == "bool":
            items["causal mask"] += e.nbytes
        elif e.module_type in ("Dropout", "ShardedDropout"):
            items["16-bit masks"] += e.nbytes - e.numel if e.nbytes else 0
        elif e.op == "checkpoint rng state":
            items["rng state"] += e.nbytes
        elif e.op.endswith(" scalar"):
            items["scalars"] += e.nbytes
    for views in checkpointed.values():  # one storage: its bytes less its tensors'
        items["storage beyond the tensor"] += (sum(v.nbytes for v in views)
                                               - sum(v.numel for v in views) * BYTES)
    return items


def _check_layer(ledger, cfg, b, t, sp, recompute):
    layers = ledger.per_layer()
    assert list(layers) == [layer_label(k) for k in range(cfg.n_layer)]
    assert len(set(layers.values())) == 1, layers
    formula = calc.activation_bytes_per_layer(cfg, b, t, sp, recompute)
    gap = explain_gap(ledger.layer(layer_label(0)), t, sp)
    assert layers[layer_label(0)] - formula - sum(gap.values()) == 0, (formula, gap)
    return gap


ACTIVATION_CFGS = {  # all with dropout: the formula, as Table 2, counts its masks
    "llama gqa": dict(n_kv_head=2),
    "llama mqa": dict(n_kv_head=1),
    "llama mha": dict(n_kv_head=8),
    "llama, learned positions": dict(n_kv_head=2, positions="learned"),
    "layernorm gelu gqa": dict(n_kv_head=2, norm="layernorm", mlp="gelu", bias=True),
    "fused qkv swiglu": dict(n_kv_head=None, positions="learned"),
}


def _ledger(model, batch):
    x = torch.randint(0, model.cfg.vocab_size, (batch, model.cfg.seq_len))
    with ActivationLedger(model) as ledger:
        _, loss = model(x, x)
    del loss
    return ledger


@pytest.mark.parametrize("recompute", [None, "selective", "full"])
@pytest.mark.parametrize("name", ACTIVATION_CFGS)
def test_plain_model_activations_equal_the_formula_and_the_named_gap(name, recompute):
    cfg = llama(**ACTIVATION_CFGS[name], dropout=0.1)
    torch.manual_seed(0)
    model = mt.GPT(cfg).to(torch.bfloat16)
    apply_recompute(model, recompute)
    gap = _check_layer(_ledger(model, 2), cfg, 2, 1, False, recompute)
    if recompute == "selective":  # the unrotated K rides along with V, and only then
        assert (gap["storage beyond the tensor"] > 0) == (cfg.positions == "rope"
                                                          and cfg.n_kv_head is not None)


def test_without_dropout_only_the_masks_and_the_dropout_output_go():
    # the formula counts Table 2's dropout tensors whatever cfg.dropout: with none, torch
    # keeps no masks (2sbh) and ·V reads the softmax's own output (3as²b: mask 1, output 2)
    cfg, b = llama(n_kv_head=2), 2
    s, h, a = cfg.seq_len, cfg.d_model, cfg.n_head
    torch.manual_seed(0)
    ledger = _ledger(mt.GPT(cfg).to(torch.bfloat16), b)
    formula = calc.activation_bytes_per_layer(cfg, b)
    gap = explain_gap(ledger.layer(layer_label(0)), 1, False)
    assert gap["16-bit masks"] == 0
    measured = ledger.per_layer()[layer_label(0)]
    assert measured == formula + sum(gap.values()) - 2 * s * b * h - 3 * a * s * s * b


def test_activation_formula_by_hand():
    cfg, b = llama(n_kv_head=2), 3
    s, h, a, d, K, f = 8, 32, 8, 4, 2, cfg.ffn_width
    sbh, attention = s * b * h, 5 * a * s * s * b
    # 10sbh + Q, proj input 4sbh + K, V repeated to a heads 4sbh + SwiGLU 8sbf + 5as²b
    assert calc.activation_bytes_per_layer(cfg, b) == 10 * sbh + 8 * sbh + 8 * s * b * f + attention
    for t, kv_per_rank in ((2, K // 2), (4, 1)):  # t = 2 splits the K/V heads; 4 replicates
        split = 8 * sbh // t + 8 * s * b * f // t
        assert calc.activation_bytes_per_layer(cfg, b, t) == 10 * sbh + split + attention // t
        selective = 10 * sbh + 4 * sbh // t + 4 * s * b * d * kv_per_rank + 8 * s * b * f // t
        assert calc.activation_bytes_per_layer(cfg, b, t, recompute="selective") == selective
        assert calc.activation_bytes_per_layer(cfg, b, t, True, "selective") == (
            selective - 10 * sbh + 10 * sbh // t)
    wide = llama(n_kv_head=8)  # K = a: selective keeps K and V whole, as GPT-2's 24sbh/t
    assert calc.activation_bytes_per_layer(wide, b, 2, recompute="selective") == (
        10 * sbh + 8 * sbh // 2 + 8 * s * b * wide.ffn_width // 2)
    assert calc.activation_bytes_per_layer(cfg, b, 4, True, "full") == 2 * sbh // 4
    # a bare shape is GPT-2's layer: Korthikanti et al. 2022, Table 2, 34sbh + 5as²b
    shape = SimpleNamespace(seq_len=s, d_model=h, n_head=a)
    assert calc.activation_bytes_per_layer(shape, b) == 34 * sbh + attention


# --------------------------------------------------------------------------- one launch, t = 4
TP_SETTINGS = {  # name -> (sequence_parallel, recompute)
    "tp": (False, None), "tp+sp": (True, None), "tp+selective": (False, "selective"),
    "tp+sp+selective": (True, "selective"), "tp+full": (False, "full"),
    "tp+sp+full": (True, "full"),
}
LAUNCH_ACTIVATIONS = {  # t = 4: K = 8 split (2 a rank), K = 2 and 1 replicated
    "llama gqa split": dict(n_kv_head=8, n_head=16, d_model=64),
    "llama gqa replicated": dict(n_kv_head=2),
    "layernorm gelu mqa": dict(n_kv_head=1, norm="layernorm", mlp="gelu", bias=True,
                               positions="learned"),
}
LAUNCH_PARAMS = {
    **LAUNCH_ACTIVATIONS,
    "llama biased split": dict(n_kv_head=4, bias=True),
    "llama mqa biased": dict(n_kv_head=1, bias=True, vocab_size=10),  # 10: padded to 12
}
BATCH = 2


def _rank(activations, params):
    mesh = mt.Mesh(tp=TP)
    out = {"params": {}, "ledgers": {}, "totals": {}}
    for name, kw in params.items():
        model = mt.parallelize(mt.GPT(llama(**kw)), mesh)
        out["params"][name] = sum(p.numel() for p in model.parameters())
    for name, kw in activations.items():
        cfg = llama(**kw, dropout=0.1)
        torch.manual_seed(0)
        ref = mt.GPT(cfg).to(torch.bfloat16)
        for setting, (sp, recompute) in TP_SETTINGS.items():
            model = mt.parallelize(ref, mesh, sequence_parallel=sp, recompute=recompute)
            ledger = _ledger(model, BATCH)
            out["totals"][name, setting] = ledger.per_layer()
            if mesh.tp.rank == 0:
                out["ledgers"][name, setting] = ledger
            del model
    return out


@pytest.fixture(scope="module")
def launched():
    return mt.launch(_rank, TP, LAUNCH_ACTIVATIONS, LAUNCH_PARAMS, timeout=120)


@pytest.mark.parametrize("name", LAUNCH_PARAMS)
def test_params_per_rank_equal_the_shards(launched, name):
    cfg = llama(**LAUNCH_PARAMS[name])
    assert [r["params"][name] for r in launched] == [calc.params_per_rank(cfg, tp=TP)] * TP


@pytest.mark.parametrize("setting", TP_SETTINGS)
@pytest.mark.parametrize("name", LAUNCH_ACTIVATIONS)
def test_tp_activations_equal_the_formula_and_the_named_gap(launched, name, setting):
    sp, recompute = TP_SETTINGS[setting]
    cfg = llama(**LAUNCH_ACTIVATIONS[name], dropout=0.1)
    totals = [r["totals"][name, setting] for r in launched]
    assert all(t == totals[0] for t in totals), totals  # every rank keeps the same
    _check_layer(launched[0]["ledgers"][name, setting], cfg, BATCH, TP, sp, recompute)
    # (q and kv read one gathered input, `ParallelInput`: a second gather would be unexplained)
