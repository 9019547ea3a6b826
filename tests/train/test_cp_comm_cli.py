"""`--cp-comm`: each context-parallel attention through the command line equals the
one-process model in float64 (--check), and so does each with `--pack` (packed documents,
evaluated packed); the CLI's refusals are in test_train.py's BAD."""

import json
import math

import pytest
from helpers import run_cli

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress", "--steps", "2",
        "--check"]
RUNS = {  # sampled, not enumerated: each variant once, beside tp or a pipeline
    "a2a+ring, cp 4 (groups of 2), llama GQA": ["--dp", "1", "--pp", "1", "--tp", "1",
                                                 "--cp", "4", "--cp-comm", "a2a+ring",
                                                 "--cp-a2a-size", "2", "--arch", "llama",
                                                 "--n-kv-head", "2"],
    "allgather, cp 2 x tp 2 with SP": ["--dp", "1", "--pp", "1", "--tp", "2", "--cp", "2",
                                       "--cp-comm", "allgather"],
    "a2a, cp 2 x pp 2": ["--dp", "1", "--pp", "2", "--tp", "1", "--cp", "2",
                         "--cp-comm", "a2a", "--microbatches", "2"],
    # packed documents, each variant once more (a2a alone: in the hybrid)
    "--pack, ring, cp 2 x tp 2 with SP": ["--pack", "--dp", "1", "--pp", "1", "--tp", "2",
                                          "--cp", "2", "--sp"],
    "--pack, a2a+ring, cp 4, llama GQA": ["--pack", "--dp", "1", "--pp", "1", "--tp", "1",
                                          "--cp", "4", "--cp-comm", "a2a+ring",
                                          "--cp-a2a-size", "2", "--arch", "llama",
                                          "--n-kv-head", "2"],
    "--pack, allgather, cp 2 x pp 2": ["--pack", "--dp", "1", "--pp", "2", "--tp", "1",
                                       "--cp", "2", "--cp-comm", "allgather",
                                       "--microbatches", "2"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_cp_comm_through_the_cli_matches_one_process(name, tmp_path):
    done = run_cli(*TINY, *RUNS[name], "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["max_loss_diff"] < 1e-10 and math.isfinite(summary["eval_loss"])


def test_a_checkpoint_saved_under_one_attention_resumes_under_another(tmp_path):
    """--cp-comm changes how a step runs, not what is saved: a ring run's checkpoint resumes
    under Ulysses, equal to one process (--check, from the files)."""
    ckpt, mesh = str(tmp_path / "ckpt"), ["--dp", "1", "--pp", "1", "--tp", "1", "--cp", "2"]
    first = run_cli(*TINY, *mesh, "--save", ckpt, "--out", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    three_steps = [*TINY[:TINY.index("--steps")], "--steps", "3", "--check"]
    resumed = run_cli(*three_steps, *mesh, "--cp-comm", "a2a", "--load", ckpt,
                      "--out", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert summary["max_loss_diff"] < 1e-10
