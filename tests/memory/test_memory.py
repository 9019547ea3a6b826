"""minitp.memory (the activation ledger, model states) and the activation lab,
minitp.course.labs.activations (Table 2's formula, the measured table).

Activation memory is measured, and every byte between the measurement and
Korthikanti et al. 2022, Table 2 is accounted for: these tests check that in
integers (measured == formula + documented gap), never as a loose ratio, and
check the ledger itself against the allocator (torch's profiler) and against
tiny computations whose saved tensors are known. The formula is checked against
an independent transcription of Table 2, and model-state bytes against every
tensor a ZeRO-1 rank keeps alive.
"""

import gc
from fractions import Fraction

import pytest
import torch
import torch.nn as nn
from helpers import live_bytes
from torch.utils.checkpoint import checkpoint

import minitp as mt
import minitp.calc as calc
from minitp.course.labs import activations
from minitp.course.labs.activations import SETTINGS, korthikanti_bytes
from minitp.memory import ActivationLedger, measure_model_states
from minitp.rules import layer_label
from minitp.tensor_parallel.dropout import ShardedDropout

CFG = mt.GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, dropout=0.1)
B = 2  # micro-batch
S, H, A = CFG.seq_len, CFG.d_model, CFG.n_head
SBH = S * B * H
CPU_DROPOUT_MASK_BYTES = 2  # nn.Dropout on CPU keeps its noise in bf16: test_dropout_masks
# What torch.utils.checkpoint keeps per call in the table's runs: the CPU generator's state
# only, since `activations.activation_table` runs its ranks on gloo (the CPU) on every
# machine (its gap items are the CPU kernels'). The first GPU run (an H200) showed that
# expecting the GPU's state too, wherever a GPU was there, was wrong.
RNG_STATE_BYTES = torch.get_rng_state().nbytes


SCALAR_BYTES = 8  # a Python number autograd keeps, as float64: test_python_scalars...


def _ln_stat_bytes() -> int:
    """Bytes per value of the mean / rstd that LayerNorm keeps for a bf16 input (on CPU: 2)."""
    _, mean, _ = torch.native_layer_norm(torch.ones(1, 4, dtype=torch.bfloat16), (4,), None,
                                         None, 1e-5)
    return mean.element_size()


def _kept_by(fn):
    """(fn(), bytes that fn allocated and that are still alive when it returns): the
    allocator's view, from torch's profiler, independent of saved-tensor hooks."""
    gc.collect()
    with torch.autograd.profiler.profile(profile_memory=True) as prof:
        out = fn()
        gc.collect()
    return out, sum(e.self_cpu_memory_usage for e in prof.function_events)


# --------------------------------------------------------------------------- the formula
def test_formula_against_hand_computed_values():
    # GPT-22B of Korthikanti et al.: s=2048, h=6144, a=64, t=8, b=1.
    # sbh = 12,582,912; 5as²b = 1,342,177,280.
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "none") == 1_769_996_288  # 34sbh + 5as²b
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "tp") == 331_350_016  # 10sbh + (24sbh+5as²b)/8
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "tp+sp") == 221_249_536  # (34sbh+5as²b)/8
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "tp+selective") == 163_577_856
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "tp+sp+selective") == 53_477_376
    assert korthikanti_bytes(2048, 1, 6144, 64, 8, "full") == 25_165_824  # 2sbh
    # s=4, b=1, h=2, a=1, t=2: sbh = 8, 5as²b = 80.
    small = [korthikanti_bytes(4, 1, 2, 1, 2, setting) for setting in SETTINGS]
    assert small == [352, 216, 176, 176, 136, 16]
    assert korthikanti_bytes(4, 1, 2, 1, 3, "tp+sp+selective") == pytest.approx(272 / 3)
    with pytest.raises(ValueError, match="setting"):
        korthikanti_bytes(4, 1, 2, 1, 2, "sp")


