"""`python -m minitp.train`: a tiny run with --check, checkpoints through the CLI, and
bad flags answered with one clear message before any process starts.
"""

import json
import os
import subprocess
import sys

import pytest

import minitp as mt
from minitp import train

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "8", "--microbatches", "2", "--eval-every", "3", "--eval-batches", "2",
        "--sample-tokens", "8", "--dtype", "float64", "--no-progress"]


def _cli(*flags, timeout=240, env=None):
    done = subprocess.run([sys.executable, "-m", "minitp.train", *flags], capture_output=True,
                          text=True, timeout=timeout, env=env)
    return done


def _summary(done) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # the last line is the JSON


def test_tiny_run_with_check(tmp_path):
    out = tmp_path / "run"
    summary = _summary(_cli("--dp", "1", "--pp", "1", "--tp", "2", "--steps", "6", "--check",
                            "--out", str(out), *TINY))
    assert set(summary) == {"steps", "train_loss", "eval_loss", "tokens_per_s", "max_loss_diff"}
    assert summary["steps"] == 6 and summary["max_loss_diff"] < 1e-10  # float64 parity
    metrics = json.loads((out / "metrics.json").read_text())
    losses = list(metrics["train_loss"].values())
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.5  # learning, clearly
    assert list(metrics["eval_loss"]) == ["3", "6"]
    assert len(metrics["memory_per_rank"]) == 2
    assert all(m["activations"] > 0 and m["optimizer"] > 0 for m in metrics["memory_per_rank"])
    assert metrics["wire_bytes_per_axis_one_step"]["tp"] > 0
    for picture in ("loss", "memory", "comm", "timeline"):
        assert (out / f"{picture}.png").stat().st_size > 1000


def test_save_then_load_at_another_tp_continues_the_curve(tmp_path):
    def flags(steps, tp, out):
        return [*TINY, "--dp", "1", "--pp", "1", "--tp", str(tp), "--steps", str(steps),
                "--out", str(tmp_path / out)]

    _summary(_cli(*flags(6, 2, "whole")))
    whole = json.loads((tmp_path / "whole" / "metrics.json").read_text())["train_loss"]
    ckpt = str(tmp_path / "ckpt")
    _summary(_cli(*flags(3, 2, "first"), "--save", ckpt))
    resumed = _summary(_cli(*flags(6, 4, "resumed"), "--load", ckpt, "--check"))
    assert resumed["max_loss_diff"] < 1e-10  # the reference resumed from the files too
    after = json.loads((tmp_path / "resumed" / "metrics.json").read_text())["train_loss"]
    assert list(after) == ["4", "5", "6"]
    assert max(abs(after[k] - whole[k]) for k in after) < 1e-10


def test_default_topology_matches_one_process(tmp_path):
    """The default topology (dp=2 pp=2 tp=2) at a tiny size, float64: parity with one process."""
    done = _cli("--steps", "4", "--check", "--out", str(tmp_path / "run"), *TINY)
    summary = _summary(done)
    assert summary["max_loss_diff"] < 1e-10


def test_default_run_learns(tmp_path):
    """The default run, flags untouched, learns. (How long it takes is a bench
    figure, not a test: the timeout only stops a hung run.)"""
    done = _cli("--out", str(tmp_path / "run"), "--no-progress", timeout=900)
    summary = _summary(done)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    evals = list(metrics["eval_loss"].values())
    assert evals[-1] < evals[0] and summary["train_loss"] < 3.0


def test_under_torchrun(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
         "minitp.train", "--dp", "1", "--pp", "1", "--tp", "2", "--steps", "3", "--check",
         "--out", str(tmp_path / "run"), *TINY],
        capture_output=True, text=True, timeout=240, env=env)
    summary = _summary(done)
    assert summary["steps"] == 3 and summary["max_loss_diff"] < 1e-10
    assert (tmp_path / "run" / "metrics.json").exists()


