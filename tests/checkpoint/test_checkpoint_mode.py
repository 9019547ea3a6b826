"""A checkpoint gets the umask's mode, like any file the user writes: under umask 022 a
classmate on a shared course machine can read it (its directory was once always 0700,
made by mkdtemp and renamed into place). The write stays atomic (tests/checkpoint/
test_checkpoint.py kills saves at every step of it)."""

import os
import stat
from dataclasses import asdict

import pytest
import torch

import minitp as mt
from minitp import checkpoint
from minitp.checkpoint import files


def _save(directory: str, step: int) -> None:
    weights = mt.GPT(mt.GPTConfig(n_layer=1, n_head=2, d_model=8, seq_len=8)).state_dict()
    meta = {"format": checkpoint.FORMAT, "step": step, "dtype": "float32", "has_optimizer": True,
            "config": asdict(mt.GPTConfig(n_layer=1, n_head=2, d_model=8, seq_len=8)),
            "topology": {"dp": 1, "pp": 1, "tp": 1}, "extra": {}}
    optim = {"step": torch.tensor(1.0), "exp_avg": weights, "exp_avg_sq": weights}
    files.write_checkpoint(directory, weights, optim, meta)


@pytest.mark.parametrize("umask,directory_mode,file_mode",
                         [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)])
def test_a_checkpoint_has_the_umasks_mode(tmp_path, umask, directory_mode, file_mode):
    directory = tmp_path / "ckpt"
    previous = os.umask(umask)
    try:
        for step in (1, 2):  # a new checkpoint, then one that replaces it
            _save(str(directory), step)
            assert stat.S_IMODE(directory.stat().st_mode) == directory_mode, (oct(umask), step)
            for name in ("model.pt", "optimizer.pt", "meta.json"):
                mode = stat.S_IMODE((directory / name).stat().st_mode)
                assert mode == file_mode, (oct(umask), step, name)
    finally:
        os.umask(previous)
    assert checkpoint.read_meta(str(directory))["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # nothing left beside it
