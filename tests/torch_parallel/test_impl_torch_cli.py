"""`python -m minitp.train --impl torch`: the run on PyTorch's own parallelism equals the
one-process model in float64 (--check), and what torch's path cannot do is refused in one
line, exit 2, before any process starts."""

import json

from helpers import run_cli

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress", "--steps", "2"]


def test_torch_impl_through_the_cli_matches_one_process(tmp_path):
    """--zero-stage left out: over dp 2 torch's path runs FSDP2 (stage 3), not a refusal."""
    done = run_cli(*TINY, "--check", "--impl", "torch", "--dp", "2", "--pp", "1", "--tp", "2",
                   "--sp", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["max_loss_diff"] < 1e-10


REFUSED = {  # flags -> what the one line must name
    ("--impl", "torch", "--pp", "2"): "no pipeline",
    ("--impl", "torch", "--pp", "1", "--cp", "2"): "no context parallelism",
    ("--impl", "torch", "--pp", "1", "--arch", "llama"): "--arch llama",
    ("--impl", "torch", "--pp", "1", "--arch", "vlm"): "vision-language",
    ("--impl", "torch", "--pp", "1", "--experts", "4"): "mixture of experts",
    ("--impl", "torch", "--pp", "1", "--zero-stage", "1"): "--zero-stage 3",
    ("--impl", "torch", "--pp", "1", "--zero-stage", "3", "--hsdp", "3"): "dividing dp",
    ("--hsdp", "2"): "--hsdp needs --impl torch",
}


def test_what_torch_impl_cannot_do_is_refused_in_one_line():
    for flags, named in REFUSED.items():
        done = run_cli(*TINY, *flags)
        assert done.returncode == 2, (flags, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr, (flags,
                                                                                   done.stderr)
        assert "minitp" in done.stderr, done.stderr  # it names what to use instead
