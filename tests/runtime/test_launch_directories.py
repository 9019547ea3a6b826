"""What a launch makes in the temporary folder, and what it removes there.

A launcher killed with SIGKILL (a kernel restart, the OOM killer) runs no cleanup, so
the next launch, in any process, removes what it left. It must remove exactly that: only
a directory carrying minitp's mark, whose maker is dead; never a folder of the user's
whose name happens to look like one of minitp's. And the mark must be there from the
first moment, since the kill can come at any moment of a cold start."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import torch.distributed as dist
from processes import clean_env, describe, process_table, wait_until_gone

import minitp as mt

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _rank():
    return dist.get_rank()


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=30)
    return proc.pid


def test_a_launch_never_touches_a_folder_that_only_looks_like_minitps(tmp_path, monkeypatch):
    """`minitp-` and digits is a name a person may give a folder (a dated copy of notes):
    before, a launch deleted these, files and all, when no process had that number."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a launch looks
    names = ["minitp-20261128", "minitp-20261128-backup", "minitp-4000000-notes",
             f"minitp-{_dead_pid()}-x7q2kd9w"]  # the very shape of a rendezvous directory
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text(f"kept: {name}")
    assert list(mt.launch(_rank, 2, timeout=60)) == [0, 1]
    for name in names:
        assert (tmp_path / name / "notes.txt").read_text() == f"kept: {name}", name
    # and the launch's own rendezvous directory is gone (multiprocessing's pymp-* may stay)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("minitp-")) == (
        sorted(names))


_MAKE_MARKED = textwrap.dedent("""
    import sys
    from minitp.runtime._forkserver import make_owned_directory
    print(make_owned_directory(sys.argv[1]))
""")


