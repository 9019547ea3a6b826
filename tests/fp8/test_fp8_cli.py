"""`python -m minitp.train --fp8`: --check against the one-process FP8 run, and the refusals
(one line, exit 2, no process started)."""

import json
import sys

import pytest
from helpers import run_cli

from minitp import train

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress", "--steps", "2"]


@pytest.mark.parametrize("scaling", ["tensorwise", "nvfp4"])
def test_fp8_through_the_cli_equals_the_one_process_fp8_run(tmp_path, scaling):
    """tp=2 with SP: --check's one-process run casts the same microbatches (nvfp4: blocks of
    16 along d_model/tp = 16, its tensor scales' amax reduced over tp)."""
    done = run_cli(*TINY, "--dp", "1", "--pp", "1", "--tp", "2", "--sp", "--fp8", scaling,
                   "--check", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["max_loss_diff"] < 1e-9


@pytest.mark.parametrize("flags, words", [
    (["--fp8-local-scales"], "needs --fp8"),
    (["--fp8", "tensorwise", "--dtype", "bfloat16"], "cannot hold them exactly"),
    (["--fp8", "delayed", "--recompute", "full"], "twice"),
    (["--fp8", "rowwise", "--experts", "2"], "mixture of experts"),
    (["--fp8", "tensorwise", "--sp", "--tp-overlap"], "tp_overlap"),
    (["--fp8", "blockwise"], "invalid choice"),
    (["--fp8", "tensorwise", "--arch", "llama", "--n-kv-head", "1"], "replicated"),
    (["--fp8", "delayed", "--zero-stage", "3", "--fp8-all-gather"], "needs fp8 tensorwise"),
    (["--fp8", "mxfp8"], "not a whole number of blocks of 32"),  # d_model 32 over tp=2
    (["--fp8", "nvfp4", "--batch-size", "2", "--seq-len", "8"], "8 tokens"),
    (["--fp8", "mxfp8", "--zero-stage", "3", "--fp8-all-gather"], "needs fp8 tensorwise"),
])
def test_a_combination_fp8_cannot_run_is_refused(flags, words, capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started: the combination was not refused")

    monkeypatch.setattr(sys.modules["minitp.runtime.launch"], "launch", no_launch)
    with pytest.raises(SystemExit) as stopped:
        train.main([*TINY, "--dp", "1", "--pp", "1", "--tp", "2", *flags])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and words in err and len(err.splitlines()) == 1, err
