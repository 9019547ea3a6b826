"""Every flag of `python -m minitp.train` is used or refused, never silently ignored
(`minitp.train.model_flags`): with --load a flag the checkpoint fixes is refused if it
differs and a routing flag is applied; a mixture of experts' flag without --experts is
refused; metrics.json's ``args`` say what ran; a one-process run prints no warning.

The refusals are checked in process (the parent refuses before any rank starts); two
tiny one-process runs check what only a run shows.
"""

import hashlib
import io
import json
import re
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from helpers import run_cli

import minitp as mt
from minitp import checkpoint, data, train
from minitp.checkpoint import writer_lock
from minitp.model.config import LLAMA_PARTS

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "1", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress",
        "--dp", "1", "--pp", "1", "--tp", "1"]
ONE_PROCESS = ["--dp", "1", "--pp", "1", "--tp", "1", "--steps", "5"]


def _no_launch(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started: the flag was not refused")

    monkeypatch.setattr(sys.modules["minitp.runtime.launch"], "launch", no_launch)


def _fake_checkpoint(directory, dtype="float32", **config):
    """A checkpoint whose meta.json holds `config` (and placeholder tensors, sealed in its
    manifest): all that the checks before any process starts read."""
    directory.mkdir()
    files = {}
    for name in ("model.pt", "optimizer.pt"):
        buffer = io.BytesIO()
        torch.save({"placeholder": torch.zeros(1)}, buffer)
        (directory / name).write_bytes(buffer.getvalue())
        files[name] = {"bytes": len(buffer.getvalue()),
                       "sha256": hashlib.sha256(buffer.getvalue()).hexdigest()}
    sizes = dict(vocab_size=data.VOCAB_SIZE, n_layer=2, d_model=32, n_head=4, seq_len=16)
    meta = {"format": checkpoint.FORMAT, "config": asdict(mt.GPTConfig(**sizes, **config)),
            "step": 3, "dtype": dtype, "topology": {"dp": 1, "pp": 1, "tp": 1},
            "has_optimizer": True, "extra": {}, "files": files}
    (directory / "meta.json").write_text(json.dumps(meta))
    return str(directory)


@pytest.fixture
def checkpoints(tmp_path):
    return {
        "dense": _fake_checkpoint(tmp_path / "dense"),
        "llama": _fake_checkpoint(tmp_path / "llama", **LLAMA_PARTS, n_kv_head=2),
        "moe": _fake_checkpoint(tmp_path / "moe", n_experts=4, top_k=2, balance="aux"),
    }


REFUSED_ON_LOAD = [  # (checkpoint, flags, the one line's message)
    ("llama", ["--n-kv-head", "4"], "--n-kv-head 4: the checkpoint's model has 2 K/V heads "
                                    "(they fix its attention's weights; leave --n-kv-head out)"),
    ("dense", ["--n-kv-head", "4"], "--n-kv-head 4: the checkpoint's model is gpt2, one K/V "
                                    "head per query head"),
    ("dense", ["--dtype", "float64"], "--dtype float64: the checkpoint's weights are float32 "
                                      "and resume so (leave --dtype out)"),
    ("moe", ["--experts", "0"], "--experts 0: the checkpoint's model has 4 (leave --experts out)"),
    ("dense", ["--top-k", "1"], "--top-k 1: the checkpoint's model is dense, with no router to "
                                "set (leave --top-k out)"),
    ("dense", ["--capacity-factor", "1.5"], "--capacity-factor 1.5: the checkpoint's model is "
                                            "dense"),
    ("dense", ["--balance", "bias"], "--balance bias: the checkpoint's model is dense"),
    ("moe", ["--top-k", "5"], "top_k=5 is more than n_experts=4"),  # applied, then checked
]


@pytest.mark.parametrize("which,flags,message", REFUSED_ON_LOAD,
                         ids=[f"{c[0]}{'_'.join(c[1])}" for c in REFUSED_ON_LOAD])
def test_a_flag_the_checkpoint_fixes_is_refused_on_load(which, flags, message, checkpoints,
                                                        capsys, monkeypatch):
    _no_launch(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        train.main([*ONE_PROCESS, "--load", checkpoints[which], *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flags", [["--top-k", "1"], ["--capacity-factor", "1.25"],
                                   ["--balance", "bias"], ["--capacity-factor", "dropless"]])
def test_an_moe_flag_without_experts_is_refused(flags, capsys, monkeypatch):
    """Once a dense run trained, the flag dropped; now one line names it and what to add."""
    _no_launch(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        train.main([*ONE_PROCESS, *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"python -m minitp.train: error: {flags[0]} {flags[1]}: a dense model has no "
                   "router to set; add --experts E for a mixture of E experts (--help lists "
                   "every flag)\n")


def _validated(argv):
    parser = train.build_parser()
    args = parser.parse_args(argv)
    cfg = train.validate(args, parser)[0]
    return args, cfg


def test_the_routing_flags_apply_on_load_and_args_say_what_runs(checkpoints):
    """The routing a resumed run may change is applied; everything else is the
    checkpoint's, and args (metrics.json's "args") show it, not the flags' defaults."""
    args, cfg = _validated([*ONE_PROCESS, "--load", checkpoints["moe"], "--top-k", "1",
                            "--capacity-factor", "1.5", "--balance", "none"])
    assert (cfg.top_k, cfg.capacity_factor, cfg.balance) == (1, 1.5, "none")
    assert (args.top_k, args.capacity_factor, args.balance) == (1, 1.5, "none")
    args, cfg = _validated([*ONE_PROCESS, "--load", checkpoints["moe"]])
    assert (args.top_k, args.capacity_factor, args.balance) == (2, "dropless", "aux")
    assert (args.n_layer, args.d_model, args.seq_len, args.experts) == (2, 32, 16, 4)
    assert (args.arch, args.dtype) == ("gpt2", "float32")
    args, cfg = _validated([*ONE_PROCESS, "--load", checkpoints["llama"], "--n-kv-head", "2"])
    assert (args.arch, args.n_kv_head, cfg.n_kv_head) == ("llama", 2, 2)
    assert (args.experts, args.top_k, args.capacity_factor, args.balance) == (0, None, None, None)
    args, cfg = _validated([*ONE_PROCESS, "--experts", "4", "--capacity-factor", "2"])
    assert (args.top_k, args.capacity_factor, args.balance) == (2, 2.0, "aux")
    assert (cfg.top_k, cfg.capacity_factor, cfg.balance) == (2, 2.0, "aux")


def test_help_says_what_load_does_with_each_model_flag():
    """Each model flag's --help says whether --load keeps the checkpoint's or applies it."""
    helps = {a.option_strings[0]: a.help for a in train.build_parser()._actions}
    for flag in ("--arch", "--n-kv-head", "--experts", "--n-layer", "--dtype"):
        assert "with --load, the checkpoint's" in helps[flag], flag
    for flag in ("--top-k", "--capacity-factor", "--balance"):
        assert "needs --experts" in helps[flag], flag
        assert "with --load, the checkpoint's unless given, and then" in helps[flag], flag
    assert ("a size, --arch, --n-kv-head, --experts or --dtype that differs is refused; "
            "--top-k, --capacity-factor, --balance apply") in helps["--load"]


def _cli(*flags):
    return subprocess.run([sys.executable, "-m", "minitp.train", *flags], capture_output=True,
                          text=True, timeout=240)


def test_one_process_run_is_quiet_and_a_resumed_run_uses_its_routing(tmp_path):
    """Two tiny one-process runs of a mixture of experts: the first writes nothing to
    stderr (comm.png once drew no bars and matplotlib warned of identical ylims); the
    second resumes it with another top-k, capacity factor and balance, which its ranks
    and --check's reference both run (equal losses) and metrics.json and the checkpoint
    it saves record."""
    ckpt, again = str(tmp_path / "ckpt"), str(tmp_path / "again")
    first = _cli(*TINY, "--experts", "4", "--steps", "2", "--save", ckpt,
                 "--out", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr == ""
    assert (tmp_path / "first" / "comm.png").stat().st_size > 1000
    # the resume reads no stderr: in this process (`run_cli`), no second Python start
    resumed = run_cli(*TINY, "--steps", "4", "--load", ckpt, "--top-k", "1",
                      "--capacity-factor", "1.0", "--balance", "bias", "--check",
                      "--save", again, "--out", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["max_loss_diff"] < 1e-10
    metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    routing = dict(top_k=1, capacity_factor=1.0, balance="bias")
    assert {k: metrics["config"][k] for k in routing} == routing
    assert {k: metrics["args"][k] for k in routing} == routing
    assert metrics["args"]["n_layer"] == 2 and metrics["args"]["experts"] == 4
    assert {k: checkpoint.read_meta(again)["config"][k] for k in routing} == routing


def _refused_line(argv, capsys, monkeypatch) -> str:
    """The one line `python -m minitp.train argv` prints, refused (exit 2) before any
    process starts."""
    _no_launch(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# the launcher's own rule (minitp.rules.check_timeout), in the CLI's words
TIMEOUT_RULE = "--timeout: timeout must be a positive, finite number of seconds, got "
REFUSED_VALUES = [  # (flags, the one line's message): each once reached a traceback
    (["--lr", "inf"], "--lr must be a positive, finite number, got inf"),
    (["--lr", "1e39"], "--lr 1e+39 is past the largest torch.float32"),  # Adam's step overflowed
    (["--temperature", "nan"], "--temperature must be a positive, finite number, got nan"),
    (["--clip-grad", "inf"], "--clip-grad must be a positive, finite number, got inf"),
    (["--timeout", "0"], TIMEOUT_RULE + "0.0"),
    (["--timeout", "nan"], TIMEOUT_RULE + "nan"),
    (["--timeout", "-5"], TIMEOUT_RULE + "-5.0"),
    (["--timeout", "1e300"], "--timeout: timeout must be at most 1e+09 seconds"),
    (["--seed", str(2**70)], "a 64-bit integer for torch; give a seed from 0 to"),
    (["--seed", "-1"], "--seed -1: each step's seed is seed*1,000,003 + step"),
    (["--sample-tokens", "-5"], "--sample-tokens must be from 0 to 100,000 (the sample is "
     "printed at the end of the run), got -5"),
    (["--sample-tokens", str(10**20)], "--sample-tokens must be from 0 to 100,000"),  # ran for ever
    (["--eval-batches", str(10**9)], "dense copy, text and held-out batches), but only"),
    (["--experts", "4", "--capacity-factor", "inf"],
     "--capacity-factor: 'inf' is neither a finite number nor 'dropless'"),
    (["--prompt", "def \udcff"], "--prompt 'def \\udcff' is not valid UTF-8 text"),  # argv's
    # form of the byte 0xff
    (["--impl", "torch", "--fp8", "tensorwise"], "--impl torch does not do --fp8: use minitp's"),
    (["--impl", "torch", "--dp", "2", "--zero-stage", "0"],
     "stage 0 would be torch's replicate (DDP), and neither it nor 1-2 is wired here: leave "
     "--zero-stage out"),
]


@pytest.mark.parametrize("flags,message", REFUSED_VALUES,
                         ids=[" ".join(f[0])[:30] for f in REFUSED_VALUES])
def test_a_value_no_run_can_use_is_refused_in_one_line(flags, message, capsys, monkeypatch):
    assert message in _refused_line([*ONE_PROCESS, *flags], capsys, monkeypatch)


def test_an_empty_data_file_is_refused_packed_or_not(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for pack in ([], ["--pack"]):
        err = _refused_line([*ONE_PROCESS, "--data", str(empty), *pack], capsys, monkeypatch)
        assert f"--data {empty}: the file is empty" in err, (pack, err)


def test_an_out_that_cannot_be_a_directory_is_refused_before_the_run(tmp_path, capsys,
                                                                      monkeypatch):
    """Once it failed after the whole run had trained, writing nothing."""
    afile = tmp_path / "metrics.json"
    afile.write_text("{}")
    for out, named in ((afile, "exists and is not a directory"),
                       (afile / "run" / "one", "is a file")):
        err = _refused_line([*ONE_PROCESS, "--out", str(out)], capsys, monkeypatch)
        assert err.startswith("python -m minitp.train: error: --out: ") and named in err, err


def test_impl_torch_over_dp_defaults_to_fsdp2():
    """--impl torch --dp 2 --tp 2 runs as FSDP2 (stage 3: torch's data parallelism here has
    no stage 0); minitp's own stays at stage 0; args (metrics.json's) say which ran."""
    torch_dp = [*ONE_PROCESS, "--impl", "torch", "--dp", "2", "--tp", "2"]
    assert _validated(torch_dp)[0].zero_stage == 3
    assert _validated([*ONE_PROCESS, "--impl", "torch", "--tp", "2"])[0].zero_stage == 0
    assert _validated([*ONE_PROCESS, "--dp", "2"])[0].zero_stage == 0


def test_a_tiny_temperature_samples_the_likeliest_byte():
    """At --temperature 1e-320 logits/T overflowed to inf, and softmax gave NaN at the end of
    a finished run; now it is the greedy choice (and a usual temperature is unchanged)."""
    from minitp.train.rank import _tempered, _utf8_allowed

    logits = torch.linspace(-3.0, 5.0, 256, dtype=torch.float64)
    allowed = _utf8_allowed([])
    probs = torch.softmax(_tempered(logits, 1e-320, allowed), dim=-1)
    assert probs.isfinite().all() and int(probs.argmax()) == 0xF4 and probs.max() == 1.0
    usual = logits / 0.9
    usual[~allowed] = float("-inf")
    assert torch.equal(_tempered(logits, 0.9, allowed), usual)  # bit for bit as before


def test_weights_or_adam_state_not_finite_are_seen():
    """What every rank checks before a save (`weights_finite` all-reduces it): its weights,
    and the state of the optimizer it steps (a ZeRO optimizer's inner one: shards, moments)."""
    from types import SimpleNamespace

    from minitp.train.divergence import locally_finite

    model = torch.nn.Linear(3, 2)
    shard = torch.zeros(4)
    moments = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.ones(4)}
    zero = SimpleNamespace(inner=SimpleNamespace(state={shard: moments},
                                                 param_groups=[{"params": [shard]}]))
    assert locally_finite(model, zero)
    for tensor in (moments["exp_avg_sq"], shard, model.bias):
        with torch.no_grad():
            tensor[0] = float("nan")
        assert not locally_finite(model, zero)
        with torch.no_grad():
            tensor[0] = 0.0


def test_a_diverging_run_stops_at_its_step_and_keeps_the_last_finite_checkpoint(tmp_path):
    """--lr 1e9 (float32): the second step's loss is NaN. The run stops there with one line
    naming the step and the loss, exit 1; it never reaches the end-of-run sample; and the
    checkpoint of the step before survives --keep 1 (NaN ones once rotated it out)."""

    ckpt = tmp_path / "ckpt"
    tiny32 = [f for f in TINY if f not in ("--dtype", "float64")]
    done = run_cli(*tiny32, "--steps", "6", "--lr", "1e9", "--save", str(ckpt),
                   "--save-every", "1", "--keep", "1", "--out", str(tmp_path / "run"))
    assert done.returncode == 1, done.stderr[-3000:]
    line = re.fullmatch(r"python -m minitp\.train: step (\d+): the loss is (nan|inf|-inf) \(not "
                        r"finite\): training stopped there, nothing saved at or after it .*\n",
                        done.stderr)
    assert line, done.stderr
    stopped = int(line.group(1))
    assert stopped >= 2  # the first step's loss is the fresh model's
    kept = sorted(p.name for p in ckpt.iterdir() if p.name != writer_lock.LOCK)  # the lock stays
    assert kept == [f"step-{stopped - 1}"]
    weights = checkpoint.load_dense(str(ckpt / f"step-{stopped - 1}"))[0].state_dict()
    assert all(t.isfinite().all() for t in weights.values())
    assert not (tmp_path / "run").exists()  # nothing written for a run that did not finish


def test_the_stop_line_names_the_step_and_the_loss():
    """What the diverging run above prints, for each way it stops (no run needed)."""
    from minitp.train import divergence

    assert divergence.loss_stop(3, 2.5) is None
    assert divergence.loss_stop(3, float("nan")).startswith(
        "step 3: the loss is nan (not finite): training stopped there (try a smaller --lr")
    assert "stopped there, nothing saved at or after it" in divergence.loss_stop(
        3, float("inf"), saving=True)
    assert divergence.weights_stop(4, 7.25, saving=True).startswith(
        "step 4: its update made the weights not finite (the step's loss was 7.2500): "
        "training stopped there, nothing saved at or after it")
    assert divergence.eval_stop(5, float("nan")).startswith("step 5: the held-out loss is nan")
