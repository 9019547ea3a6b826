"""`python -m minitp.train --arch mla` and `python -m minitp.generate` on its checkpoint:
one short run at cp 2 × tp 2 with SP (the latent all-gathered over cp), --kv-lora-rank,
--q-lora-rank and --rope-dim given, equal to the one-process model in float64 (--check),
saved; the checkpoint decoded absorbed over tp 2 equal to one uncached process in float64
(generate --check). Refusals in one line before any process starts: an odd --rope-dim, a
size without --arch mla, --n-kv-head with it, a cp variant other than the latent's gather,
heads tp cannot split, a size that contradicts the checkpoint."""

import json

import pytest
from helpers import run_cli

import minitp as mt
from minitp.generate import main as generate_main

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "100", "--eval-batches",
        "1", "--sample-tokens", "4", "--dtype", "float64", "--no-progress", "--steps", "2"]
MLA = ["--arch", "mla", "--kv-lora-rank", "16", "--q-lora-rank", "8", "--rope-dim", "4"]
ONE = ["--dp", "1", "--pp", "1"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("mla")
    done = run_cli(*TINY, *MLA, *ONE, "--cp", "2", "--cp-comm", "allgather", "--tp", "2",
                   "--check", "--save", str(where / "ckpt"), "--out", str(where / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), str(where / "ckpt")


@pytest.mark.ranks
def test_mla_trains_at_cp_and_tp_like_one_process_and_decodes_over_tp(saved, capsys):
    summary, ckpt = saved
    assert summary["max_loss_diff"] < 1e-10, summary
    config = mt.checkpoint.read_meta(ckpt)["config"]
    assert (config["kv_lora_rank"], config["q_lora_rank"], config["rope_dim"]) == (16, 8, 4)
    decoded = generate_main(["--load", ckpt, "--tp", "2", "--batch", "2", "--tokens", "6",
                             "--temperature", "0", "--dtype", "float64", "--check"])
    assert decoded["tokens_equal"] and decoded["max_logit_diff"] <= 1e-12, decoded


@pytest.mark.parametrize("flags, words", [
    ([*MLA[:-1], "3"], "rope_dim=3 is odd"),
    (["--rope-dim", "4"], "--rope-dim needs --arch mla"),
    (["--arch", "mla", "--n-kv-head", "2"], "--n-kv-head 2 with --arch mla"),
    (["--arch", "mla", "--cp", "2", "--tp", "2"], "cp_comm='ring' with latent attention"),
    (["--arch", "mla", "--tp", "8"], "not divisible by tp=8"),
])
def test_refusals_come_in_one_line_before_any_process(flags, words):
    done = run_cli(*TINY, *ONE, *(["--tp", "2"] if "--tp" not in flags else []), *flags)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_size_the_checkpoint_fixes_is_refused(saved):
    done = run_cli(*TINY, *ONE, "--tp", "2", "--steps", "3", "--load", saved[1],
                   "--kv-lora-rank", "8")
    assert done.returncode == 2 and "--kv-lora-rank 8: the checkpoint's model has 16" in done.stderr
