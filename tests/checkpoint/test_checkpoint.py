"""Checkpoints reshard: saved at one (dp, pp, tp, ZeRO stage), loaded at another, the
same model; and resuming gives the uninterrupted run's loss curve (float64, to 1e-10).
"""


import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from helpers import rotated

import minitp as mt
from minitp import checkpoint, data
from minitp.checkpoint import files as checkpoint_files
from minitp.data_parallel.zero import gathered

TOLERANCE = 1e-10
CFG = dict(vocab_size=10, seq_len=8, n_layer=4, n_head=12, d_model=24)  # 12 heads: tp 1..4
BATCH, MICRO, LR = 8, 2, 1e-2


def _tokens():
    return torch.randint(0, CFG["vocab_size"], (500,), generator=torch.Generator().manual_seed(3))


def _down_and_up(p, r, m, v):
    """A schedule for two chunks per rank in a V (any m): every forward down and back up,
    then every backward (GPipe's order on the V)."""
    return ([("F", 0, i) for i in range(m)] + [("F", 1, i) for i in range(m)]
            + [("B", 1, i) for i in range(m)] + [("B", 0, i) for i in range(m)])


def _train(mesh_sizes, steps, directory, save_at=None, load=False, restore_optimizer=True,
           sequence_parallel=False, zero_stage=0, v_shaped=False):
    """On every rank: train from scratch (or from `directory`) and return the losses of
    steps [start, steps) and the final dense weights; save at step `save_at`. v_shaped:
    two chunks per rank placed in a V (`placement="v"`)."""
    dp, pp, tp = mesh_sizes
    mesh = mt.Mesh(dp=dp, pp=pp, tp=tp)
    tokens = _tokens()
    v = dict(virtual_stages=2, placement="v") if v_shaped else {}
    schedule = _down_and_up if v_shaped else "1f1b"

    def new_optimizer(params):
        return torch.optim.Adam(params, lr=LR)

    if load:
        model, optimizer, meta = checkpoint.load(
            directory, mesh, sequence_parallel=sequence_parallel,
            optimizer_factory=new_optimizer if restore_optimizer else None,
            zero_stage=zero_stage, **v)
        if optimizer is None:
            optimizer = mt.make_optimizer(model, mesh, new_optimizer)
        start = meta["step"]
    else:
        torch.manual_seed(0)
        ref = mt.GPT(mt.GPTConfig(**CFG)).double()
        model = mt.parallelize(ref, mesh, sequence_parallel=sequence_parallel,
                               zero_stage=zero_stage, **v)
        optimizer = mt.make_optimizer(model, mesh, new_optimizer)
        start = 0
    losses = []
    for step in range(start, steps):
        batch = data.get_batch(tokens, step, BATCH, CFG["seq_len"])
        losses.append(mt.train_step(model, batch, mesh, optimizer, schedule=schedule,
                                    microbatches=MICRO))
        if step + 1 == save_at:
            checkpoint.save(model, directory, step + 1, optimizer, extra={"note": "test"})
    with gathered(model):  # ZeRO-3 keeps shards only
        return losses, model.full_state_dict()


def _launch(sizes, *args, **kwargs):
    dp, pp, tp = sizes
    return mt.launch(_train, dp * pp * tp, sizes, *args, backend="gloo", timeout=120, **kwargs)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# (dp, pp, tp) saved, then loaded: sampled, not enumerated (CI's two cores). Between them
# they gather tp down to one rank, split one rank over an uneven tp = 3, move every axis of
# a 2x2x2 mesh onto a pipeline, and trade pp for dp. Two a run, by rotation
# (helpers.rotated): a tp change and a pipeline change each UTC day, all four within two
# days; MINITP_FULL_MATRIX=1 runs all four.
RESUME = [((1, 1, 4), (1, 1, 1)), ((1, 1, 1), (1, 1, 3)), ((2, 2, 2), (1, 4, 1)),
          ((1, 2, 2), (2, 1, 2))]
RESUME_PAIRS = [(RESUME[0], RESUME[2]), (RESUME[1], RESUME[3])]