BAD = [
    (["--tp", "3"], "n_head=4 is not divisible by tp=3"),
    (["--batch-size", "6"], "the batch of 6 rows cannot be cut into dp=1 slices"),
    (["--pp", "2", "--virtual-stages", "2"], "schedule '1f1b' does not fit virtual_stages=2"),
    (["--virtual-stages", "2", "--schedule", "interleaved"], "needs a pipeline (pp > 1)"),
    (["--pp", "2", "--schedule", "interleaved"],
     "schedule 'interleaved' does not fit virtual_stages=1"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "3",
      "--batch-size", "6"], "needs microbatches (3) divisible by pp (2)"),
    (["--data", "/no/such/file.txt"], "no such file"),
    (["--load", "/no/such/checkpoint"], "not a minitp checkpoint"),
    (["--schedule", "zigzag"], "invalid choice"),
    (["--seq-len", "5", "--tp", "2", "--sp"], "seq_len=5 is not divisible by tp=2"),
]


@pytest.mark.parametrize("flags,message", BAD, ids=[b[1][:24] for b in BAD])
def test_bad_flags_one_clear_message(flags, message, capsys, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started for a bad flag")

    monkeypatch.setattr(mt, "launch", no_launch)
    with pytest.raises(SystemExit) as exit_:
        train.main(["--dp", "1", "--pp", "1", "--tp", "2", "--n-head", "4", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


REFUSED = [
    (["--pp", "2", "--schedule", "interleaved"],
     "schedule 'interleaved' does not fit virtual_stages=1"),
    (["--pp", "3", "--tp", "2", "--n-layer", "6", "--schedule", "interleaved",
      "--virtual-stages", "2", "--microbatches", "4"],
     "the interleaved schedule needs microbatches (4) divisible by pp (3)"),
]


@pytest.mark.parametrize("flags,message", REFUSED, ids=["interleaved-v1", "interleaved-m4-p3"])
def test_schedule_that_cannot_run_is_refused_before_any_rank(flags, message):
    """The command line itself, as a user types it: exit code 2 and one message,
    printed by the parent. Had a rank started, its failure would come back as a
    traceback naming the rank; there is none."""
    done = _cli(*flags, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("python -m minitp.train: error: ")
    assert message in errors[0]
    assert "Traceback" not in done.stderr and "LaunchError" not in done.stderr
    assert done.stdout == ""


def test_world_size_must_match_torchrun(capsys, monkeypatch):
    monkeypatch.setattr(mt, "launch", None)
    for key, value in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="x", MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exit_:
        train.main(["--dp", "1", "--pp", "1", "--tp", "2"])
    assert exit_.value.code == 2
    assert "torchrun started 3 processes but dp*pp*tp = 2" in capsys.readouterr().err


def test_sample_is_deterministic_text():
    model = mt.GPT(mt.GPTConfig(n_layer=1, n_head=2, d_model=8, seq_len=8))
    text = train.sample(model, "def ", 20, seed=1)
    assert text.startswith("def ") and text == train.sample(model, "def ", 20, seed=1)


def test_run_pictures_draw_the_numbers():
    """minitp.viz.run, the run directory's pictures, from plain numbers."""
    from minitp import viz

    memory = [{"parameters": 2**20, "gradients": 2**21, "optimizer": 0, "activations": 3 * 2**20},
              {"parameters": 2**20, "gradients": 2**20, "optimizer": 2**22, "activations": 0}]
    ax = viz.run_memory(memory).axes[0]
    heights = {p.get_gid(): (p.get_y(), p.get_height()) for p in ax.patches}
    assert heights["memory-0-gradients"] == (1, 2) and heights["memory-1-optimizer"] == (2, 4)
    assert heights["memory-0-activations"] == (3, 3)
    ax = viz.run_wire_bytes({"tp": 3 * 2**20, "dp": 2**19}).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dp", "tp"]
    assert {p.get_gid(): p.get_height() for p in ax.patches} == {"wire-dp": 0.5, "wire-tp": 3}
    ax = viz.run_losses([1, 2, 3], [4.0, 3.5, 3.0], [(3, 3.2)], title="dp=1").axes[0]
    lines = {line.get_gid(): list(line.get_ydata()) for line in ax.lines}
    assert lines == {"line-train": [4.0, 3.5, 3.0], "line-held-out": [3.2]}
    assert ax.get_title() == "dp=1"
    with pytest.raises(ValueError, match="3 steps but 2 losses"):
        viz.run_losses([1, 2, 3], [4.0, 3.5], [])
