"""One writer at a time in a checkpoint directory, readers that leave a live writer's files
alone, and the saves that used to lose data (`checkpoint.writer_lock`, `sharded`, `files`).
All in this process but one: the lock is a real flock, and a second open of the lock file
conflicts with the first as another process's would."""

import errno
import os
import signal
import subprocess
import sys

import pytest
import torch

from minitp.checkpoint import files, sharded, sharded_read, writer_lock
from minitp.checkpoint.sharded import Saver
from minitp.train import build_parser, validate


def _refused(argv, capsys) -> str:
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:
        validate(parser.parse_args(argv), parser)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.fixture
def held(tmp_path):
    """`tmp_path` with its writer's lock held, as by a live run's rank 0."""
    fd = writer_lock.acquire(str(tmp_path))
    yield str(tmp_path)
    writer_lock.release(fd)


def test_a_second_writer_is_refused_in_one_line(held, capsys):
    err = _refused(["--save", held, "--save-every", "2"], capsys)
    assert f"is in use: another run (pid {os.getpid()})" in err


def test_a_second_writers_saver_is_refused(held):
    """A run that started at the same moment, past the parent's check: its rank 0's lock."""
    with pytest.raises(BlockingIOError, match="is in use"):
        writer_lock.acquire(held, wait=0.05)


def test_a_killed_writer_leaves_the_directory_free(tmp_path):
    script = ("import importlib.util, os, signal, sys\n"
              "spec = importlib.util.spec_from_file_location('wl', sys.argv[1])\n"
              "wl = importlib.util.module_from_spec(spec); spec.loader.exec_module(wl)\n"
              "wl.acquire(sys.argv[2]); os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script, writer_lock.__file__, str(tmp_path)],
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert writer_lock.holder(str(tmp_path)) is None
    writer_lock.release(writer_lock.acquire(str(tmp_path), wait=0))


def _leftovers(directory):
    """A complete step 4, a killed save's partial step 6, a step 7 without its manifest."""
    for name in ("step-4", ".step-6.partial", "step-7"):
        os.makedirs(os.path.join(directory, name))
        with open(os.path.join(directory, name, "rank-0.bin"), "wb") as f:
            f.write(b"\0" * 8)
    with open(os.path.join(directory, "step-4", "manifest.json"), "w") as f:
        f.write("{}")


def test_a_reader_beside_a_live_writer_removes_nothing(held):
    _leftovers(held)
    assert sharded_read.resolve(held) == os.path.join(held, "step-4")
    assert sorted(os.listdir(held)) == [".minitp-writer.lock", ".step-6.partial", "step-4",
                                        "step-7"]


def test_a_reader_removes_what_no_live_writer_holds(tmp_path):
    _leftovers(str(tmp_path))
    assert sharded_read.resolve(str(tmp_path)) == str(tmp_path / "step-4")
    assert sorted(os.listdir(tmp_path)) == ["step-4"]  # the partial and step-7 removed


def test_a_symlinked_partial_is_unlinked_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "rank-0.bin").write_bytes(b"precious")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(victim, ckpt / ".step-6.partial")
    sharded.remove_partials(str(ckpt))
    assert os.listdir(ckpt) == [] and (victim / "rank-0.bin").read_bytes() == b"precious"


def test_a_dense_save_over_sharded_steps_is_refused_before_training(tmp_path, capsys):
    os.makedirs(tmp_path / "step-4")
    err = _refused(["--save", str(tmp_path)], capsys)
    assert "holds sharded steps (step-4)" in err and os.path.isdir(tmp_path / "step-4")


def test_a_dense_write_never_removes_sharded_steps(tmp_path):
    os.makedirs(tmp_path / "step-4")
    with pytest.raises(ValueError, match="holds sharded steps"):
        files.write_checkpoint(str(tmp_path), {"w": torch.zeros(2)}, None, {"step": 1})
    assert os.listdir(tmp_path) == ["step-4"]


def test_a_dense_write_refuses_non_finite_values(tmp_path):
    with pytest.raises(ValueError, match="non-finite"):
        files.write_checkpoint(str(tmp_path / "c"), {"w": torch.tensor([1.0, float("nan")])},
                               None, {"step": 1})
    assert not os.path.exists(tmp_path / "c")


def test_an_unwritable_save_directory_is_refused(tmp_path, monkeypatch):
    target = str(tmp_path)  # (the tests run as root, who may write anywhere: os.access says)
    monkeypatch.setattr(files.os, "access", lambda p, mode: os.path.abspath(p) != target)
    with pytest.raises(PermissionError, match="cannot write into"):
        files.check_save_target(target)


def test_a_full_disk_ends_in_one_line_and_removes_the_partial(tmp_path, monkeypatch):
    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sharded, "_write", full)
    saver = Saver.__new__(Saver)  # only what `_write` uses: rank 0, its directory
    saver.directory, saver.rank = str(tmp_path), 0
    with pytest.raises(OSError) as refused:
        saver._write(5, torch.zeros(4), {}, "", False)
    assert "is full" in str(refused.value) and "\n" not in str(refused.value)
    assert os.listdir(tmp_path) == []


def test_keep_without_save_every_is_refused(tmp_path, capsys):
    assert "--keep needs --save-every" in _refused(["--save", str(tmp_path), "--keep", "3"],
                                                   capsys)
