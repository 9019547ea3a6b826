"""FP8 across ranks equals the one-process FP8 run, and the local-scale trap does not.

One launch of two ranks trains a sample of meshes — tp=2 with and without sequence
parallelism, pp=2, dp=2 under ZeRO-1 and ZeRO-3, cp=2 — each scaling at least once, and one
of four ranks dp=2 × tp=2 with SP, for 3 AdamW steps in
float64 beside the plain model made FP8 by `mt.fp8.convert` and stepped by
`mt.fp8.reference_step` (the same microbatches in one process: `minitp.fp8.reference`). With
each amax reduced over the axes the rule names, every cast sees the same values and the same
scale as in one process: the losses and parameters agree to 1e-9. With each rank's own amax
(``fp8_local_scales=True``) they do not.
"""

import warnings

import pytest
import torch
from helpers import random_batches

import minitp as mt
from minitp.calc import fp8_all_gather_bytes
from minitp.data_parallel import gathered
from minitp.fp8 import block_shards

TOLERANCE = 1e-9
CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)
SP = dict(sequence_parallel=True)
# (name, mesh sizes, parallelize options, microbatches)
CASES = [
    ("tp2+SP tensorwise", dict(tp=2), dict(SP, fp8="tensorwise"), 1),
    ("tp2 rowwise", dict(tp=2), dict(fp8="rowwise"), 1),
    ("tp2+SP rowwise", dict(tp=2), dict(SP, fp8="rowwise"), 1),  # x gathered, then cast
    ("tp2+SP delayed", dict(tp=2), dict(SP, fp8="delayed"), 2),
    ("pp2 delayed", dict(pp=2), dict(fp8="delayed"), 2),
    ("dp2 ZeRO-3 tensorwise", dict(dp=2), dict(zero_stage=3, fp8="tensorwise"), 2),
    ("dp2 ZeRO-3, 8-bit gather", dict(dp=2),
     dict(zero_stage=3, fp8="tensorwise", fp8_all_gather=True), 1),
    ("dp2 ZeRO-1 rowwise", dict(dp=2), dict(zero_stage=1, fp8="rowwise"), 1),
    ("cp2 tensorwise", dict(cp=2), dict(fp8="tensorwise"), 1),
]
MIXED = ("dp2 x tp2+SP delayed ZeRO-1", dict(dp=2, tp=2),
         dict(SP, fp8="delayed", zero_stage=1), 2)  # 4 ranks: dp's and tp's groups at once
# Blackwell's block scales: widths of whole blocks on every rank (d_model/tp = 32, 32 tokens
# a rank's microbatch), cp's pieces too (seq_len 64 over cp=2: four pieces of 16)
BLOCK_CFG = dict(CFG, d_model=64, seq_len=16, n_layer=1)
BLOCK_CASES = [
    ("tp2+SP mxfp8", dict(tp=2), dict(SP, fp8="mxfp8"), 1, BLOCK_CFG),
    ("tp2 nvfp4", dict(tp=2), dict(fp8="nvfp4"), 1, BLOCK_CFG),
    ("pp2 mxfp8", dict(pp=2), dict(fp8="mxfp8"), 2, dict(BLOCK_CFG, n_layer=2)),
    ("dp2 ZeRO-1 nvfp4", dict(dp=2), dict(zero_stage=1, fp8="nvfp4"), 1, BLOCK_CFG),
    ("dp2 ZeRO-2 mxfp8", dict(dp=2), dict(zero_stage=2, fp8="mxfp8"), 1, BLOCK_CFG),
    ("cp2 nvfp4", dict(cp=2), dict(fp8="nvfp4"), 1, dict(BLOCK_CFG, seq_len=64)),
]
CASES += BLOCK_CASES
MIXED_BLOCKS = ("dp2 x tp2+SP nvfp4 ZeRO-3", dict(dp=2, tp=2),
                dict(SP, fp8="nvfp4", zero_stage=3), 1, BLOCK_CFG)  # tensor scales over dp, tp
TRAP = ("tp2+SP tensorwise, local scales", dict(tp=2),
        dict(SP, fp8="tensorwise", fp8_local_scales=True), 1)


def _compare(cases, steps=3):
    """Per case: (largest loss difference, largest parameter difference) from the one-process
    FP8 run, and the axes its first layer's projections reduce each amax over."""
    out = {}
    for name, sizes, options, microbatches, *model in cases:
        mesh, cfg = mt.Mesh(**sizes), mt.GPTConfig(**(model[0] if model else CFG))
        torch.manual_seed(0)
        ref = mt.GPT(cfg).double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the trap's warning, on purpose
            model = mt.parallelize(ref, mesh, **options)
        mt.fp8.convert(ref, options["fp8"])
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
        opt = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
        dp, loss_error = sizes.get("dp", 1), 0.0
        for batch in random_batches(steps, cfg, 2 * microbatches * dp):
            expected = mt.fp8.reference_step(ref, batch, ref_opt, dp, microbatches)
            loss = mt.train_step(model, batch, mesh, opt, microbatches=microbatches)
            loss_error = max(loss_error, abs(loss - expected))
        with gathered(model):
            dense = model.full_state_dict()
        groups = {layer.rsplit(".", 2)[-2] + "." + layer.rsplit(".", 1)[-1]:
                  {role: tuple(a.name for a in s.axes) for role, s in scales.scales.items()}
                  for layer, scales in mt.fp8.fp8_layers(model).items() if ".0.attn." in layer}
        out[name] = (loss_error, max((dense[n] - p.detach()).abs().max().item()
                                     for n, p in ref.named_parameters()), groups)
    return out


