"""`mt.debug.first_divergence` names the module where each of the lessons' traps is, not a
later one that inherits its error; a correct mesh gives None; bad input costs one line.

The traps are switched on as their lessons do: the K/V replicas' and the VLM encoder's
gradient sums left out (the labs' own `_forget_kv_sum`, `_forget_encoder_sum`), RoPE at
local positions under CP (`_local_positions`); the MoE aux loss's statistics kept local (a
rank's `SplitSequence` not summing), a packed batch's rows turned by the first row's
positions under CP (Megatron-LM #5243; the museum's spoil: positions that only fail to
restart shift each document by a constant, which RoPE, being relative, does not see);
latent attention's shared rotary key's gradient sum left out
(torchtitan PR #1373's review, `_rotary_key_sum_left_out`: named at W^KR, not at the rotation
whose input gradients are partial by design); FP8's local scales by ``--fp8-local-scales``
(the CLI test).
All but FP8 run in ONE launch of 4 ranks, with the correct mesh (pp 2 × tp 2, SP, 2
microbatches: a pipeline's names, sequence and feature shards, the padded vocabulary).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

import minitp as mt
from minitp.data import packing
from minitp.debug.divergence import compare_on_rank, earliest
from minitp.debug.museum.spoils import packed_positions_of_the_first_row

LLAMA = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, norm="rmsnorm",
             positions="rope", mlp="swiglu", bias=False, n_kv_head=2)
GPT2 = dict(vocab_size=61, seq_len=16, n_layer=2, n_head=4, d_model=32)


def _kv_sum_left_out(model):
    from minitp.course.labs.modern_transformer import _forget_kv_sum

    _forget_kv_sum(model)


def _rope_local_positions(model):
    from minitp.course.labs.modern_transformer import _local_positions

    _local_positions(model)


def _encoder_sum_left_out(model):
    from minitp.course.labs.vision_language import _forget_encoder_sum

    _forget_encoder_sum(model)


def _rotary_key_sum_left_out(model):
    for name, p in model.named_parameters():
        if ".k_rope." in name:
            p.grad_partial_over_tp = False  # as if each rank's gradient were whole


def _aux_statistics_local(model):
    from minitp.model.moe import moe_layers

    for layer in moe_layers(model):
        layer.sequence.sum = lambda per_sequence: per_sequence  # this rank's part only
        layer.sequence.seq_len = lambda local: local


def _cases():
    docs = [d[:n] for d, n in zip(packing.corpus_documents(), (7, 11, 5, 9, 13, 6, 8, 10),
                                  strict=False)]
    vlm = mt.GPTConfig.vlm(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32,
                           n_kv_head=2, vision_layers=1, vision_width=32, vision_heads=4)
    moe = dict(GPT2, n_experts=4, top_k=2, balance="aux", aux_loss_coef=0.1)
    return {  # name: (cfg, mesh, batch, spoil, microbatches, parallelize options)
        "kv": (mt.GPTConfig(**LLAMA), dict(tp=4), None, _kv_sum_left_out, 1, {}),
        "rope": (mt.GPTConfig(**LLAMA), dict(cp=4), None, _rope_local_positions, 1, {}),
        "aux": (mt.GPTConfig(**moe), dict(cp=2, tp=2), None, _aux_statistics_local, 1,
                dict(sequence_parallel=True)),
        "packed": (mt.GPTConfig(**{**LLAMA, "vocab_size": 256}), dict(cp=4),
                   packing.pack(docs, seq_len=16), packed_positions_of_the_first_row, 1, {}),
        "vlm": (vlm, dict(tp=4), None, _encoder_sum_left_out, 1, dict(sequence_parallel=True)),
        "mla": (mt.GPTConfig.mla(**{**GPT2, "seq_len": 8}, q_lora_rank=8, kv_lora_rank=8,
                                 rope_dim=4), dict(tp=4), None, _rotary_key_sum_left_out, 1,
                dict(sequence_parallel=True)),
        "correct": (mt.GPTConfig(**GPT2), dict(pp=2, tp=2), None, None, 2,
                    dict(sequence_parallel=True)),
    }


def _every_case(cases):
    return {name: compare_on_rank(cfg, sizes, batch, spoil=spoil, microbatches=m, **options)
            for name, (cfg, sizes, batch, spoil, m, options) in cases.items()}


@pytest.fixture(scope="module")
def found():
    run = mt.launch(_every_case, 4, _cases(), timeout=300)
    found = {name: (earliest([rank[name] for rank in run]),
                    [rank[name]["compared"] for rank in run]) for name in run[0]}
    found["packed_loss"] = (float(run[0]["packed"]["loss"]),
                            float(run[0]["packed"]["reference_loss"]))
    return found


def test_the_kv_replicas_sum_left_out_is_named_at_kv(found):
    first, _ = found["kv"]
    assert (first.module, first.phase, first.tensor) == ("blocks.1.attn.kv", "backward",
                                                         "weight.grad"), first


def test_rope_at_local_positions_is_named_at_the_rotation(found):
    first, _ = found["rope"]
    assert (first.module, first.phase) == ("blocks.0.attn.rope", "forward"), first


def test_local_aux_loss_statistics_are_named_at_the_router(found):
    first, _ = found["aux"]
    assert first.module.startswith("blocks.1.mlp.router") and first.phase == "backward", first


def test_packed_rows_turned_by_the_wrong_positions_are_named_at_the_rotation(found):
    first, _ = found["packed"]
    assert (first.module, first.phase) == ("blocks.0.attn.rope", "forward"), first
    # a real bug, not only a moved intermediate: the step's loss departs too
    assert abs(found["packed_loss"][0] - found["packed_loss"][1]) > 1e-9, found["packed_loss"]


def test_the_encoder_sum_left_out_is_named_in_the_encoder(found):
    first, _ = found["vlm"]
    assert first.module.startswith("vision.") and first.tensor.endswith(".grad"), first
    assert first.phase == "backward"


def test_the_rotary_keys_sum_left_out_is_named_at_its_projection(found):
    first, _ = found["mla"]
    assert (first.module, first.phase, first.tensor) == ("blocks.1.attn.k_rope", "backward",
                                                         "weight.grad"), first


def test_a_correct_mesh_departs_nowhere(found):
    first, compared = found["correct"]
    assert first is None, first
    assert min(compared) >= 30, compared  # and it did compare: every module a rank holds


def test_the_command_line_names_fp8s_local_scales_at_the_first_fp8_layer():
    from minitp.debug.cli import main

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        main(["diverge", "--dp", "1", "--pp", "1", "--tp", "2", "--n-layer", "2",
              "--d-model", "16", "--n-head", "2", "--seq-len", "16", "--batch-size", "2",
              "--steps", "1", "--fp8", "tensorwise", "--fp8-local-scales"])
    last = json.loads(out.getvalue().splitlines()[-1])
    assert (last["module"], last["phase"], last["tensor"]) == ("blocks.0.attn.qkv", "forward",
                                                              "output"), last
    assert last["difference"] > 1e-9 and last["rank"] in (0, 1)


@pytest.mark.parametrize("kw, match", [
    (dict(tolerance=1e-16), "at least float64's noise"),
    (dict(sizes=dict(tp=3)), "not divisible by tp=3"),
])
def test_bad_input_is_refused_before_any_process_starts(kw, match):
    with pytest.raises(ValueError, match=match):
        mt.debug.first_divergence(mt.GPTConfig(**GPT2), kw.pop("sizes", dict(tp=2)), **kw)


def test_the_command_line_refuses_a_tolerance_below_noise_in_one_line():
    from minitp.debug.cli import main

    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(["diverge", "--tolerance", "1e-16"])
    assert exit_.value.code == 2 and len(err.getvalue().strip().splitlines()) == 1
