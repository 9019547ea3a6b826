"""`python -m minitp.generate`: --check at tp 2 × pp 2 in float64 equals one uncached
process (the last line's JSON: tokens equal, max_logit_diff ≤ 1e-12, prefill and decode
timed apart); bad input refused in one line, exit 2, before any process starts."""

from dataclasses import asdict

import pytest

import minitp as mt
from minitp import checkpoint
from minitp.checkpoint import files
from minitp.generate import main

CFG = mt.GPTConfig.llama(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32,
                         n_kv_head=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint in the form minitp.train writes (dense weights, meta with the config)."""
    directory = str(tmp_path_factory.mktemp("generate") / "ckpt")
    weights = mt.GPT(CFG).state_dict()
    meta = {"format": checkpoint.FORMAT, "step": 1, "dtype": "float32", "has_optimizer": False,
            "config": asdict(CFG), "topology": {"dp": 1, "pp": 2, "tp": 2}, "extra": {}}
    files.write_checkpoint(directory, weights, None, meta)
    return directory


def test_check_over_tp_and_pp_equals_one_process(saved, capsys):
    summary = main(["--load", saved, "--tp", "2", "--pp", "2", "--batch", "3", "--tokens", "14",
                    "--temperature", "1", "--dtype", "float64", "--check"])
    assert summary["tokens_equal"] and summary["max_logit_diff"] <= 1e-12
    assert summary["prefill_s"] > 0 and summary["decode_tokens_per_s"] > 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"tp": 2')


@pytest.mark.parametrize("flags, message", [
    (["--prompt", "x" * 17], "longer than the model's window seq_len=16"),
    (["--tp", "3"], "not divisible by tp=3"),
    (["--pp", "3"], "n_layer=2 is not divisible"),
    (["--load", "/nonexistent/ckpt"], "--load /nonexistent/ckpt"),
])
def test_bad_input_is_refused_in_one_line(saved, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["--load", saved, *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