def _resume_twice(mesh_sizes, steps, directory):
    """On every rank: resume from `directory` with Adam's state, and again without it."""
    return (_train(mesh_sizes, steps, directory, load=True),
            _train(mesh_sizes, steps, directory, load=True, restore_optimizer=False))


@pytest.mark.parametrize("before,after", [row for pair in rotated(RESUME_PAIRS) for row in pair],
                         ids=lambda s: "x".join(map(str, s)))
def test_resume_elsewhere_continues_the_same_curve(before, after, tmp_path):
    directory = str(tmp_path / "ckpt")
    # the uninterrupted run, which saves at step 2 on its way (saving changes nothing)
    whole = _launch(before, 4, directory, save_at=2)[0]
    dp, pp, tp = after
    resumed, forgetful = mt.launch(_resume_twice, dp * pp * tp, after, 4, directory,
                                   backend="gloo", timeout=120)[0]
    assert len(resumed[0]) == 2
    assert max(abs(a - b) for a, b in zip(resumed[0], whole[0][2:], strict=True)) < TOLERANCE
    assert _max_diff(resumed[1], whole[1]) < TOLERANCE
    # The same resume without Adam's state drifts: the check above can tell.
    assert _max_diff(forgetful[1], whole[1]) > 1e-6


def _v_save_then_resume(directory):
    """Saved from a V-placed pipeline at (dp 1, pp 2, tp 2) (rank 0 holds the first and
    the last stage, and both copies of the tied embedding), resumed at (dp 2, pp 2, tp 1)
    in a V and at (dp 2, pp 1, tp 2) with no pipeline at all."""
    whole = _train((1, 2, 2), 4, directory, save_at=2, v_shaped=True)
    return (whole, _train((2, 2, 1), 4, directory, load=True, v_shaped=True),
            _train((2, 1, 2), 4, directory, load=True))


def test_a_v_placed_pipeline_saves_and_resumes_elsewhere(tmp_path):
    whole, v_again, flat = mt.launch(_v_save_then_resume, 4, str(tmp_path / "ckpt"),
                                     backend="gloo", timeout=120)[0]
    for resumed in (v_again, flat):
        assert max(abs(a - b) for a, b in zip(resumed[0], whole[0][2:], strict=True)) < TOLERANCE
        assert _max_diff(resumed[1], whole[1]) < TOLERANCE


# (dp, pp, tp), ZeRO stage: the (dp 4, ZeRO-3) -> (dp 2, tp 2) -> back, then
# through stages 1 and 2 elsewhere; two steps each, one launch of 4 ranks
ZERO_CHAIN = [((4, 1, 1), 3), ((2, 1, 2), 0), ((4, 1, 1), 3), ((2, 2, 1), 1), ((2, 1, 2), 2)]


def _zero_chain(directory):
    steps = 2 * len(ZERO_CHAIN)
    whole = _train((4, 1, 1), steps, None, zero_stage=3)
    losses = []
    for leg, (sizes, stage) in enumerate(ZERO_CHAIN):
        end = 2 * (leg + 1)
        curve, dense = _train(sizes, end, directory, save_at=end if end < steps else None,
                              load=leg > 0, zero_stage=stage)
        losses += curve
    # the same last leg without Adam's state drifts: the comparison can tell
    forgetful = _train(*ZERO_CHAIN[-1][:1], 2 * len(ZERO_CHAIN), directory, load=True,
                       restore_optimizer=False, zero_stage=ZERO_CHAIN[-1][1])[1]
    # an optimizer that is not the one its stage needs is refused before any collective
    mesh = mt.Mesh(dp=4)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)).double(), mesh, zero_stage=3)
    try:
        checkpoint.save(model, directory + "-refused", 1,
                        torch.optim.Adam(model.parameters(), lr=LR))
        refused = None
    except TypeError as exc:
        refused = str(exc)
    return whole, losses, dense, forgetful, refused


