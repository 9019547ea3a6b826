"""`--pack`: packed documents through the command line equal the one-process model in float64
(--check), beside each kind of context parallelism, tp and a pipeline (sampled, not
enumerated); its evaluation and sample run. The refusal (a vision-language model) is in
test_train.py's BAD."""

import json
import math

import pytest
from helpers import run_cli

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "32",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress", "--steps", "2",
        "--check", "--pack"]
RUNS = {
    "ring, cp 2 x tp 2 with SP": ["--dp", "1", "--pp", "1", "--tp", "2", "--cp", "2", "--sp"],
    "a2a+ring, cp 4, llama GQA": ["--dp", "1", "--pp", "1", "--tp", "1", "--cp", "4",
                                  "--cp-comm", "a2a+ring", "--cp-a2a-size", "2",
                                  "--arch", "llama", "--n-kv-head", "2"],
    "allgather, cp 2 x pp 2 x dp 1": ["--dp", "1", "--pp", "2", "--tp", "1", "--cp", "2",
                                      "--cp-comm", "allgather", "--microbatches", "2"],
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_pack_through_the_cli_matches_one_process(name, tmp_path):
    done = run_cli(*TINY, *RUNS[name], "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["max_loss_diff"] < 1e-10 and math.isfinite(summary["eval_loss"])
