"""Sharded checkpoints: written by every rank (each element once), loaded exactly at
other layouts, each rank reading only the bytes its shards need."""

import json
import os
import shutil
import signal

import pytest
import torch

import minitp as mt
from minitp import checkpoint, data
from minitp.checkpoint import sharded, sharded_read
from minitp.checkpoint.reshard import dense_optimizer_state
from minitp.checkpoint.sharded import Saver
from minitp.data_parallel.zero import gathered
from minitp.runtime.errors import LaunchError
from minitp.train import build_parser, validate

CFG = dict(vocab_size=10, seq_len=8, n_layer=4, n_head=12, d_model=24)


def _dense(model, optimizer):
    with gathered(model):
        return ({k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()},
                dense_optimizer_state(model, optimizer))


def _mesh(sizes):
    dp, pp, tp = sizes
    return mt.Mesh(dp=dp, pp=pp, tp=tp)


def _model(sizes, zero_stage):
    mesh = _mesh(sizes)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)).double(), mesh, zero_stage=zero_stage)
    return mesh, model, mt.make_optimizer(model, mesh, lambda p: torch.optim.Adam(p, lr=1e-2))


def _step(model, mesh, optimizer, step):
    tokens = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(3))
    mt.train_step(model, data.get_batch(tokens, step, 8, 8), mesh, optimizer, microbatches=2)


def _train_and_save(sizes, zero_stage, directory):
    """Two steps at `sizes`, then a sharded save at step 2; the dense state saved."""
    mesh, model, optimizer = _model(sizes, zero_stage)
    for step in range(2):
        _step(model, mesh, optimizer, step)
    saver = Saver(model, optimizer, mesh, directory, dict(zero_stage=zero_stage))
    saver.save(2)
    saver.close()
    return _dense(model, optimizer)


def _load(sizes, zero_stage, directory):
    model, optimizer, meta = checkpoint.load(
        directory, _mesh(sizes), zero_stage=zero_stage,
        optimizer_factory=lambda p: torch.optim.Adam(p, lr=1e-2))
    return _dense(model, optimizer), meta["bytes_read"]


def _same(a, b) -> bool:
    (wa, oa), (wb, ob) = a, b
    return (all(torch.equal(wa[k], wb[k]) for k in wa) and torch.equal(oa["step"], ob["step"])
            and all(torch.equal(oa[k][n], ob[k][n]) for k in ("exp_avg", "exp_avg_sq")
                    for n in oa[k]))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint saved at (dp 1, pp 2, tp 2) after two steps, and the dense state."""
    d = str(tmp_path_factory.mktemp("sharded"))
    return d, mt.launch(_train_and_save, 4, (1, 2, 2), 0, d, backend="gloo", timeout=120)[0]


def test_saved_at_tp2_pp2_loads_exactly_elsewhere_reading_only_its_bytes(saved):
    """Saved at (dp 1, pp 2, tp 2): every element written once (the files add up to the
    model and Adam's state); loaded bit for bit at (dp 2, pp 1, tp 1, ZeRO-1), every rank
    reading less than the dense load's every byte (the other layouts: the same code)."""
    d, saved = saved
    step = os.path.join(d, "step-2")
    manifest = json.load(open(os.path.join(step, "manifest.json")))
    n_params = sum(v.numel() for v in saved[0].values())
    total = sum(f["bytes"] for f in manifest["files"].values())
    assert total == 3 * n_params * 8  # parameters, exp_avg, exp_avg_sq; float64; once each
    for sizes, zero_stage in (((2, 1, 1), 1),):
        run = mt.launch(_load, sizes[0] * sizes[2], sizes, zero_stage, step,
                        backend="gloo", timeout=120)
        assert all(_same(state, saved) for state, _ in run), (sizes, zero_stage)
        assert all(read < total for _, read in run)


def _killed_writing_step_2(directory):
    """Step 1 saved asynchronously and whole; step 2's write killed half-way (SIGKILL in
    the writer's thread, 100 bytes of the shard on disk)."""
    mesh, model, optimizer = _model((1, 1, 1), 0)
    saver = Saver(model, optimizer, mesh, directory, {}, asynchronous=True)
    for step in (1, 2):
        _step(model, mesh, optimizer, step)
        if step == 2:
            def half_then_killed(path, write):
                with open(path, "wb") as f:
                    f.write(bytes(100))
                os.kill(os.getpid(), signal.SIGKILL)

            sharded._write = half_then_killed
        saver.save(step)
        saver.wait()


def test_a_rank_killed_mid_async_write_leaves_the_previous_checkpoint_whole(tmp_path):
    with pytest.raises(LaunchError):
        mt.launch(_killed_writing_step_2, 1, str(tmp_path), backend="gloo", timeout=60)
    # (the writer's lock file stays; its lock went with the killed process: `writer_lock`)
    assert sorted(os.listdir(tmp_path)) == [".minitp-writer.lock", ".step-2.partial", "step-1"]
    assert sharded_read.resolve(str(tmp_path)) == str(tmp_path / "step-1")  # whole
    assert sorted(os.listdir(tmp_path)) == [".minitp-writer.lock", "step-1"]  # partial removed
    _, manifest, _ = checkpoint.load_dense(str(tmp_path / "step-1"))  # verified, loadable
    assert manifest["step"] == 1


def _damage(step, how):
    if how == "missing shard":
        os.remove(os.path.join(step, "rank-3.bin"))
    elif how == "truncated":
        with open(os.path.join(step, "rank-1.bin"), "r+b") as f:
            f.truncate(100)
    elif how == "no manifest":
        os.remove(os.path.join(step, "manifest.json"))


@pytest.mark.parametrize("how, flags, says", [
    ("another model", ["--d-model", "48"], "--d-model 48: the checkpoint's model has 24"),
    ("missing shard", [], "shard rank-3.bin is missing"),
    ("truncated", [], "rank-1.bin is 100 bytes, not the"),
    ("no manifest", [], "has no manifest.json: its save was interrupted"),
    ("no --save", ["--save-every", "2"], "--save-every needs --save DIR"),
])
def test_bad_checkpoints_are_refused_in_one_line(saved, tmp_path, capsys, how, flags, says):
    step = str(tmp_path / "step-2")
    shutil.copytree(os.path.join(saved[0], "step-2"), step)
    _damage(step, how)
    parser = build_parser()
    args = parser.parse_args([*(["--load", step] if how != "no --save" else []), *flags])
    with pytest.raises(SystemExit) as exit_:
        validate(args, parser)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and err.count("\n") == 1, err


def test_load_dir_takes_the_newest_complete_step(saved, tmp_path):
    shutil.copytree(os.path.join(saved[0], "step-2"), tmp_path / "step-2")
    shutil.copytree(os.path.join(saved[0], "step-2"), tmp_path / "step-4")
    _damage(str(tmp_path / "step-4"), "no manifest")  # an interrupted save: never used
    assert sharded_read.resolve(str(tmp_path)) == str(tmp_path / "step-2")
