"""`minitp.fp8.block_shards` in one process: ZeRO-3's even split against block-atomic
shards (`shard_bounds`), the cut block's cast per rank (`shard_errors`), and the tp split
whose local K is not whole blocks, refused in one line. (Across real ranks, with the codes
on the wire: tests/fp8/test_meshes.py.)"""

import pytest
import torch

import minitp as mt
from minitp.fp8 import block_shards


def test_block_atomic_bounds_are_whole_blocks_and_cover_the_vector():
    assert block_shards.shard_bounds(100, 3) == [(0, 34), (34, 68), (68, 100)]
    assert block_shards.shard_bounds(100, 3, block=32) == [(0, 64), (64, 100), (100, 100)]


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_a_cut_block_differs_on_the_ranks_beside_the_cut_and_whole_blocks_are_exact(recipe):
    """A (48, 64) weight over 5 ranks: ZeRO's 615 values a rank start inside blocks."""
    weight = torch.randn(48, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cut = block_shards.shard_errors(weight, 5, recipe, atomic=False)
    assert all(r["differ"] > 0 for r in cut[1:]), cut  # each starts inside a block
    fixed = block_shards.shard_errors(weight, 5, recipe, atomic=True)
    assert all(r == {"differ": 0, "max_error": 0.0} for r in fixed), fixed


def test_a_tp_split_that_cuts_a_block_changes_the_cast_and_whole_blocks_do_not():
    """d_in 96 over tp=2: 48 values a rank, so rank 1's first MXFP8 block is the tail of one
    device's second; over tp=3, 32 a rank: exact."""
    weight = torch.randn(8, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cut = block_shards.tp_errors(weight, 2, "mxfp8")
    assert cut[1]["differ"] > 0 and cut[1]["max_error"] > 1e-3, cut
    assert all(r == {"differ": 0, "max_error": 0.0}
               for r in block_shards.tp_errors(weight, 3, "mxfp8"))


def test_a_tp_split_whose_local_k_is_not_whole_blocks_is_refused():
    """d_model 64 over tp=4: 16 values a rank, half an MXFP8 block (NVFP4's 16 fit)."""
    cfg = mt.GPTConfig(vocab_size=16, seq_len=32, n_layer=1, n_head=4, d_model=64)
    with pytest.raises(ValueError, match="not a whole number of blocks of 32") as refused:
        mt.rules.fp8_groups.check_fp8_blocks(cfg, "mxfp8", tp=4)
    assert len(str(refused.value).splitlines()) == 1
    mt.rules.fp8_groups.check_fp8_blocks(cfg, "nvfp4", tp=4)
