"""A run that survives a rank's death by a second invocation with --load (no torchrun): a
rank SIGKILLed after step 3, the run started again with --load, ends bit for bit where the
uninterrupted run ends. The same under torchrun's restart is lesson 14's first cells (they
assert the restart, the step resumed from and the bit-for-bit end): not run twice."""

import json
import os

import pytest
from helpers import run_cli

STEPS, EVERY, FAIL_AT = 6, 2, 3
FLAGS = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
         "--batch-size", "8", "--microbatches", "2", "--eval-every", str(STEPS),
         "--eval-batches", "1", "--sample-tokens", "4", "--dtype", "float64",
         "--no-progress", "--dp", "1", "--pp", "1", "--tp", "2", "--steps", str(STEPS),
         "--save-every", str(EVERY)]


def _final(folder, name):
    with open(os.path.join(folder, name, "metrics.json")) as f:
        losses = json.load(f)["train_loss"]
    with open(os.path.join(folder, f"{name}-ckpt", f"step-{STEPS}", "manifest.json")) as f:
        return losses, {k: v["sha256"] for k, v in json.load(f)["files"].items()}


@pytest.mark.ranks
def test_a_second_invocation_with_load_continues_exactly(tmp_path, monkeypatch):
    whole = run_cli(*FLAGS, "--save", str(tmp_path / "uninterrupted-ckpt"),
                    "--out", str(tmp_path / "uninterrupted"))
    assert whole.returncode == 0, whole.stderr[-2000:]
    folder, ckpt = tmp_path, str(tmp_path / "again-ckpt")
    flags = [*FLAGS, "--save", ckpt, "--out", str(folder / "again")]
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