def test_what_a_dead_launcher_marked_is_removed_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = subprocess.run([sys.executable, "-c", _MAKE_MARKED, "minitp-0-"], env=clean_env(
        TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    dead = made.stdout.strip()  # marked by a process that has ended
    (tmp_path / dead / "store").write_text("a rendezvous file")
    from minitp.runtime._forkserver import make_owned_directory

    live = make_owned_directory("minitp-0-")  # marked by this process, which lives
    assert list(mt.launch(_rank, 2, timeout=60)) == [0, 1]
    assert not os.path.exists(dead)
    assert os.path.isdir(live)
    shutil.rmtree(live)


# --------------------------------------------------------------------------- killed cold
# Its ranks sleep past the last kill moment, so every kill lands inside the launch: a cold
# start faster than 2.5 s (it was about 3 s) once let the launch return first, and the
# kill then tested nothing (a failure of this test's own, on a clean clone).
_COLD_LAUNCH = textwrap.dedent("""
    import pathlib, sys, time
    import minitp as mt
    if __name__ == "__main__":
        pathlib.Path(sys.argv[1]).write_text("launching")  # the moments count from here
        mt.launch(time.sleep, 2, 30.0, timeout=60)
        pathlib.Path(sys.argv[1]).write_text("returned")
""")

_NEXT_LAUNCH = "import minitp as mt; mt.launch(int, 2, timeout=60)"

# From before the first fork (the forkserver's start) into the forkserver's imports (about
# 3 s on an idle 2-core machine): before, every kill in that stretch left a `pymp-*` folder
# that no later launch removed (it was marked only once the warm-up had been answered).
_KILL_AFTER_S = [0.05, 0.5, 1.2, 2.5]


def _in_session(sid: int) -> set[int]:
    return {pid for pid, (_, session, state) in process_table().items()
            if session == sid and state != "Z"}


def test_a_launcher_killed_at_any_moment_of_a_cold_start_leaves_nothing_for_good(tmp_path):
    """Launchers killed with SIGKILL 0.05 to 2.5 s into their first launch (each a new
    process, so each a cold start), with all they started: after the next launch, nothing
    of theirs is left in the temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(TMPDIR=str(tmp))
    (tmp_path / "cold.py").write_text(_COLD_LAUNCH)
    # Side by side, each killed at its own moment after its own launch began: one at a
    # time, the imports alone would take half a minute.
    procs = {seconds: subprocess.Popen(
        [sys.executable, str(tmp_path / "cold.py"), str(tmp_path / f"flag-{seconds}")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True) for seconds in _KILL_AFTER_S}
    try:
        deadline, launched, killed = time.monotonic() + 180, {}, set()
        while len(killed) < len(procs):
            for seconds, proc in procs.items():
                flag = tmp_path / f"flag-{seconds}"
                if seconds in killed:
                    continue
                if seconds not in launched and flag.exists():
                    launched[seconds] = time.monotonic()
                elif seconds not in launched:
                    assert proc.poll() is None, (
                        "a script ended before it launched:\n" + proc.stderr.read())
                elif time.monotonic() >= launched[seconds] + seconds:
                    # The launcher and, with it, what it started: its cold forkserver would
                    # follow it only once its imports are done (seconds of CPU; that it does
                    # is test_launch_faults.py's). No process but the launcher makes or
                    # removes a folder: killing them changes nothing of what is left.
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate(timeout=30)
                    assert flag.read_text() == "launching", "killed only after its launch"
                    killed.add(seconds)
            assert time.monotonic() < deadline, "the scripts never reached their launch"
            time.sleep(0.01)
        running = wait_until_gone(set().union(*(_in_session(p.pid) for p in procs.values())),
                                  seconds=10.0, count_zombies=False)
        assert not running, "still running after the kill:\n" + describe(running)
        left = sorted(p.name for p in tmp.iterdir() if p.name.startswith(("minitp-", "pymp-")))
        assert left, "the killed launchers left nothing: then this test tests nothing"
        done = subprocess.run([sys.executable, "-c", _NEXT_LAUNCH], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        after = sorted(p.name for p in tmp.iterdir() if p.name.startswith(("minitp-", "pymp-")))
        assert after == [], f"left for good by the killed launchers: {after} (before: {left})"
    finally:
        for proc in procs.values():  # only processes this test started
            for pid in _in_session(proc.pid) | {proc.pid}:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.wait(timeout=10)


# --------------------------------------------------------------------------- a long TMPDIR
_LAUNCH_AND_SAY_WHERE = ("import multiprocessing.util as u, minitp as mt; "
                         "assert list(mt.launch(int, 1, timeout=60)) == [0]; "
                         "print(u.get_temp_dir())")


def test_a_launch_works_with_a_tmpdir_too_long_for_a_unix_socket(tmp_path):
    """The forkserver's socket lives in multiprocessing's `pymp-*` directory: under a TMPDIR
    of 100 characters its path passed AF_UNIX's 107, and every launch failed ("OSError:
    AF_UNIX path too long"; pytest's own tmp_path can be that deep). It goes to /tmp then."""
    deep = tmp_path / ("d" * max(1, 100 - len(str(tmp_path))))
    deep.mkdir()
    done = subprocess.run([sys.executable, "-c", _LAUNCH_AND_SAY_WHERE],
                          env=clean_env(TMPDIR=str(deep)), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert os.path.dirname(done.stdout.strip()) in ("/tmp", "/var/tmp")


def test_a_tmpdir_too_long_with_no_tmp_to_fall_back_on_is_refused_in_one_line(monkeypatch):
    from minitp.runtime import _forkserver

    monkeypatch.setattr(tempfile, "tempdir", "/" + "d" * 99)
    monkeypatch.setattr(os, "access", lambda *a: False)
    with pytest.raises(mt.runtime.errors.LaunchError, match=r"^the temporary folder '/d+' is "
                       r"100 characters long, too long .* set a shorter TMPDIR$"):
        _forkserver._short_enough_base()
    monkeypatch.setattr(tempfile, "tempdir", "/" + "d" * 74)  # the longest that fits
    assert _forkserver._short_enough_base() == "/" + "d" * 74
