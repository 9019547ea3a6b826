"""Global gradient-norm clipping (`mt.train_step(..., clip_grad=...)`, `minitp.step.grad_norm`):
the norm over the whole mesh equals the single-device model's, and clipped training
equals ``torch.nn.utils.clip_grad_norm_`` on one device, in float64.

One launch of 4 ranks, 3 AdamW steps per mesh with a max norm small enough that every
step clips: tensor parallelism with sequence parallelism (replicated parameters counted
once, partial gradients summed first) and a padded vocabulary; a pipeline (the tied
embedding's two copies counted once) under 1F1B, ZB-H1, ZB-H2 (with ZeRO-2), and ZBV and
DualPipeV (both copies on rank 0 of the V); context parallelism; ZeRO 1,
2 and 3 (shards: each rank counts its own slice); expert parallelism (experts replicated
over their expert-data-parallel group).
"""

from helpers import train_meshes

import minitp as mt

TOLERANCE = 1e-10
CFG = dict(vocab_size=16, seq_len=8, n_layer=4, n_head=2, d_model=8)
CLIP = 0.05

# (mesh sizes, parallelize options, schedule, microbatches, config overrides)
SETTINGS = [
    (dict(dp=2, tp=2), dict(sequence_parallel=True), None, 1, dict(vocab_size=15)),
    (dict(pp=2, tp=2), dict(sequence_parallel=True), "1f1b", 2, {}),
    (dict(pp=2, dp=2), dict(zero_stage=1), "zb-h1", 2, {}),
    (dict(pp=2, tp=2), dict(virtual_stages=2, placement="v"), "zbv", 3, {}),  # both copies
    (dict(pp=4), dict(virtual_stages=2, placement="v"), "dualpipev", 8, dict(n_layer=8)),
    (dict(pp=2, dp=2), dict(zero_stage=2), "zb-h2", 3, {}),
    (dict(pp=2, cp=2), {}, None, 2, {}),
    (dict(dp=4), dict(zero_stage=2), None, 1, {}),
    (dict(dp=2, tp=2), dict(zero_stage=3, sequence_parallel=True), None, 1, {}),
    (dict(dp=4, ep=2), dict(zero_stage=1), None, 1, dict(n_experts=4)),
    (dict(dp=4, ep=2), {}, None, 1, dict(n_experts=4)),
]


def _train(settings):
    return [(loss_error, worst, model.grad_norm)
            for loss_error, worst, model in train_meshes(settings, CFG, clip_grad=CLIP)]


def test_the_global_norm_and_clipped_training_equal_one_device_in_float64():
    run = mt.launch(_train, 4, SETTINGS, timeout=300)
    for rank, results in enumerate(run):
        for setting, (loss_error, (param_error, name), norm) in zip(SETTINGS, results,
                                                                    strict=True):
            where = f"rank {rank}, {setting}"
            # loss_error includes |norm − one device's norm| at every step
            assert loss_error < TOLERANCE, f"{where}: loss or norm differs by {loss_error:.3g}"
            assert param_error < TOLERANCE, f"{where}: {name} differs by {param_error:.3g}"
            assert norm > CLIP, f"{where}: the last step did not clip (norm {norm:.3g})"