def table2(s, b, h, a, t):
    """Korthikanti et al. 2022, Table 2, transcribed: activation bytes per transformer
    layer, 16-bit activations and 1-byte dropout masks. Exact (Fractions)."""
    s, b, h, a, t = map(Fraction, (s, b, h, a, t))
    return {
        "none": s * b * h * (34 + 5 * a * s / h),
        "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp+sp": s * b * h / t * (34 + 5 * a * s / h),
        "tp+selective": s * b * h * (10 + 24 / t),
        "tp+sp+selective": 34 * s * b * h / t,
        "full": 2 * s * b * h,
    }


# (s, b, h, a, t): the 22B model of Korthikanti et al. (Table 3), GPT-3 175B at t = 8,
# and small shapes, t from 1 to 6, chosen so that every row is a whole number of bytes.
TABLE2_SHAPES = [(2048, 1, 6144, 64, 8), (2048, 1, 12288, 96, 8), (16, 2, 32, 4, 2),
                 (32, 3, 48, 6, 3), (12, 1, 20, 5, 6), (64, 4, 128, 8, 4), (8, 1, 16, 2, 1)]


@pytest.mark.parametrize("shape", TABLE2_SHAPES, ids=lambda x: "s{}b{}h{}a{}t{}".format(*x))
def test_formula_is_table_2(shape):
    """korthikanti_bytes, and the calculator it shares its arithmetic with, against
    Table 2 written out above: equal, exactly, in every row."""
    s, b, h, a, t = shape
    expected = table2(s, b, h, a, t)
    options = {"none": (False, None), "tp": (False, None), "tp+sp": (True, None),
               "tp+selective": (False, "selective"), "tp+sp+selective": (True, "selective"),
               "full": (False, "full")}
    assert list(expected) == list(SETTINGS) == list(options)
    cfg = mt.GPTConfig(vocab_size=16, seq_len=s, n_layer=1, n_head=a, d_model=h)
    for setting, (sp, recompute) in options.items():
        whole = expected[setting]
        assert whole.denominator == 1, (shape, setting)  # the shapes above are chosen so
        t_used = 1 if setting in ("none", "full") else t  # Table 2's rows without t
        assert korthikanti_bytes(s, b, h, a, t, setting) == whole, (shape, setting)
        got = calc.activation_bytes_per_layer(cfg, b, tp=t_used, sp=sp, recompute=recompute)
        assert got == whole, (shape, setting)


# --------------------------------------------------------------------------- the ledger
def test_ledger_records_exactly_what_autograd_saves():
    w = nn.Parameter(torch.randn(4, 3))
    x = torch.randn(5, 4)
    with ActivationLedger() as ledger:
        y = (x @ w).relu()  # mm keeps x (for w's gradient); relu keeps its output
    assert [(e.op, e.shape, e.nbytes) for e in ledger.entries] == [
        ("matmul", (5, 4), 80), ("relu", (5, 3), 60)]
    assert ledger.entries[0].storage == x.untyped_storage().data_ptr()
    assert ledger.entries[1].storage == y.untyped_storage().data_ptr()
    assert ledger.total_bytes == 140


def test_parameters_are_model_state_not_activations():
    linear = nn.Linear(4, 3)
    x = torch.randn(5, 4, requires_grad=True)  # now the weight (as Wᵀ, a view) is saved too
    for model in (None, linear):
        with ActivationLedger(model) as ledger:
            linear(x)
        assert [(e.op, e.shape, e.nbytes) for e in ledger.entries] == [("linear", (5, 4), 80)]
    assert ledger.entries[0].module == "" and ledger.entries[0].module_type == "Linear"


def test_views_of_one_storage_count_once():
    x = torch.randn(8, requires_grad=True)
    with ActivationLedger() as ledger:
        a = x.exp()  # keeps its output a: 32 bytes
        a[:4].sin() + a[4:].cos()  # each keeps a view of a
    assert [(e.op, e.nbytes, e.shares) for e in ledger.entries] == [
        ("exp", 32, None), ("sin", 0, 0), ("cos", 0, 0)]
    assert ledger.total_bytes == 32


