"""A run that survives: a rank SIGKILLed mid-run, torchrun restarts the group, the run
resumes from the newest complete sharded checkpoint and ends bit for bit where the
uninterrupted run ends; and the same by a second invocation with --load, no torchrun."""

import json
import os

import pytest
from helpers import run_cli

from minitp.train.restart import kill_and_restart

STEPS, EVERY, FAIL_AT = 6, 2, 3


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    """The torchrun job killed at step 3 and restarted, beside the uninterrupted run."""
    folder = tmp_path_factory.mktemp("restart")
    return folder, kill_and_restart(str(folder), dp=1, tp=2, steps=STEPS, every=EVERY,
                                    fail_at=FAIL_AT)


@pytest.mark.ranks  # kill_and_restart starts torchrun
def test_torchrun_restarts_a_killed_rank_and_ends_bit_identical(restarted):
    _, result = restarted
    assert "exitcode: -9" in result["log"]  # the SIGKILL torchrun saw, before restarting
    assert result["resumed_from"] == 2  # the newest complete checkpoint when rank 1 died
    assert result["resumed"] == {s: result["uninterrupted"][s] for s in range(3, STEPS + 1)}
    assert result["same_final_loss"] and result["same_parameters"]


def _final(folder, name):
    with open(os.path.join(folder, name, "metrics.json")) as f:
        losses = json.load(f)["train_loss"]
    with open(os.path.join(folder, f"{name}-ckpt", f"step-{STEPS}", "manifest.json")) as f:
        return losses, {k: v["sha256"] for k, v in json.load(f)["files"].items()}


@pytest.mark.ranks
def test_a_second_invocation_with_load_continues_exactly(restarted, monkeypatch):
    folder, _ = restarted
    ckpt = str(folder / "again-ckpt")
    flags = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
             "--batch-size", "8", "--microbatches", "2", "--eval-every", str(STEPS),
             "--eval-batches", "1", "--sample-tokens", "4", "--dtype", "float64",
             "--no-progress", "--dp", "1", "--pp", "1", "--tp", "2", "--steps", str(STEPS),
             "--save-every", str(EVERY), "--save", ckpt, "--out", str(folder / "again")]
    monkeypatch.setenv("MINITP_FAIL_AT_STEP", str(FAIL_AT))
    assert run_cli(*flags).returncode == 1  # rank 1 killed itself after step 3
    # (the writer's lock file stays; the killed run's lock went with it: `writer_lock`)
    assert sorted(os.listdir(ckpt)) == [".minitp-writer.lock", "step-2"]
    monkeypatch.delenv("MINITP_FAIL_AT_STEP")
    done = run_cli(*flags, "--load", ckpt)
    assert done.returncode == 0, done.stderr[-2000:]
    losses, hashes = _final(folder, "again")
    reference_losses, reference_hashes = _final(folder, "uninterrupted")
    assert losses == {k: v for k, v in reference_losses.items() if int(k) > 2}
    assert hashes == reference_hashes
    assert sorted(os.listdir(ckpt)) == [".minitp-writer.lock", "step-4", "step-6"]  # --keep 2
