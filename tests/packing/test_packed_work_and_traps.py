"""The load-balanced split's work counted per document, and packing's two traps, on one
device (no processes): each trap differs from the one-device packed result, its fix equals
it."""

from __future__ import annotations

import pytest
import torch

import minitp as mt
from minitp.context_parallel.packed import (
    causal_work,
    positions_trap,
    rank_tokens,
    unweighted_loss_trap,
)
from minitp.data.packing import pack
from minitp.model.attention_core import keep_mask

TOLERANCE = 1e-12
GPT2 = dict(vocab_size=16, seq_len=16, n_layer=2, n_head=2, d_model=16)
LLAMA = dict(GPT2, norm="rmsnorm", positions="rope", mlp="swiglu", bias=False, n_kv_head=1)


def _packed(lengths, seq_len=16, vocab=16):
    generator = torch.Generator().manual_seed(5)
    return pack([torch.randint(0, vocab, (n,), generator=generator) for n in lengths], seq_len)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_ranks_work_is_what_the_mask_keeps_for_its_queries(cp):
    _, _, positions = _packed([3, 9, 2, 14, 5, 1])  # 34 tokens: two rows of 17
    T = positions.shape[1]
    by_mask = [int(keep_mask(positions, rank_tokens(T, cp, r), torch.arange(T)).sum())
               for r in range(cp)]
    assert causal_work(positions, cp) == by_mask


def test_unpacked_the_split_balances_the_work_packed_it_need_not():
    _, _, positions = _packed([3, 9, 2, 14, 5, 1])
    plain = causal_work(torch.arange(16)[None], 2)
    assert plain[0] == plain[1]
    packed = causal_work(positions, 2)
    assert packed[0] != packed[1], packed


def _model(arch):
    torch.manual_seed(0)
    return mt.GPT(mt.GPTConfig(**arch)).double()


@pytest.mark.parametrize("arch", [GPT2, LLAMA], ids=["learned", "rope"])
def test_positions_that_do_not_restart_are_wrong_restarting_is_right(arch):
    x, y, positions = _packed([4, 7, 6, 12, 5])
    losses = positions_trap(_model(arch), x, y, positions)
    assert abs(losses["restarting"] - losses["one by one"]) < TOLERANCE
    assert abs(losses["positions 0..T-1"] - losses["one by one"]) > 1e-6


@pytest.mark.parametrize("axis,ranks", [("cp", 2), ("cp", 4), ("dp", 2)])
def test_a_mean_of_rank_means_is_wrong_token_weighting_is_right(axis, ranks):
    x, y, positions = _packed([4, 7, 6, 5])  # 22 tokens: the second row mostly padding
    losses = unweighted_loss_trap(_model(GPT2), x, y, positions, ranks, axis)
    assert len(set(losses["counts"])) > 1, losses["counts"]  # else the trap could not show
    assert abs(losses["token-weighted"] - losses["one device"]) < TOLERANCE
    assert abs(losses["mean of means"] - losses["one device"]) > 1e-6
