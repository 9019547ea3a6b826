"""MoE parallel folding through the command line (issue 52, item 5): ``--ep``/``--etp``
with ``--fold`` compose with the mesh flags, ``--check`` (equal to one float64 process)
and ``--save``/``--load`` (the experts resharded from one folded layout to another);
a layout the rules refuse is refused in one line before any process starts."""

import json
import sys

import pytest
from helpers import run_cli

from minitp import train

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "10", "--eval-batches", "1",
        "--sample-tokens", "1", "--dtype", "float64", "--no-progress", "--experts", "4"]


def _summary(done) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.ranks
def test_folded_ep_then_etp_check_and_reshard(tmp_path):
    """A step at (tp 2, ep 2) folded without SP (ep spans tp: each tp rank routes its half
    of the sequence to the other's experts too), equal to one process, saved; resumed at
    (tp 2, etp 2) with SP for one more, equal to one process loaded likewise (the experts
    and their Adam state resharded from two whole experts a rank to halves of all four)."""
    ckpt = str(tmp_path / "ckpt")
    first = _summary(run_cli(*TINY, "--dp", "1", "--tp", "2", "--ep", "2", "--fold", "--no-sp",
                             "--steps", "1", "--check", "--save", ckpt,
                             "--out", str(tmp_path / "first")))
    assert first["max_loss_diff"] < 1e-10
    resumed = _summary(run_cli(*TINY, "--dp", "1", "--tp", "2", "--etp", "2",
                               "--sp", "--steps", "2", "--load", ckpt, "--check",
                               "--out", str(tmp_path / "resumed")))
    assert resumed["max_loss_diff"] < 1e-10
    after = json.loads((tmp_path / "resumed" / "metrics.json").read_text())["train_loss"]
    assert list(after) == ["2"]


BAD = [
    (["--ep", "4", "--dp", "2"], "ep=4 does not divide dp*cp=2: unfolded"),
    (["--ep", "4", "--dp", "2", "--etp", "2"], "ep*etp=4*2=8 does not divide dp*cp*tp=2*1*2=4"),
    (["--ep", "2", "--dp", "2", "--etp", "0"], "--etp must be at least 1"),
    (["--ep", "1", "--dp", "2", "--etp", "3"], "ep*etp=1*3=3 does not divide dp*cp*tp"),
    (["--ep", "2", "--fold", "--no-sp", "--seq-len", "15"], "seq_len=15 (/cp=1) cannot be cut"),
]


@pytest.mark.parametrize("flags,message", BAD, ids=[b[1][:24] for b in BAD])
def test_bad_folding_flags_one_clear_line(flags, message, capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started for a bad flag")
    monkeypatch.setattr(sys.modules["minitp.runtime.launch"], "launch", no_launch)
    with pytest.raises(SystemExit) as exit_:
        train.main([*TINY, "--tp", "2", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith("python -m minitp.train: error: ")
