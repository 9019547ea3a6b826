"""`mt.calc.pipeline_layout`, the balancer (a model): its layout's slowest stage is the least
any layout reaches (against every layout, enumerated), the even split is kept where it is
already best, a heavy head or a vision encoder moves layers off its stage, and a memory
limit is met or refused in one line."""

import itertools

import pytest

import minitp as mt
from minitp.calc.planning.pipeline_layout import end_flops, layer_flops, stage_memory

CFG = dict(vocab_size=256, seq_len=64, n_layer=7, n_head=4, d_model=64)


def _every_layout(n_layer, stages):
    """Every way to give `stages` stages contiguous layers in order, middle stages not empty."""
    for cuts in itertools.combinations_with_replacement(range(n_layer + 1), stages - 1):
        bounds = [0, *cuts, n_layer]
        runs = [range(a, b) for a, b in itertools.pairwise(bounds)]
        if all(len(r) for r in runs[1:-1]):
            yield runs


@pytest.mark.parametrize("overrides, pp", [({}, 3), (dict(vocab_size=4096), 2),
                                           (dict(n_experts=4, moe_every=2), 4)])
def test_no_layout_has_a_faster_slowest_stage(overrides, pp):
    cfg = mt.GPTConfig(**{**CFG, **overrides})
    costs, (first, last) = layer_flops(cfg), end_flops(cfg)

    def slowest(runs):
        return max(sum(costs[i] for i in r) + (first if g == 0 else 0)
                   + (last if g == pp - 1 else 0) for g, r in enumerate(runs))

    choice = mt.calc.pipeline_layout(cfg, pp)
    assert choice.slowest == slowest(choice.stages) == min(map(slowest, _every_layout(7, pp)))
    mt.check_parallel_config(cfg, pp=pp, pipeline_layout=choice.layout)  # a layout that runs


def test_the_even_split_is_kept_where_the_head_is_lighter_than_a_layer():
    cfg = mt.GPTConfig(**{**CFG, "n_layer": 8})
    assert end_flops(cfg)[1] < layer_flops(cfg)[0]
    assert mt.calc.pipeline_layout(cfg, 4).layout == "Ett|tt|tt|ttL"


def test_a_head_heavier_than_a_layer_takes_a_layer_off_the_last_stage():
    cfg = mt.GPTConfig(**{**CFG, "n_layer": 8, "vocab_size": 1400})
    assert layer_flops(cfg)[0] < end_flops(cfg)[1] < 2 * layer_flops(cfg)[0]
    choice = mt.calc.pipeline_layout(cfg, 4)
    assert len(choice.stages[-1]) == 1 and choice.slowest == 3 * layer_flops(cfg)[0]


def test_a_vision_encoder_takes_layers_off_the_first_stage():
    cfg = mt.GPTConfig.vlm(vocab_size=256, seq_len=64, n_layer=8, n_head=4, d_model=64,
                           vision_layers=4, vision_width=256, vision_heads=4)
    assert end_flops(cfg)[0] > layer_flops(cfg)[0]
    assert len(mt.calc.pipeline_layout(cfg, 4).stages[0]) < 2


def test_a_memory_limit_is_met_or_refused_in_one_line():
    """1F1B's first stage holds pp microbatches' activations, the last one: a limit that the
    even split breaks on the first stage moves its layers down the pipeline."""
    cfg = mt.GPTConfig(**{**CFG, "n_layer": 8})
    options = dict(micro_batch=8, schedule="1f1b")
    even = [range(2 * g, 2 * g + 2) for g in range(4)]
    first = stage_memory(cfg, even[0], 0, 4, **options)
    limit = first - 1
    choice = mt.calc.pipeline_layout(cfg, 4, memory_limit=limit, **options)
    assert len(choice.stages[0]) < 2 and max(choice.stage_bytes) <= limit
    with pytest.raises(ValueError, match="no layout of 8 layers over 4 stages fits") as caught:
        mt.calc.pipeline_layout(cfg, 4, memory_limit=1000, **options)
    assert "\n" not in str(caught.value)