def test_python_scalars_autograd_keeps_are_counted():
    x = torch.randn(4, requires_grad=True)
    with ActivationLedger() as ledger:
        y = x / 3.0  # autograd keeps 3.0 as a float64 tensor, without calling the hooks
    assert [(e.op.endswith(" scalar"), e.dtype, e.nbytes) for e in ledger.entries] == [
        (True, "float64", SCALAR_BYTES)]
    _, kept = _kept_by(lambda: x / 3.0)
    assert kept == y.nbytes + SCALAR_BYTES  # the allocator agrees


def test_layer_is_read_from_the_module_or_the_trace_label():
    """blocks.<i> names the layer; without one, the trace label ("layer3", nested or
    not) does; outside both, no layer."""
    x = torch.randn(4, requires_grad=True)
    with ActivationLedger() as ledger:
        with mt.trace.label("stage1"), mt.trace.label("layer3"):
            x.exp()
        with mt.trace.label("layer12"):
            x.sin()
        with mt.trace.label("head"):
            x.cos()
    assert [e.layer for e in ledger.entries] == ["layer3", "layer12", ""]


def test_checkpoint_keeps_its_inputs_and_the_rng_state():
    x = torch.randn(16, requires_grad=True)
    with ActivationLedger() as ledger:
        y = checkpoint(lambda v: v.sin().exp().cos(), x, use_reentrant=False)
    assert [(e.op, e.nbytes) for e in ledger.entries] == [
        ("checkpoint", x.nbytes), ("checkpoint rng state", RNG_STATE_BYTES)]
    assert ledger.entries[0].storage == x.untyped_storage().data_ptr()
    y.sum().backward()  # the ledger changed nothing: recomputation still works
    torch.testing.assert_close(x.grad, torch.autograd.grad(x.sin().exp().cos().sum(), x)[0])


def test_dropout_masks():
    """ShardedDropout keeps a 1-byte bool mask (Table 2's assumption) and nothing else;
    torch's CPU nn.Dropout keeps its noise in the input's dtype (the "16-bit masks" gap)."""
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    axis = mt.Axis("tp", (0,), 0)
    with ActivationLedger() as ledger:
        ShardedDropout(0.5, axis)(x)
        nn.Dropout(0.5)(x)
    assert [(e.dtype, e.nbytes) for e in ledger.entries] == [
        ("bool", 32), ("bfloat16", 32 * CPU_DROPOUT_MASK_BYTES)]
    # ...and its backward is still dropout's: dx = dy · keep / (1 - p)
    x = torch.randn(64, 8, dtype=torch.float64, requires_grad=True)
    y = ShardedDropout(0.25, axis)(x)
    keep = y != 0
    assert 0 < keep.sum() < keep.numel()
    torch.testing.assert_close(y, x.detach() * keep / 0.75, rtol=0, atol=0)
    grad = torch.randn_like(x)
    y.backward(grad)
    torch.testing.assert_close(x.grad, grad * keep / 0.75, rtol=0, atol=0)


