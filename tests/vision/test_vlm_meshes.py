"""The vision-language model (`GPTConfig.vlm`: an image's patches read by a small encoder,
placed before the text of a Llama-style decoder) under every axis it composes with, equal
to the single-device model in float64: every step's loss and every parameter after 3
AdamW steps, on 4 real ranks.

Both encoder layouts of `minitp.tensor_parallel.vision` — replicated on every tp rank
and tensor-parallel — with and without sequence parallelism (6 image tokens over 4
slices of 4: one rank's slice all image, one half, two none; tp 4 with SP and the
encoder replicated, and split without overlap, are lesson 15's checked cell), the encoder in a
pipeline's first stage (1F1B, zb-h1 with its deferred weight gradients), data
parallelism with ZeRO-1 and ZeRO-3 (the encoder one unit; with it replicated under SP,
a unit of gradients partial over tp), recomputation and the
overlapped tensor parallelism of the decoder; and a checkpoint saved with the encoder
split, loaded with it replicated.
"""

import pytest
import torch
from helpers import assert_every_mesh_matches, random_batches, train_meshes

import minitp as mt

TOLERANCE = 1e-10
VLM = dict(vocab_size=256, seq_len=16, n_layer=4, n_head=4, d_model=16, n_kv_head=2,
           norm="rmsnorm", positions="rope", mlp="swiglu", bias=False,
           vision_patches=6, vision_layers=2, vision_width=8, vision_heads=4)

REPLICATED, TENSOR = dict(vision_layout="replicated"), dict(vision_layout="tensor")
SP = dict(sequence_parallel=True)
# (mesh sizes, parallelize options, schedule, microbatches, config overrides)
SETTINGS = [
    (dict(tp=4), {**SP, **TENSOR, "tp_overlap": True}, None, 1, {}),  # image tokens' grads
    (dict(tp=4), REPLICATED, None, 1, {}),  # no SP: nothing to sum         # all-reduced
    (dict(dp=2, tp=2), {**TENSOR, "zero_stage": 1}, None, 1, {}),
    (dict(pp=2, tp=2), {**SP, **REPLICATED, "recompute": "full"}, "1f1b", 2, {}),
    (dict(pp=2, tp=2), {**SP, **TENSOR}, "zb-h1", 2, {}),
    (dict(pp=2, dp=2), dict(zero_stage=3), None, 2, {}),
    (dict(dp=2, tp=2), {**SP, **REPLICATED, "zero_stage": 3}, None, 2, {}),  # partial, sharded
]


def _train(settings, directory):
    meshes = [result[:2] for result in train_meshes(settings, VLM)]
    return meshes, _saved_split_loaded_replicated(directory)


def test_every_mesh_equals_one_device_in_float64_and_checkpoints_cross_layouts(tmp_path):
    run = mt.launch(_train, 4, SETTINGS, str(tmp_path / "ckpt"), timeout=300)
    assert_every_mesh_matches([meshes for meshes, _ in run], SETTINGS, TOLERANCE)
    for _, (same_names, gap) in run:  # the encoder saved split, loaded replicated
        assert same_names and gap == 0


def _saved_split_loaded_replicated(directory):
    """One step with the encoder split over tp 4 (SP), saved; loaded with it replicated in
    the first stage of pp 2 × tp 2: every parameter, as the dense model, before and after."""
    cfg = mt.GPTConfig(**VLM)
    torch.manual_seed(0)
    mesh = mt.Mesh(tp=4)
    model = mt.parallelize(mt.GPT(cfg).double(), mesh, sequence_parallel=True,
                           vision_layout="tensor")
    optimizer = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
    mt.train_step(model, random_batches(1, cfg, 2)[0], mesh, optimizer)
    mt.checkpoint.save(model, directory, 1, optimizer)
    loaded, _, _ = mt.checkpoint.load(directory, mt.Mesh(pp=2, tp=2), sequence_parallel=True,
                                      vision_layout="replicated")
    saved, back = model.full_state_dict(), loaded.full_state_dict()
    return set(saved) == set(back), max((saved[n] - back[n]).abs().max().item() for n in saved)


@pytest.mark.parametrize("overrides,options,message", [
    (dict(vision_patches=16), {}, "vision_patches=16 leaves no text"),
    (dict(vocab_size=128), {}, "needs vocab_size >= 256"),
    (dict(vision_heads=3, vision_width=9), dict(tp=2, vision_layout="tensor"),
     "the vision encoder's n_head=3 is not divisible by tp=2"),
    ({}, dict(cp=2), "cp=2 with a vision-language model"),
    ({}, dict(vision_layout="split"), "vision_layout must be one of"),
])
def test_what_a_vision_language_model_cannot_do_is_refused_in_one_line(overrides, options,
                                                                        message):
    with pytest.raises(ValueError, match=message):
        mt.check_parallel_config(mt.GPTConfig(**{**VLM, **overrides}), **options)


def test_the_image_is_read_before_the_text():
    """The encoder's output takes the first P positions (the token table's rows for them
    are replaced), the text keeps its embeddings, and one changed patch changes every
    position's logits of its row (the text reads the image; the encoder sees it whole)."""
    torch.manual_seed(0)
    model = mt.GPT(mt.GPTConfig(**VLM)).double()
    x = torch.randint(0, 256, (2, 16))
    placed = {}
    hook = model.vision.register_forward_hook(lambda m, args, out: placed.update(x=out))
    with torch.no_grad():
        a, _ = model(x)
        hook.remove()
        assert torch.equal(placed["x"][:, :6], model.vision.encode(x[:, :6]))
        assert torch.equal(placed["x"][:, 6:], model.wte(x[:, 6:]))
        changed = x.clone()
        changed[0, 5] ^= 1  # one pixel of the first row's last patch
        b, _ = model(changed)
    assert (a[0] - b[0]).abs().amax(-1).min() > 0
    assert torch.equal(a[1], b[1])
