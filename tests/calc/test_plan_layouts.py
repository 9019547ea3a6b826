"""`mt.calc.plan(..., layouts=True)` searches uneven pipelines too: a pp whose stages the
layers do not divide, with `mt.calc.pipeline_layout`'s layout, priced as the even pipeline
of its longest stage (a MODEL, an upper bound)."""

import dataclasses

import pytest

import minitp as mt
from minitp import calc

# 7 layers: only pp = 1 divides them on 2 GPUs; one head: no tensor parallelism either
CFG = mt.GPTConfig(vocab_size=256, seq_len=64, n_layer=7, n_head=1, d_model=64)
# usable 0.9 of it: 5.5 MB, under one whole replica (6.7 MB) and above half the layers (4.0)
SMALL = dataclasses.replace(calc.A100_80GB, memory=6.1e6)


def test_only_an_uneven_pipeline_fits_and_the_planner_finds_it():
    even = calc.plan(CFG, SMALL, global_batch=4, n_gpus=2)
    with pytest.raises(ValueError, match="none of the 6 configurations fits"):
        _ = even.best
    best = calc.plan(CFG, SMALL, global_batch=4, n_gpus=2, layouts=True).best
    layout = calc.pipeline_layout(CFG, 2).layout
    assert (best.dp, best.pp, best.layout) == (1, 2, layout) == (1, 2, "Et*4|t*3L")
    mt.check_parallel_config(CFG, pp=2, pipeline_layout=best.layout)  # a layout that runs
    # priced as 2 stages of its longest, 4 layers: the even 8-layer pipeline's memory
    eight = dataclasses.replace(CFG, n_layer=8)
    assert best.memory == calc.memory_per_gpu(eight, best.micro_batch, 1, 2, 1, best.sp,
                                              best.recompute, optimizer="megatron",
                                              microbatches=best.microbatches)
    assert "layout=Et*4|t*3L" in str(best)


def test_layouts_add_only_the_pipelines_the_layers_do_not_divide():
    cfg = dataclasses.replace(CFG, n_head=4)
    big = dataclasses.replace(calc.A100_80GB, memory=2**40)
    plain = calc.plan(cfg, big, global_batch=4, n_gpus=4)
    both = calc.plan(cfg, big, global_batch=4, n_gpus=4, layouts=True)
    added = [c for c in both.candidates if c.layout]
    assert {str(c) for c in plain.candidates} < {str(c) for c in both.candidates}
    assert len(added) == len(both.candidates) - len(plain.candidates) > 0
    assert {(c.pp, c.layout) for c in added} == {(2, "Et*4|t*3L"), (4, "Ett|tt|tt|tL")}