def test_ledger_matches_the_allocator_on_a_plain_gpt():
    torch.manual_seed(0)
    gpt = mt.GPT(CFG)
    x = torch.randint(0, CFG.vocab_size, (B, S))
    y = torch.randint(0, CFG.vocab_size, (B, S))
    with ActivationLedger(gpt) as ledger:
        (logits, loss), kept = _kept_by(lambda: gpt(x, y))
    outputs = _outputs_not_saved(ledger, logits, loss)  # the loss keeps the logits: once
    existed = {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
    saved_before = sum(e.nbytes for e in ledger.entries if e.storage in existed)
    assert saved_before == x.nbytes + y.nbytes  # the embedding keeps x, the loss keeps y
    assert kept == ledger.total_bytes - saved_before + outputs
    layers = ledger.per_layer()
    assert list(layers) == ["layer0", "layer1"] and layers["layer0"] == layers["layer1"] > 0


def _outputs_not_saved(ledger, *outputs) -> int:
    """Bytes of the forward's outputs that no saved tensor already counts (the chunked loss
    keeps the logits themselves for its backward)."""
    saved = {e.storage for e in ledger.entries}
    return sum(t.untyped_storage().nbytes() for t in outputs
               if t.untyped_storage().data_ptr() not in saved)


def _allocator_check(settings):
    mesh = mt.Mesh(tp=1)
    torch.manual_seed(0)
    ref = mt.GPT(CFG).to(torch.bfloat16)
    x = torch.randint(0, CFG.vocab_size, (B, S))
    y = torch.randint(0, CFG.vocab_size, (B, S))
    results = {}
    for setting in settings:
        sequence_parallel, recompute = activations._OPTIONS[setting]
        model = mt.parallelize(ref, mesh, sequence_parallel=sequence_parallel,
                               recompute=recompute)
        model(x, y)  # first calls allocate lazily-built state; measure the second
        with ActivationLedger(model) as ledger:
            (logits, loss), kept = _kept_by(lambda m=model: m(x, y))
        outputs = _outputs_not_saved(ledger, logits, loss)
        existed = {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
        saved_before = sum(e.nbytes for e in ledger.entries if e.storage in existed)
        results[setting] = (kept, ledger.total_bytes - saved_before + outputs)
        del logits, loss
    return results


def test_ledger_matches_the_allocator_in_every_setting():
    """At t = 1 (gloo's threads make the allocator's count noisy for t > 1): the ledger
    plus the outputs (each storage once; less the ids and targets, which existed before) is
    exactly what the forward left allocated, recomputation included."""
    results = mt.launch(_allocator_check, 1, SETTINGS, timeout=120)[0]
    for setting, (kept, ledger_plus_outputs) in results.items():
        assert kept == ledger_plus_outputs, setting


# --------------------------------------------------------------------------- the table
@pytest.fixture(scope="module")
def table():
    """Every setting at t = 1, 2, 4 ("none" at 1): three launches."""
    return activations.activation_table(CFG, B, tp_sizes=(1, 2, 4), settings=SETTINGS)


def documented_gap(setting: str, t: int) -> dict[str, int]:
    """What our layer keeps beyond Table 2, from the shapes alone (see activations.GAP_ITEMS)."""
    sequence_parallel, recompute = activations._OPTIONS[setting]
    s_local = S // t if sequence_parallel else S
    return {
        "ln stats": 0 if setting == "full" else 2 * 2 * B * s_local * _ln_stat_bytes(),
        "causal mask": 0 if recompute else S * S,
        "16-bit masks": 0 if sequence_parallel or setting == "full"
        else 2 * SBH * (CPU_DROPOUT_MASK_BYTES - 1),
        "gathered inputs": 2 * (2 * SBH - 2 * SBH // t) if sequence_parallel else 0,
        "rng state": RNG_STATE_BYTES if recompute else 0,
        "scalars": SCALAR_BYTES,  # √d survives recomputation: it sits in a graph node
    }


def test_measured_equals_formula_plus_the_documented_gap(table):
    seen = set()
    for row in table.rows:
        setting, t = row["setting"], row["t"]
        formula = korthikanti_bytes(S, B, H, A, t, setting)
        gap = documented_gap(setting, t)
        assert row["measured"] == formula + sum(gap.values()), (setting, t)
        assert row["formula"] == formula and row["explained"] == gap, (setting, t)
        assert row["unexplained"] == 0 and row["gap"] == sum(gap.values())
        seen.add((setting, t))
    assert seen == {("none", 1)} | {(s, t) for s in SETTINGS[1:] for t in (1, 2, 4)}


def test_full_recompute_keeps_only_the_layer_input_and_rng_state(table):
    for t in (1, 2, 4):
        entries = table.ledgers[("full", t)].layer("layer0")
        kept = [(e.op, e.shape, e.dtype, e.nbytes) for e in entries
                if not e.op.endswith(" scalar")]
        assert kept == [("checkpoint", (B, S, H), "bfloat16", 2 * SBH),
                        ("checkpoint rng state", (RNG_STATE_BYTES,), "uint8", RNG_STATE_BYTES)]


def _layer_inputs_and_ledger():
    mesh = mt.Mesh(tp=2)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(CFG).to(torch.bfloat16), mesh, recompute="full")
    inputs = []
    for block in model.blocks:
        block.register_forward_pre_hook(
            lambda module, args: inputs.append(args[0].untyped_storage().data_ptr()))
    x = torch.randint(0, CFG.vocab_size, (B, S))
    with ActivationLedger(model) as ledger:
        model(x, x)
    return inputs, ledger


def test_full_recompute_keeps_each_layers_own_input():
    inputs, ledger = mt.launch(_layer_inputs_and_ledger, 2, timeout=120)[0]
    for index, storage in enumerate(inputs):
        saved = [e for e in ledger.layer(layer_label(index)) if e.op == "checkpoint"]
        assert [(e.storage, e.nbytes) for e in saved] == [(storage, 2 * SBH)]


def test_sequence_parallelism_divides_every_saved_tensor_by_t(table):
    """Except the causal mask and √d (whole on every rank) and the two all-gathered
    inputs of the column-parallel layers (see GAP_ITEMS["gathered inputs"]). Compared
    per (module, op): with one head per rank, q, k and v reach the matmuls as views
    of the qkv output (no copy), so the entries differ but not their bytes."""

    def by_op(setting, t):
        groups = {}
        for e in table.ledgers[(setting, t)].layer("layer0"):
            groups[(e.module, e.op)] = groups.get((e.module, e.op), 0) + e.nbytes
        return groups

    whole = {("blocks.0.attn.core", "masked_fill"), ("blocks.0.attn.core", "div scalar"),
             ("blocks.0.attn.qkv", "linear"), ("blocks.0.mlp.fc", "linear")}
    one = by_op("tp+sp", 1)
    # ln1, qkv, core (matmul, div scalar, masked_fill, softmax), core.dropout, proj,
    # attn.dropout, ln2, fc, mlp (gelu), mlp.proj, mlp.dropout
    assert whole <= set(one) and len(one) == 14
    for t in (2, 4):
        many = by_op("tp+sp", t)
        assert set(many) == set(one)
        for key, nbytes in one.items():
            assert many[key] == (nbytes if key in whole else nbytes // t), (key, t)
            assert nbytes % t == 0
        fixed = S * S + SCALAR_BYTES + 2 * 2 * SBH
        measured = {r["t"]: r["measured"] for r in table.rows if r["setting"] == "tp+sp"}
        assert measured[t] - fixed == (measured[1] - fixed) // t


def test_table_display_and_plan(table):
    text = repr(table)
    assert "Korthikanti" in text and "unexplained" in text
    for name in activations.GAP_ITEMS:
        assert f"  {name}: " in text
    assert len(text.splitlines()) == 2 + 1 + len(table.rows) + 1 + len(activations.GAP_ITEMS)
    assert activations._plan((1, 2, 4)) == {1: ["none", "full"], 2: list(SETTINGS[1:]),
                                       4: list(SETTINGS[1:])}
    assert activations._plan((1, 2), ["tp", "tp+sp"]) == {1: ["tp", "tp+sp"], 2: ["tp", "tp+sp"]}


def test_activation_table_rejects_what_the_formula_does_not_cover():
    with pytest.raises(ValueError, match="dropout"):
        activations.activation_table(mt.GPTConfig(**{**vars(CFG), "dropout": 0.0}), B)
    with pytest.raises(ValueError, match="16-bit"):
        activations.activation_table(CFG, B, dtype=torch.float32)
    with pytest.raises(ValueError, match="n_head"):
        activations.activation_table(CFG, B, tp_sizes=(3,))


# --------------------------------------------------------------------------- model states
def test_model_state_bytes_after_one_adam_step():
    cfg = mt.GPTConfig(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=8)
    torch.manual_seed(0)
    gpt = mt.GPT(cfg)
    # wte 16·8 + wpe 8·8 + layer (ln1 16, qkv 8·24+24, proj 8·8+8, ln2 16, fc 8·32+32,
    # proj 32·8+8) + ln_f 16 = 128 + 64 + 872 + 16: the tied output layer adds nothing.
    params, tensors = 1080, 16
    optimizer = torch.optim.Adam(gpt.parameters(), lr=1e-3)
    assert measure_model_states(gpt, optimizer) == {
        "parameters": 4 * params, "gradients": 0, "optimizer": 0, "total": 4 * params,
        "optimizer_state": {}}
    x = torch.randint(0, 16, (2, 8))
    gpt(x, x)[1].backward()
    optimizer.step()
    assert measure_model_states(gpt, optimizer) == {
        "parameters": 4 * params, "gradients": 4 * params,
        "optimizer": 4 * params * 2 + 4 * tensors, "total": 4 * params * 4 + 4 * tensors,
        "optimizer_state": {"step": 4 * tensors, "exp_avg": 4 * params,
                            "exp_avg_sq": 4 * params}}


def test_model_state_counts_a_shared_storage_once():
    shared = torch.zeros(10)
    module = nn.Module()
    module.a, module.b = nn.Parameter(shared), nn.Parameter(shared[:5])  # two views, one storage
    module.c = nn.Parameter(torch.zeros(3))
    assert measure_model_states(module)["parameters"] == 40 + 12


# --------------------------------------------------------------------------- ZeRO-1's live bytes
ZERO_CFG = dict(vocab_size=16, seq_len=8, n_layer=1, n_head=2, d_model=6)  # 666 parameters
def _zero1_state_bytes(steps):
    mesh = mt.Mesh(dp=mt.world().size)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**ZERO_CFG)), mesh, zero_stage=1)
    optimizer = mt.make_optimizer(model, mesh, torch.optim.Adam, lr=1e-3)
    x = torch.randint(0, 16, (2 * mesh.dp.size, 8), generator=torch.Generator().manual_seed(1))
    out = {}
    for step in range(steps + 1):
        if step:
            mt.train_step(model, (x, x.roll(-1, 1)), mesh, optimizer)
        gc.collect()
        out[step] = (measure_model_states(model, optimizer), live_bytes(model, optimizer))
    numel = sum(p.numel() for p in model.parameters())
    return out, numel, optimizer.padded, next(model.parameters()).element_size()


@pytest.mark.parametrize("dp", [2, 4])
def test_zero1_model_state_bytes_are_thelive_bytes(dp):
    """Between steps a ZeRO-1 rank keeps the model's parameters and gradients, its
    flat shard (1/dp of the padded parameters) with the shard's gradient, and
    Adam's state for the shard: measure_model_states must count all of it, exactly."""
    run = mt.launch(_zero1_state_bytes, dp, 2, timeout=120)
    for rank, (by_step, numel, padded, e) in enumerate(run):
        shard = padded // dp * e
        assert padded == -(-numel // dp) * dp
        for step, (states, live) in by_step.items():
            assert states["total"] == live, (rank, step)
            grads = step > 0
            assert states["parameters"] == numel * e + shard, (rank, step)
            assert states["gradients"] == grads * (numel * e + shard), (rank, step)
            assert states["optimizer"] == grads * (2 * shard + 4), (rank, step)  # 4: Adam's step
    assert dp != 4 or padded > numel  # 666 parameters: the dp = 4 shard is padded
