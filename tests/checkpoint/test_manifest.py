"""A sharded checkpoint cannot be pointed outside itself, and a manifest that is not the
one `sharded` wrote is refused in one line before any rank reads a byte
(`checkpoint.manifest`). One small checkpoint is written once (2 ranks); every case
edits a copy of it, in this process."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

import minitp as mt
from minitp import data
from minitp.checkpoint import sharded_read
from minitp.checkpoint.manifest import MANIFEST, SEAL, digest
from minitp.checkpoint.sharded import Saver
from minitp.runtime import comm
from minitp.runtime.mesh import world
from minitp.train import build_parser, validate

CFG = dict(vocab_size=256, seq_len=8, n_layer=1, n_head=2, d_model=8)  # bytes: generate
RNG_BYTES = torch.get_rng_state().numel()


def _save_beside_planted_links(directory, victim):
    """One step at (dp 2, ZeRO-1), float32, saved as step 1. Around it, what a careless
    or hostile user does: a symlink to `victim` planted as ``.step-1.partial`` before the
    run and as ``.step-2.partial`` during it, then a NaN in the model before step 3's save.
    Returns rank 0's view: what saves 2 and 3 raised."""
    mesh = mt.Mesh(dp=2)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(mt.GPTConfig(**CFG)), mesh, zero_stage=1)
    optimizer = mt.make_optimizer(model, mesh, lambda p: torch.optim.Adam(p, lr=1e-2))
    tokens = torch.randint(0, 10, (200,), generator=torch.Generator().manual_seed(3))
    mt.train_step(model, data.get_batch(tokens, 0, 4, 8), mesh, optimizer, microbatches=1)
    if mesh.rank == 0:
        os.symlink(victim, os.path.join(directory, ".step-1.partial"))
    saver = Saver(model, optimizer, mesh, directory, dict(zero_stage=1), extra={"seed": 0})
    saver.save(1)
    if mesh.rank == 0:
        os.symlink(victim, os.path.join(directory, ".step-2.partial"))
    comm.barrier(world())  # planted before either rank writes step 2
    said = {}
    for step in (2, 3):
        if step == 3:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = math.nan
        try:
            saver.save(step)
        except (OSError, ValueError) as exc:
            said[step] = str(exc)
    saver.close()
    return said


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the checkpoint directory, its step-1, the victim folder, what rank 0 was told)."""
    root = tmp_path_factory.mktemp("manifest")
    directory, victim = root / "ckpt", root / "victim"
    directory.mkdir()
    victim.mkdir()
    (victim / "rank-0.bin").write_bytes(b"precious")
    said = mt.launch(_save_beside_planted_links, 2, str(directory), str(victim),
                     backend="gloo", timeout=120)[0]
    return str(directory), str(directory / "step-1"), str(victim), said


def _copy(saved, tmp_path) -> str:
    step = str(tmp_path / "step-1")
    shutil.copytree(saved[1], step)
    return step


def _edit(step, change, reseal=True) -> None:
    """Apply change(manifest) to step's manifest.json; reseal: hash it again, as a forger
    would, so that the field's own check (not the hash) must refuse it."""
    path = os.path.join(step, MANIFEST)
    with open(path) as f:
        manifest = json.load(f)
    change(manifest)
    text = json.dumps(manifest, indent=1).encode()
    with open(path, "wb") as f:
        f.write(text)
    if reseal:
        with open(os.path.join(step, SEAL), "w") as f:
            f.write(digest(text))


def _rename(old, new):
    def change(m):
        m["files"][new] = m["files"].pop(old)
    return change


def _hold(which, key, value):
    def change(m):
        m["files"]["rank-0.bin"]["holds"][which][key] = value(m["files"]["rank-0.bin"])
    return change