def test_zero_checkpoints_reshard_across_stages_and_resume_exactly(tmp_path):
    directory = str(tmp_path / "ckpt")
    run = mt.launch(_zero_chain, 4, directory, backend="gloo", timeout=180)
    for rank, ((whole_losses, whole), losses, dense, forgetful, refused) in enumerate(run):
        assert len(losses) == len(whole_losses) == 2 * len(ZERO_CHAIN)
        assert max(abs(a - b) for a, b in zip(losses, whole_losses, strict=True)) < TOLERANCE
        assert _max_diff(dense, whole) < TOLERANCE, rank
        assert _max_diff(forgetful, whole) > 1e-6, rank
        assert "ZeRO stage 3" in refused and "make_optimizer" in refused, refused
    meta = checkpoint.read_meta(directory)
    assert meta["step"] == 8 and meta["topology"] == {
        "dp": 2, "pp": 2, "cp": 1, "tp": 1, "ep": 1, "sequence_parallel": False,
        "zero_stage": 1}


def test_reshard_gives_the_same_model_and_files_are_plain_tensors(tmp_path):
    directory = str(tmp_path / "ckpt")
    saved = _launch((1, 1, 2), 1, directory, save_at=1, sequence_parallel=True)[0][1]
    for tp in (1, 3, 4):  # 3 and 4 pad the 10-word vocabulary differently
        loaded = _launch((1, 1, tp), 1, directory, load=True)[0][1]
        assert _max_diff(loaded, saved) == 0.0
    weights = torch.load(f"{directory}/model.pt", weights_only=True)
    assert _max_diff(weights, saved) == 0.0
    meta = checkpoint.read_meta(directory)
    assert meta["step"] == 1 and meta["topology"]["tp"] == 2 and meta["extra"] == {"note": "test"}
    assert meta["config"] == dataclasses.asdict(mt.GPTConfig(**CFG))  # every field, defaults too
    assert meta["dtype"] == "float64"


@pytest.mark.parametrize("before,after", [((2, 2, 2), (1, 1, 4)), ((2, 2, 2), (1, 4, 1))],
                         ids=lambda s: "x".join(map(str, s)))
def test_reshard_across_pipeline_and_data(before, after, tmp_path):
    directory = str(tmp_path / "ckpt")
    saved = _launch(before, 1, directory, save_at=1)[0][1]
    loaded = _launch(after, 1, directory, load=True)
    for rank in range(len(loaded)):
        assert _max_diff(loaded[rank][1], saved) == 0.0


def test_single_process_resume_matches_the_parallel_run(tmp_path):
    """What `--check` after `--load` relies on: the dense files drive a plain GPT too."""
    directory = str(tmp_path / "ckpt")
    whole = _launch((1, 1, 2), 3, directory)[0][0]
    _launch((1, 1, 2), 1, directory, save_at=1)
    ref, meta, dense_optim = checkpoint.load_dense(directory)
    optimizer = torch.optim.Adam(ref.parameters(), lr=LR)
    checkpoint.load_dense_optimizer(ref, optimizer, dense_optim)
    tokens = _tokens()
    for step in range(meta["step"], 3):
        x, y = data.get_batch(tokens, step, BATCH, CFG["seq_len"])
        optimizer.zero_grad()
        loss = ref(x, y)[1]
        loss.backward()
        optimizer.step()
        assert abs(float(loss.detach()) - whole[step]) < TOLERANCE


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a minitp checkpoint"):
        checkpoint.read_meta(str(tmp_path))


# --------------------------------------------------------------------------- atomic saves
def _save_and_die(directory, step, die_at):
    """Train one step at world 1 and save as `step`; with `die_at` = (what, k), the
    rank dies (os._exit: no finally, no cleanup, as SIGKILL) at the k-th `what`."""
    import os
    import shutil

    mesh = mt.Mesh(dp=1, pp=1, tp=1)
    torch.manual_seed(step)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)).double(), mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    mt.train_step(model, data.get_batch(_tokens(), 0, BATCH, CFG["seq_len"]), mesh, optimizer)
    calls = []

    def dying(original, partial, counts=lambda args: True):
        def replacement(*args, **kwargs):
            if counts(args):
                calls.append(args)
            if die_at is not None and len(calls) == die_at[1] and counts(args):
                if partial:  # a file cut off mid-write
                    with open(args[0], "wb") as f:
                        f.write(b"partial")
                os._exit(9)
            return original(*args, **kwargs)
        return replacement

    what = die_at[0] if die_at else None
    if what == "file":
        checkpoint_files._write = dying(checkpoint_files._write, partial=True)
    elif what == "rename":
        os.rename = dying(os.rename, partial=False)
    elif what == "cleanup":  # removing the previous checkpoint, moved aside by this save
        shutil.rmtree = dying(shutil.rmtree, partial=False,
                              counts=lambda args: f".previous-{os.getpid()}" in str(args[0]))
    checkpoint.save(model, directory, step, optimizer)
    return {k: v.clone() for k, v in model.full_state_dict().items()}


