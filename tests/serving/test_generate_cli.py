"""`python -m minitp.generate`: --check at tp 2 × pp 2 in float64 equals one uncached
process (the last line's JSON: tokens equal, max_logit_diff ≤ 1e-12, prefill and decode
timed apart); bad input refused in one line, exit 2, before any process starts (the
checks of the flags alone run `validate` in this process: no launch); --dtype defaults
to the checkpoint's."""

from dataclasses import asdict

import pytest
import torch

import minitp as mt
from minitp import checkpoint
from minitp.checkpoint import files
from minitp.generate import build_parser, flags, main, validate

CFG = mt.GPTConfig.llama(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32,
                         n_kv_head=2)


def _save(directory, dtype: str) -> str:
    """A checkpoint in the form minitp.train writes (dense weights, meta with the config)."""
    weights = mt.GPT(CFG).to(getattr(torch, dtype)).state_dict()
    meta = {"format": checkpoint.FORMAT, "step": 1, "dtype": dtype, "has_optimizer": False,
            "config": asdict(CFG), "topology": {"dp": 1, "pp": 2, "tp": 2}, "extra": {}}
    files.write_checkpoint(str(directory), weights, None, meta)
    return str(directory)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("generate") / "ckpt", "float32")


@pytest.fixture(scope="module")
def saved64(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("generate64") / "ckpt", "float64")


def _validated(*flags_given):
    parser = build_parser()
    args = parser.parse_args(list(flags_given))
    validate(args, parser)
    return args


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


@pytest.mark.parametrize("checkpoint_dtype", ["float32", "float64"])
def test_dtype_defaults_to_the_checkpoints(saved, saved64, checkpoint_dtype):
    """A float64 run's --check compares float64 with float64 unless told otherwise: it ran
    in float32 and reported a 1.2e-7 difference."""
    directory = saved64 if checkpoint_dtype == "float64" else saved
    assert _validated("--load", directory).dtype == checkpoint_dtype


@pytest.mark.parametrize("flags_given, message", [
    (["--temperature", "nan"], "--temperature: temperature must be a finite number >= 0"),
    (["--temperature", "inf"], "--temperature: temperature must be a finite number >= 0"),
    (["--seed", str(2**70)], "--seed: seed must be a whole number in [-2**63, 2**64)"),
    (["--seed", str(2**64 - 1), "--pp", "2", "--batch", "2"], "draws from seed + 1, past"),
    (["--timeout", "0"], "--timeout: timeout must be a positive, finite number of seconds"),
    (["--timeout", "nan"], "--timeout: timeout must be a positive, finite number of seconds"),
    (["--timeout", "-5"], "--timeout: timeout must be a positive, finite number of seconds"),
    (["--prompt", "def \udcff"], "--prompt is not UTF-8 text"),  # argv's byte 0xff
], ids=["temperature-nan", "temperature-inf", "seed-2**70", "seed-plus-group", "timeout-0",
        "timeout-nan", "timeout-negative", "prompt-not-utf8"])
def test_a_flag_the_ranks_could_not_use_is_refused_in_one_line(saved, capsys, flags_given,
                                                                 message):
    with pytest.raises(SystemExit) as exit_:
        _validated("--load", saved, *flags_given)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_batch_this_machine_cannot_hold_is_refused(saved, capsys, monkeypatch):
    """--batch 2000000 failed on a rank with "can't allocate memory"; the parent now sets
    the run's memory (a model: minitp.generate.memory) beside what the machine has, here
    16 GiB, as minitp.train does."""
    monkeypatch.setattr(flags, "available_memory", lambda: 16 * 2**30)
    with pytest.raises(SystemExit) as exit_:
        _validated("--load", saved, "--batch", "2000000")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "this run needs about" in err and "but only 16.0 GiB is available" in err


def test_a_prompt_byte_outside_the_vocabulary_is_refused(tmp_path, capsys):
    """A model of vocabulary 10 has no row for the byte of "a" (97): that reached a rank's
    traceback ("input id 97 is outside the vocabulary"); the parent now says it in one line."""
    small = mt.GPTConfig(vocab_size=10, seq_len=8, n_layer=1, n_head=2, d_model=8)
    meta = {"format": checkpoint.FORMAT, "step": 1, "dtype": "float32", "has_optimizer": False,
            "config": asdict(small), "topology": {"dp": 1, "pp": 1, "tp": 1}, "extra": {}}
    files.write_checkpoint(str(tmp_path / "ckpt"), mt.GPT(small).state_dict(), None, meta)
    with pytest.raises(SystemExit) as exit_:
        _validated("--load", str(tmp_path / "ckpt"), "--prompt", "a")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "byte 97, outside the model's vocabulary (vocab_size=10)" in err
