"""`python -m minitp.train --refit-every` (`minitp.train.refit_flags`): a tp-2 trainer refit
every step onto a tp-2 generator on ranks of its own, generating from the held-out text:
--check's last line holds a log-prob difference of 0 in float64, metrics.json each refit's
bytes (from the trace, equal to the plan's); what no run can do is refused in one line
before any process starts."""

import json
import re
import sys

import pytest

from minitp import train

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress"]


@pytest.mark.ranks
def test_refit_every_step_onto_separate_ranks_gives_a_zero_logprob_diff(tmp_path, capsys):
    train.main([*TINY, "--dp", "1", "--pp", "1", "--tp", "2", "--steps", "1", "--check",
                "--refit-every", "1", "--serve-tp", "2", "--serve-ranks", "separate",
                "--out", str(tmp_path / "run")])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["max_loss_diff"] == 0.0  # --check's own key, kept
    assert last["max_logprob_diff"] == 0.0  # the generator's forward: the trainer's, exactly
    assert 0.0 <= last["decode_logprob_gap"] <= 1e-12  # through its KV cache: an ulp at most
    refits = json.loads((tmp_path / "run" / "metrics.json").read_text())["refits"]
    assert [r["step"] for r in refits] == [1]
    (done,) = refits
    # separate ranks hold nothing of the trainer's: every weight received, once (MEASURED
    # in the trace, equal to the plan), and each of the 2 serving ranks its half of the
    # split weights and all of the replicated ones
    assert done["received_bytes"] == done["planned_bytes"] == done["minimum_bytes"] > 0
    assert done["local_bytes"] == 0 and done["seconds"] > 0
    assert last["refit_received_bytes"] == done["received_bytes"]


@pytest.mark.parametrize("flags, env, message", [
    (["--tp", "1", "--refit-every", "1", "--serve-tp", "3"], {}, "not divisible by tp=3"),
    (["--tp", "2", "--refit-every", "1", "--serve-tp", "4"], {},
     "does not tile the 2 training ranks"),
    (["--tp", "2", "--refit-every", "1", "--serve-tp", "2", "--serve-ranks", "separate"],
     {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"},
     "2 training \\+ 2 serving ranks = 4, but the world holds 2"),
    (["--tp", "1", "--serve-tp", "2"], {}, "--serve-tp needs --refit-every N"),
])
def test_a_refit_no_run_can_make_is_one_line_before_any_process(flags, env, message, capsys,
                                                                 monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started: the refit was not refused")

    monkeypatch.setattr(sys.modules["minitp.runtime.launch"], "launch", no_launch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        train.main([*TINY, "--dp", "1", "--pp", "1", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