# ZeRO-3's 8-bit all-gather of one weight under block scales (`minitp.fp8.block_shards`): an
# odd row count puts ZeRO's even split (240 values a rank) inside a block of 32 (MXFP8's) or,
# with 48 columns, of 16 (NVFP4's: 120 a rank); 4 rows split into whole blocks either way
SHARD_WEIGHTS = {"mxfp8": (5, 96), "nvfp4": (5, 48)}
WHOLE_BLOCKS = {"mxfp8": (4, 96), "nvfp4": (4, 48)}


def _block_shards():
    """Per (recipe, atomic): this rank's {"differ", "max_error", "gathered_bytes"} from
    `gather_cast`; per recipe ("bytes"): its all-gathers' bytes in the trace, whole blocks."""
    mesh, out = mt.Mesh(dp=2), {}
    for recipe, shape in SHARD_WEIGHTS.items():
        for atomic in (False, True):
            weight = torch.randn(*shape, dtype=torch.float64,
                                 generator=torch.Generator().manual_seed(1))
            out[recipe, atomic] = block_shards.gather_cast(weight, mesh.dp, recipe, atomic)
        before = len(mt.trace.events())
        weight = torch.randn(*WHOLE_BLOCKS[recipe], dtype=torch.float64)
        block_shards.gather_cast(weight, mesh.dp, recipe, atomic=True)
        out[recipe, "bytes"] = sum(e.model_bytes for e in mt.trace.events()[before:]
                                   if e.op == "all_gather")
    return out


def _compare_and_trap(cases):
    return {**_compare(cases), "block shards": _block_shards()}


@pytest.fixture(scope="module")
def fp8_run():
    return mt.launch(_compare_and_trap, 2, [*CASES, TRAP], timeout=240)


@pytest.fixture(scope="module")
def mixed_run():
    return mt.launch(_compare, 4, [MIXED, MIXED_BLOCKS], timeout=240)


def test_a_mixed_mesh_equals_the_one_process_fp8_run(mixed_run):
    for rank, results in enumerate(mixed_run):
        for name in (MIXED[0], MIXED_BLOCKS[0]):
            loss_error, param_error, _ = results[name]
            assert max(loss_error, param_error) < TOLERANCE, (rank, name, loss_error,
                                                              param_error)


def test_every_mesh_equals_the_one_process_fp8_run(fp8_run):
    for rank, results in enumerate(fp8_run):
        for name, *_ in CASES:
            loss_error, param_error, _ = results[name]
            assert loss_error < TOLERANCE, f"rank {rank}, {name}: loss differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"rank {rank}, {name}: a parameter by {param_error:.3g}"


def test_local_scales_differ_measurably(fp8_run):
    for results in fp8_run:
        loss_error, param_error, _ = results[TRAP[0]]
        assert max(loss_error, param_error) > 1e-4, (loss_error, param_error)


def test_the_model_holds_the_rules_groups(fp8_run):
    """tp=2 with SP: every tensor of the column layer (qkv) is split over tp — its input along
    the sequence — and so is the row layer's (proj), but for its output gradient, whole on
    every rank; the trap reduces nothing."""
    tp = ("tp",)
    column, row = dict(input=tp, weight=tp, grad=tp), dict(input=tp, weight=tp, grad=())
    assert fp8_run[0][CASES[0][0]][2] == {"attn.qkv": column, "attn.proj": row}
    nothing = dict(input=(), weight=(), grad=())
    assert fp8_run[0][TRAP[0]][2] == {"attn.qkv": nothing, "attn.proj": nothing}


def test_a_zero3_boundary_inside_a_block_changes_the_gathered_weight_and_whole_blocks_fix_it(
        fp8_run):
    """Measured per rank: ZeRO's even split cuts a block, so rank 1, whose shard starts
    inside it, casts that block's tail with another scale (and rank 0 its head, unless the
    head holds the block's amax); block-atomic shards: exact."""
    for recipe in SHARD_WEIGHTS:
        cut = [results["block shards"][recipe, False] for results in fp8_run]
        assert cut[1]["differ"] > 0 and cut[1]["max_error"] > 1e-3, (recipe, cut)
        for results in fp8_run:
            fixed = results["block shards"][recipe, True]
            assert fixed["differ"] == 0 and fixed["max_error"] == 0.0, (recipe, fixed)


def test_the_block_all_gathers_bytes_in_the_trace_are_calcs(fp8_run):
    """MXFP8: 8 + 8/32 bits a value; NVFP4: 4 + 8/16 (its tensor scale is the amax
    all-reduce, not gathered): the trace's all-gathers against `calc.fp8_all_gather_bytes`."""
    for recipe, shape in WHOLE_BLOCKS.items():
        model = fp8_all_gather_bytes(*shape, 2, recipe)
        for results in fp8_run:
            assert results["block shards"][recipe, "bytes"] == model["values"] + model["scales"]
