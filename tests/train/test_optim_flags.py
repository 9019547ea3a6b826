"""`python -m minitp.train --optimizer muon` (`minitp.train.optim_flags`): one run whose
distributed Muon equals --check's one-process Muon+AdamW in float64 and whose checkpoint
holds Muon's state, and each flag Muon cannot pair with refused in one line before any
process starts (in process: no rank is launched).
"""

import json

import pytest
from helpers import run_cli
from test_flags_used_or_refused import ONE_PROCESS, TINY, _fake_checkpoint, _refused_line

from minitp import checkpoint
from minitp.optim import state as muon_state


@pytest.fixture(scope="module")
def muon_run(tmp_path_factory):
    """The owner strategy (each matrix orthogonalised at its home rank) at dp 2 under ZeRO-1,
    2 steps with --check, saved at the end: (its summary, the checkpoint)."""
    where = tmp_path_factory.mktemp("muon")
    done = run_cli(*TINY, "--dp", "2", "--zero-stage", "1", "--optimizer", "muon",
                   "--muon-strategy", "owner", "--steps", "2", "--check",
                   "--save", str(where / "ckpt"), "--out", str(where / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), str(where / "ckpt")


def test_muon_owner_over_zero_1_equals_one_process_muon(muon_run):
    """--check's one-process Muon+AdamW: every step's loss agrees to float64's noise (a
    reference stepping Adam, or Newton-Schulz on a shard, is off by far more)."""
    assert muon_run[0]["max_loss_diff"] < 1e-10


def test_the_checkpoint_holds_muons_state(muon_run):
    """What --load reads to resume Muon, or to refuse Adam (resharding it:
    tests/checkpoint/test_muon_checkpoint.py)."""
    meta = checkpoint.read_meta(muon_run[1])
    assert meta["extra"]["optimizer"] == "muon" and meta["has_optimizer"]
    assert set(checkpoint.load_dense(muon_run[1])[2]) == {"step", *muon_state.KEYS}


REFUSED = [  # (flags, the one line's message)
    (["--muon-strategy", "owner"], "--muon-strategy owner needs --optimizer muon"),
    (["--optimizer", "muon", "--muon-strategy", "tp"], "it needs --tp > 1"),
    (["--optimizer", "muon", "--dtype", "bfloat16"], "--optimizer muon with --dtype bfloat16"),
    (["--optimizer", "muon", "--impl", "torch"], "--optimizer muon with --impl torch"),
    (["--optimizer", "muon", "--fp8", "tensorwise"], "--optimizer muon with --fp8"),
    (["--optimizer", "muon", "--save", "never-written", "--save-every", "1"],
     "--optimizer muon with --save-every: sharded saves of Muon's state are not written yet"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSED)
def test_what_muon_cannot_pair_with_is_refused(flags, message, capsys, monkeypatch):
    assert message in _refused_line([*ONE_PROCESS, *flags], capsys, monkeypatch)


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path, capsys, monkeypatch):
    """Adam's state (every checkpoint written before --optimizer existed) cannot resume Muon
    (nor Muon's Adam: the same check)."""
    adam = _fake_checkpoint(tmp_path / "adam")
    err = _refused_line([*ONE_PROCESS, "--optimizer", "muon", "--load", adam], capsys,
                        monkeypatch)
    assert "the checkpoint holds adam's optimizer state, which --optimizer muon" in err
