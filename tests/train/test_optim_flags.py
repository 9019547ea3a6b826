"""`python -m minitp.train --optimizer muon` (`minitp.train.optim_flags`): one run whose
distributed Muon equals --check's one-process Muon+AdamW in float64, and each flag Muon cannot
pair with refused in one line before any process starts (in process: no rank is launched).
"""

import json

import pytest
from helpers import run_cli
from test_flags_used_or_refused import ONE_PROCESS, TINY, _fake_checkpoint, _refused_line


def test_muon_owner_over_zero_1_equals_one_process_muon(tmp_path):
    """The owner strategy (each matrix orthogonalised at its home rank) at dp 2 under ZeRO-1
    against --check's one-process Muon: the losses of every step agree to float64's noise
    (a reference stepping Adam, or Newton-Schulz on a shard, is off by far more)."""
    done = run_cli(*TINY, "--dp", "2", "--zero-stage", "1", "--optimizer", "muon",
                   "--muon-strategy", "owner", "--steps", "2", "--check",
                   "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["max_loss_diff"] < 1e-10


REFUSED = [  # (flags, the one line's message)
    (["--muon-strategy", "owner"], "--muon-strategy owner needs --optimizer muon"),
    (["--optimizer", "muon", "--muon-strategy", "tp"], "it needs --tp > 1"),
    (["--optimizer", "muon", "--dtype", "bfloat16"], "--optimizer muon with --dtype bfloat16"),
    (["--optimizer", "muon", "--impl", "torch"], "--optimizer muon with --impl torch"),
    (["--optimizer", "muon", "--fp8", "tensorwise"], "--optimizer muon with --fp8"),
    (["--optimizer", "muon", "--save", "never-written"],  # refused before the directory is made
     "--optimizer muon with --save: Muon's checkpoints are not written yet"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSED)
def test_what_muon_cannot_pair_with_is_refused(flags, message, capsys, monkeypatch):
    assert message in _refused_line([*ONE_PROCESS, *flags], capsys, monkeypatch)


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path, capsys, monkeypatch):
    """Adam's state (every checkpoint written before --optimizer existed) cannot resume Muon."""
    adam = _fake_checkpoint(tmp_path / "adam")
    err = _refused_line([*ONE_PROCESS, "--optimizer", "muon", "--load", adam], capsys,
                        monkeypatch)
    assert "the checkpoint holds adam's optimizer state, which --optimizer muon" in err