def _last_hold(extra_runs, drop=0):
    """rank-1.bin's last hold with `extra_runs` added (or its last `drop` elements cut),
    its bytes and the file's kept consistent: only the tiling is wrong."""
    def change(m):
        entry = m["files"]["rank-1.bin"]
        hold = entry["holds"][-1]
        runs = hold["runs"]
        if drop:
            runs[-1][1] -= drop
        runs.extend(r(runs) for r in extra_runs)
        delta = 4 * (sum(b - a for a, b in runs) - hold["bytes"] // 4)
        hold["bytes"] += delta
        entry["bytes"] += delta
    return change


def _swap_offsets(entry):
    a, b = entry["holds"][0], entry["holds"][1]
    a["offset"], b["offset"] = b["offset"], a["offset"]


def _set(key, value):
    def change(m):
        m[key] = value
    return change


def _set_rng(value):
    def change(m):
        m["files"]["rank-0.bin"]["rng"] = value
    return change


# (name, change(manifest), what the one line says)
EDITS = [
    ("escape up", _rename("rank-1.bin", "../../etc/hostname"), "that are not a rank's file"),
    ("absolute", _rename("rank-1.bin", "/etc/os-release"), "that are not a rank's file"),
    ("another step", _rename("rank-1.bin", "../step-2/rank-1.bin"), "not a rank's file"),
    ("entry dropped", lambda m: m["files"].pop("rank-1.bin"), "2 ranks each wrote one"),
    ("files a list", lambda m: m.update(files=list(m["files"].values())), "files is a list"),
    ("files missing", lambda m: m.pop("files"), "fields are not a sharded checkpoint's"),
    ("float64, run float32", _set("dtype", "float64"), "its runs make"),
    ("a torch function", _set("dtype", "zeros"), "dtype is 'zeros'"),
    ("int32", _set("dtype", "int32"), "dtype is 'int32'"),
    ("adam_step NaN", _set("adam_step", {"value": math.nan, "dtype": "float32"}), "adam_step"),
    ("adam_step negative", _set("adam_step", {"value": -1.0, "dtype": "float32"}), "adam_step"),
    ("rng not hex", _set_rng("zz" * RNG_BYTES), "rng is not"),
    ("rng 10 bytes", _set_rng("ab" * 10), "rng is not"),
    ("step -1", _set("step", -1), "step is -1"),
    ("step a string", _set("step", "4"), "step is '4'"),
    ("causal a string", lambda m: m["config"].update(causal="false"), "causal is 'false'"),
    ("offset past the file", _hold(-1, "offset", lambda e: e["bytes"] + 8), "starts at byte"),
    ("offsets swapped", lambda m: _swap_offsets(m["files"]["rank-0.bin"]), "starts at byte"),
    ("offset moved 4 bytes", _hold(1, "offset", lambda e: e["holds"][1]["offset"] + 4),
     "starts at byte"),
    ("unknown tensor", _hold(0, "tensor", lambda e: "model/nope"), "not a tensor of this"),
    ("shape changed", _hold(0, "shape", lambda e: [1, 2]), "the shape [1, 2]"),
    ("claimed twice", _last_hold([lambda runs: [runs[0][0], runs[0][0] + 1]]), "held twice"),
    ("claimed by none", _last_hold([], drop=1), "held by no file"),
    ("run past the tensor", _last_hold([lambda runs: [runs[-1][1], runs[-1][1] + 10**6]]),
     "is past"),
]


@pytest.mark.parametrize("name, change, says", EDITS, ids=[e[0] for e in EDITS])
def test_a_manifest_not_as_written_is_refused_in_one_line(saved, tmp_path, name, change, says):
    step = _copy(saved, tmp_path)
    _edit(step, change)
    with pytest.raises((ValueError, FileNotFoundError)) as refused:
        sharded_read.read_manifest(step)
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_shard_that_is_a_symlink_out_is_refused(saved, tmp_path):
    step = _copy(saved, tmp_path)
    outside = tmp_path / "outside.bin"  # the same bytes: only where it lives is wrong
    shutil.move(os.path.join(step, "rank-1.bin"), outside)
    os.symlink(outside, os.path.join(step, "rank-1.bin"))
    with pytest.raises(ValueError, match="rank-1.bin is not a plain file inside"):
        sharded_read.read_manifest(step)


@pytest.mark.parametrize("change", [
    lambda m: m["config"].update(causal=False), lambda m: m["config"].update(dropout=0.9),
    _hold(0, "offset", lambda e: 4)], ids=["causal false", "dropout 0.9", "a hold"])
def test_an_edited_manifest_is_refused_as_damaged(saved, tmp_path, change):
    step = _copy(saved, tmp_path)
    _edit(step, change, reseal=False)
    with pytest.raises(ValueError, match=f"{MANIFEST} changed since it was saved"):
        sharded_read.read_manifest(step)


def test_the_checkpoint_as_written_passes(saved):
    assert sharded_read.read_manifest(saved[1])["step"] == 1


def test_a_symlink_planted_as_the_partial_is_never_written_through(saved):
    """Before the run: unlinked by the writer's clean-up; during it: refused."""
    assert os.listdir(saved[2]) == ["rank-0.bin"]
    with open(os.path.join(saved[2], "rank-0.bin"), "rb") as f:
        assert f.read() == b"precious"
    assert "is a symlink" in saved[3][2] and "\n" not in saved[3][2]


def test_the_writer_refuses_non_finite_values(saved):
    assert "non-finite" in saved[3][3] and "\n" not in saved[3][3]
    assert not os.path.isdir(os.path.join(saved[0], "step-3"))


def test_train_refuses_an_escaping_manifest_in_one_line_before_any_rank(saved, tmp_path):
    """The CLI path itself: exit 2, one line, no rank started (no run directory)."""
    step = _copy(saved, tmp_path)
    _edit(step, _rename("rank-1.bin", "../../etc/hostname"))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "minitp.train", "--load", step, "--steps", "3",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "not a rank's file" in done.stderr and not out.exists()


def test_generate_refuses_an_edited_manifest_in_one_line(saved, tmp_path, capsys):
    from minitp.generate.cli import main

    step = _copy(saved, tmp_path)
    _edit(step, lambda m: m["config"].update(causal=False), reseal=False)
    with pytest.raises(SystemExit) as exit_:
        main(["--load", step])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "changed since it was saved" in err, err
    assert err.count("\n") == 1, err


def test_train_validate_refuses_a_tiling_gap_in_one_line(saved, tmp_path, capsys):
    step = _copy(saved, tmp_path)
    _edit(step, _last_hold([], drop=1))
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:
        validate(parser.parse_args(["--load", step]), parser)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "held by no file" in err and err.count("\n") == 1, err


def test_load_takes_the_newer_of_a_dense_checkpoint_and_a_step_and_says_which(saved, tmp_path,
                                                                                capsys):
    """--save D --save-every N --load D, D holding a dense checkpoint (step 0) and step-1."""
    from minitp.train.save_flags import validate_save

    _copy(saved, tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"step": 0}))
    parser = build_parser()
    args = parser.parse_args(["--save", str(tmp_path), "--save-every", "2", "--load",
                              str(tmp_path)])
    validate_save(args, parser)
    err = capsys.readouterr().err
    assert args.load == str(tmp_path / "step-1") and err.count("\n") == 1, err
    assert f"resuming from {tmp_path / 'step-1'}, newer than the dense checkpoint" in err


def test_generate_serves_a_save_every_directory(saved, tmp_path, capsys):
    """generate --load DIR, DIR holding step-<n> directories: its newest complete step."""
    from minitp.generate.cli import main

    _copy(saved, tmp_path)
    summary = main(["--load", str(tmp_path), "--tokens", "2", "--prompt", "a"])
    assert summary["tokens"] == 2


@pytest.mark.parametrize("field, says", [
    ({"step": "4"}, "step is '4'"), ({"step": -1}, "step is -1"),
    ({"dtype": "zeros"}, "dtype is 'zeros'"), ({"config": {"causal": "false"}}, "causal is"),
    ({"files": {"../../etc/hostname": {"bytes": 1, "sha256": "0" * 64}}}, "files must name"),
], ids=["step a string", "step -1", "dtype", "config type", "a file outside"])
def test_a_dense_checkpoints_meta_is_checked_too(tmp_path, field, says):
    from minitp.checkpoint import files

    meta = {"format": files.FORMAT, "config": {}, "step": 1, "dtype": "float32",
            "has_optimizer": False, "files": {}} | field
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=says):
        files.read_meta(str(tmp_path))