KILL_POINTS = [  # (where the save dies, which checkpoint must be there afterwards)
    (("file", 1), 1), (("file", 2), 1), (("file", 3), 1),  # model.pt, optimizer.pt, meta.json
    (("rename", 1), 1),   # everything written, nothing moved
    (("rename", 2), 1),   # the old one moved aside, the new one not yet in place
    (("cleanup", 1), 2),  # the new one in place, the old one not yet removed
]


def test_a_save_killed_at_any_point_leaves_a_whole_checkpoint(tmp_path):
    """Kill a save while it writes each file and between its renames: what the
    directory holds afterwards is the previous checkpoint or the new one, whole."""
    directory = str(tmp_path / "ckpt")
    first = mt.launch(_save_and_die, 1, directory, 1, None, timeout=60)[0]
    for die_at, expected_step in KILL_POINTS:
        with pytest.raises(mt.LaunchError, match="exited with code 9"):
            mt.launch(_save_and_die, 1, directory, 2, die_at, timeout=60)
        meta = checkpoint.read_meta(directory)
        assert meta["step"] == expected_step, die_at
        # reading it removed what the killed save left beside it (up to a checkpoint's size)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], die_at
        ref, _, optim = checkpoint.load_dense(directory)
        if expected_step == 1:
            assert _max_diff(ref.state_dict(), first) == 0, die_at
        assert optim is not None
        if expected_step == 2:  # start the next kill from the first checkpoint again
            mt.launch(_save_and_die, 1, directory, 1, None, timeout=60)
    # and a save, too, tidies what a killed one left beside the directory
    with pytest.raises(mt.LaunchError, match="exited with code 9"):
        mt.launch(_save_and_die, 1, directory, 2, ("file", 2), timeout=60)
    assert any(p.name.startswith(".ckpt.partial-") for p in tmp_path.iterdir())
    mt.launch(_save_and_die, 1, directory, 3, None, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert checkpoint.read_meta(directory)["step"] == 3


def test_a_save_in_progress_elsewhere_is_not_removed(tmp_path):
    """Leftovers are recognised by their process: a hidden directory whose save is
    still running (its pid alive) is not a leftover, and reading leaves it alone."""
    directory = tmp_path / "ckpt"
    mt.launch(_save_and_die, 1, str(directory), 1, None, timeout=60)
    alive = tmp_path / f".ckpt.partial-{os.getppid()}-x1y2"
    gone = tmp_path / f".ckpt.partial-{_a_finished_pid()}-z3"
    alive.mkdir()
    gone.mkdir()
    checkpoint.read_meta(str(directory))
    assert alive.exists() and not gone.exists()


def _a_finished_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout)


def test_a_damaged_checkpoint_is_named_before_anything_starts(tmp_path):
    import json

    directory = tmp_path / "ckpt"
    mt.launch(_save_and_die, 1, str(directory), 1, None, timeout=60)
    meta = json.loads((directory / "meta.json").read_text())

    (directory / "optimizer.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="damaged: optimizer.pt is 0 bytes"):
        checkpoint.read_meta(str(directory))
    (directory / "model.pt").unlink()
    with pytest.raises(FileNotFoundError, match="incomplete: model.pt is missing"):
        checkpoint.read_meta(str(directory))
    (directory / "meta.json").write_text(json.dumps(meta | {"surprise": 1}))
    with pytest.raises(ValueError, match=r"unknown keys \['surprise'\]"):
        checkpoint.read_meta(str(directory))
    (directory / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        checkpoint.read_meta(str(directory))
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        checkpoint.read_meta(str(tmp_path / "nowhere"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError):
        checkpoint.check_save_target(str(tmp_path / "a-file" / "ckpt"))
