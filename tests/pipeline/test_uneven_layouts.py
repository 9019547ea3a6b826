"""Uneven pipeline layouts (`mt.parallelize(..., pipeline_layout=...)`) equal one device in
float64: every step's loss and every parameter after 2 AdamW steps, on 4 real ranks, in one
launch. 5 layers (which no pp here divides) over stages of 3 and 2, 4 and 1, an
embedding-only first stage, interleaved chunks of 2, 1, 1, 1 and a V of 1, 2, 1, 1; between
them GPipe, 1F1B, interleaved, ZB-H1 and ZBV, tp with sequence parallelism, dp with ZeRO-1 and
ZeRO-3, cp, ep (a mixture of experts), full recomputation and the vision-language model's
encoder on its first stage (3 layers as 1 and 2); and a checkpoint saved at one layout loads
at another.
"""

import torch
from helpers import assert_every_mesh_matches, random_batches, train_meshes

import minitp as mt
from minitp.runtime.mesh import world

TOLERANCE = 1e-10
CFG = dict(vocab_size=16, seq_len=8, n_layer=5, n_head=2, d_model=8)
VLM = dict(vocab_size=256, seq_len=16, n_layer=3, n_head=4, d_model=16, n_kv_head=2,
           norm="rmsnorm", positions="rope", mlp="swiglu", bias=False,
           vision_patches=6, vision_layers=2, vision_width=8, vision_heads=4)
SP = dict(sequence_parallel=True)

# (mesh sizes, parallelize options, schedule, microbatches, config overrides)
SETTINGS = [
    (dict(pp=2, dp=2, ep=2), dict(pipeline_layout=[3, 2], zero_stage=1), "1f1b", 2,
     dict(n_experts=4)),
    (dict(pp=2, tp=2), dict(SP, pipeline_layout="Et*4|tL", recompute="full"), "gpipe", 2, {}),
    (dict(pp=4), dict(pipeline_layout="E|tt|tt|tL"), "zb-h1", 4, {}),
    (dict(pp=2, dp=2), dict(pipeline_layout=[2, 1, 1, 1], virtual_stages=2, zero_stage=3),
     "interleaved", 2, {}),
    (dict(pp=2, cp=2), dict(pipeline_layout=[[0], [1, 2], [3], [4]], virtual_stages=2,
                            placement="v"), "zbv", 3, {}),
    (dict(pp=2, tp=2), dict(SP, pipeline_layout=[1, 2]), "1f1b", 2, VLM),
]


def _train(settings, directory):
    meshes = [result[:2] for result in train_meshes(settings, CFG, steps=2)]
    return meshes, _saved_and_reloaded(directory)


def _saved_and_reloaded(directory):
    """One Adam step at layout [4, 1] over pp 2 × dp 2, saved sharded (each rank its own
    elements), loaded at "E|t*3|t|tL" over pp 4: whether each rank's stage holds the saved
    weights of its layers (read against the dense state, without another gather)."""
    cfg, adam = mt.GPTConfig(**CFG), (lambda ts: torch.optim.Adam(ts, lr=1e-2))
    torch.manual_seed(0)
    mesh, plan = mt.Mesh(pp=2, dp=2), dict(pipeline_layout=[4, 1])
    model = mt.parallelize(mt.GPT(cfg).double(), mesh, **plan)
    optimizer = mt.make_optimizer(model, mesh, adam)
    mt.train_step(model, random_batches(1, cfg, 4)[0], mesh, optimizer, microbatches=2)
    saver = mt.checkpoint.Saver(model, optimizer, mesh, directory, plan)
    saver.save(1)
    saver.close()
    mt.comm.barrier(world())  # global rank 0 seals the step after the others wrote theirs
    dense = model.full_state_dict()
    loaded, _, _ = mt.checkpoint.load(f"{directory}/step-1", mt.Mesh(pp=4),
                                      optimizer_factory=adam, pipeline_layout="E|t*3|t|tL")
    (stage,) = loaded.chunks  # tp 1: the stage's own tensors are dense
    mine = stage.full_state_dict()
    layers = {int(name.split(".")[1]) for name in mine if name.startswith("blocks.")}
    expected = [range(0), range(0, 3), range(3, 4), range(4, 5)][loaded.mesh.pp.rank]
    return layers == set(expected) and all(torch.equal(v, dense[k]) for k, v in mine.items())


def test_layouts_equal_one_device_in_float64_and_checkpoints_cross_layouts(tmp_path):
    run = mt.launch(_train, 4, SETTINGS, str(tmp_path / "ckpt"), timeout=300)
    assert_every_mesh_matches([meshes for meshes, _ in run], SETTINGS, TOLERANCE)
    assert all(same for _, same in run), "a checkpoint did not load at another layout"
