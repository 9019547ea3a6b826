"""Lesson 28: find the bug. The norms' bytes counted from a real GPT's LayerNorms (its L
layers built at a width of 8, each norm's values then scaled to the width d: a LayerNorm
holds a weight and a bias of its width), the packed batch's loss from tokens
(one loss per real target, averaged by torch), and the hang's option read back from the
question's own table text, never by the question's formulas.

Not checked: none."""

import functools
import re

import torch
from answers_common import asked, close

import minitp as mt
from minitp.course.questions.lesson28 import LAYERS

NOT_CHECKED: set[str] = set()


@functools.cache
def _gpt_at_width_8():
    """One GPT of the most layers drawn; a GPT of L layers holds its first L blocks."""
    cfg = mt.GPTConfig(vocab_size=8, seq_len=8, n_layer=max(LAYERS), n_head=2, d_model=8)
    return mt.GPT(cfg)  # at width 8 on the CPU: 0.05 s (the meta device is slower here)


def _norm_values_at_width_8(layers: int) -> int:
    model = _gpt_at_width_8()
    kept = [*model.blocks[:layers], model.ln_f]
    return sum(q.numel() for part in kept for m in part.modules()
               if isinstance(m, torch.nn.LayerNorm) for q in m.parameters())


def test_26_norm_bytes_are_the_norms_parameters_of_a_real_gpt():
    for _, p, right in asked("28.norm-bytes"):
        values = _norm_values_at_width_8(p["L"]) * p["d"] // 8
        assert close(right, values * p["bytes"]), p


def test_26_token_mean_is_the_mean_over_every_real_token():
    for _, p, right in asked("28.token-mean"):
        tokens = torch.cat([torch.full((p["n0"],), p["l0"], dtype=torch.float64),
                            torch.full((p["n1"],), p["l1"], dtype=torch.float64)])
        assert close(right, tokens.mean()), p


def test_26_token_means_mistake_is_what_each_rank_dividing_by_its_own_count_gives():
    for q, p, right in asked("28.token-mean"):
        ranks = [torch.full((n,), loss, dtype=torch.float64)
                 for n, loss in ((p["n0"], p["l0"]), (p["n1"], p["l1"]))]
        mean_of_means = torch.stack([r.mean() for r in ranks]).mean()
        assert any(close(w.value(p), mean_of_means) for w in q.wrong), p
        assert not close(right, mean_of_means), p  # the draw tells them apart


def test_26_hang_rank_is_the_option_that_reads_the_rank_whose_row_stops_a_call_short():
    for q, p, right in asked("28.hang-rank"):
        text = q.text(p)
        rows = re.findall(r"rank (\d+): #(\d+) \w+ on \w+, (\w+)", text)
        assert len(rows) == p["world"], text
        behind = [r for r, k, _ in rows if int(k) < max(int(k) for _, k, _ in rows)]
        chosen = re.search(rf"\({right}\) ([^;]*)", text).group(1)
        assert len(behind) == 1 and chosen.startswith(f"read rank {behind[0]}'s"), (text, right)
