"""`--cp-comm`: each context-parallel attention through the command line equals the
one-process model in float64 (--check), and so does each with `--pack` (packed documents,
evaluated packed); the CLI's refusals are in test_train.py's BAD.

Each row is a fresh launch of 2 to 4 ranks (seconds on CI's 2 cores), so a run of the
suite runs two of the six, by rotation (`helpers.rotated` over PAIRS): one unpacked, one
packed, a different pair each day (UTC), every row within three days;
MINITP_FULL_MATRIX=1 runs all six.
Between rotations each attention stays checked against one device, beside tp, pp and GQA,
through `mt.parallelize(cp_comm=...)` (tests/context_parallel/test_cp_variants.py's
test_gpt_equals_plain_gpt) and packed (tests/packing/test_packed_meshes.py); what only
these rows check is the CLI's wiring of --cp-comm, --cp-a2a-size and --pack into it."""

import json
import math

import pytest
from helpers import FULL_MATRIX_ENV, rotated, run_cli

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


UNPACKED = [name for name in RUNS if not name.startswith("--pack")]
PACKED = [name for name in RUNS if name.startswith("--pack")]
# day d: the unpacked and the packed row of index d mod 3 (two different attentions)
PAIRS = list(zip(UNPACKED, PACKED, strict=True))


def _attention(name: str) -> str:
    flags = RUNS[name]
    return flags[flags.index("--cp-comm") + 1] if "--cp-comm" in flags else "ring"


def test_the_rotation_runs_every_row_within_three_days_and_two_attentions_a_day(monkeypatch):
    monkeypatch.delenv(FULL_MATRIX_ENV, raising=False)
    days = [pair for day in range(739_000, 739_003) for pair in rotated(PAIRS, day)]
    assert sorted(name for pair in days for name in pair) == sorted(RUNS)
    assert all(_attention(unpacked) != _attention(packed) for unpacked, packed in days)


@pytest.mark.parametrize("name", [name for pair in rotated(PAIRS) for name in pair])
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
