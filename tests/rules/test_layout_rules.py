"""Pipeline layouts (`minitp.rules.layouts`): the three forms read alike, and a layout that
cannot run is refused in one line before anything is built."""

import pytest

import minitp as mt
from minitp.rules.layouts import layout_stages, layout_text, parse_layout

CFG = dict(vocab_size=16, seq_len=8, n_layer=5, n_head=2, d_model=8)


def test_megatrons_string_with_repetition_reads_as_the_counts_and_the_lists():
    """Megatron's example shape ("Et*3|(tt|)*29,m|L", here without MTP): groups repeated
    with their stage boundaries, commas cosmetic; the string, the counts and the explicit
    layers give the same stages, and `layout_text` writes them back."""
    assert parse_layout("Et*3|(tt|)*2,tL") == [list("Ettt"), list("tt"), list("tt"), list("tL")]
    stages = layout_stages("Et*3|(tt|)*2,tL", 8, pp=2, virtual_stages=2)
    assert stages == [range(0, 3), range(3, 5), range(5, 7), range(7, 8)]
    assert layout_stages([3, 2, 2, 1], 8, 2, 2) == stages
    assert layout_stages([[0, 1, 2], [3, 4], [5, 6], [7]], 8, 2, 2) == stages
    assert layout_stages(layout_text(stages), 8, 2, 2) == stages


@pytest.mark.parametrize("layout, pp, v, message", [
    # mlx-lm #1688's trap: an uneven split that silently dropped a layer
    ([2, 2], 2, 1, "places 4 layers, but the model has 5: every layer is placed exactly once"),
    ("Et*2|tL", 2, 1, "places 3 layers, but the model has 5"),
    ([[0, 1, 2], [2, 3, 4]], 2, 1, "places layer 2 twice"),
    ([[0, 1], [3, 2, 4]], 2, 1, "places layer 3 where layer 2 belongs"),
    ([3, 2], 2, 2, "has 2 stages, but pp\\*virtual_stages = 2\\*2 = 4"),
    ("Et*3|ttL", 4, 1, "has 2 stages, but pp\\*virtual_stages = 4\\*1 = 4"),
    ("Etm|t*3L", 2, 1, "cannot read 'm'.*MTP, is not supported"),
    ("t*3|EttL", 2, 1, "the embedding E opens the first stage"),
    ("Et*3|Ltt", 2, 1, "the head L closes the last stage"),
    ([2, 0, 2, 1], 2, 2, "stage 1 holds nothing"),
    ([2.5, 2.5], 2, 1, "must be a string like"),
])
def test_a_layout_that_cannot_run_is_refused_in_one_line(layout, pp, v, message):
    with pytest.raises(ValueError, match=message) as caught:
        mt.check_parallel_config(mt.GPTConfig(**CFG), pp=pp, virtual_stages=v,
                                 pipeline_layout=layout)
    assert "\n" not in str(caught.value)


def test_layers_that_do_not_divide_by_pp_need_a_layout_and_run_with_one():
    cfg = mt.GPTConfig(**CFG)
    with pytest.raises(ValueError, match="give a pipeline_layout"):
        mt.check_parallel_config(cfg, pp=2)
    mt.check_parallel_config(cfg, pp=2, pipeline_layout="E|t*5L")  # a stage of the embedding
