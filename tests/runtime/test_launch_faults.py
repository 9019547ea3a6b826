"""Faults injected as a learner's machine deals them: the launching process killed
(a Jupyter kernel restart, the OOM killer), Ctrl-C at any moment of a launch, once
or twice, a mismatched collective, many launches in a row. Each must leave no
process, directory or file descriptor behind, and the next launch must work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from processes import (
    clean_env,
    descendants,
    describe,
    is_multiprocessing_helper,
    wait_until_gone,
)

import minitp as mt

# Workers defined here travel by value, as a notebook's would: the ranks never import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _clean_env(tmp_path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir()
    return clean_env(TMPDIR=str(tmp_path / "tmp"))  # where the launch's directories go


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# --------------------------------------------------------------------------- parent killed
_BUSY_SCRIPT = textwrap.dedent("""
    import os, pathlib, signal, sys, torch
    import torch.distributed as dist
    import minitp as mt
    def busy(marker_dir):
        pathlib.Path(marker_dir, f"rank{dist.get_rank()}").write_text(str(os.getpid()))
        x = torch.ones(1 << 16)
        while True:  # a long all-reduce loop, as a training run would be
            dist.all_reduce(x)

    mt.launch(busy, 3, sys.argv[1], timeout=60)
""")


_NEXT_LAUNCH = "import minitp as mt; mt.launch(int, 2, timeout=60)"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM],
                         ids=["SIGKILL-to-the-launcher", "SIGTERM-to-its-group"])
def test_when_the_launching_process_is_killed_every_process_it_started_ends(tmp_path, how):
    """A kernel restart or an OOM kill ends the launching process with no chance to
    clean up. Its ranks, the forkserver and the resource tracker must follow it
    within seconds, not run on holding two cores and three ports. SIGTERM to the
    whole group can be caught: it leaves no directory behind either. SIGKILL leaves
    the rendezvous and multiprocessing's directories, which the next launch removes."""
    script = tmp_path / "busy.py"
    script.write_text(_BUSY_SCRIPT)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = _clean_env(tmp_path)
    proc = subprocess.Popen([sys.executable, str(script), str(markers)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while len(list(markers.iterdir())) < 3:
            if proc.poll() is not None:
                pytest.fail("the script ended before its ranks started:\n" + proc.stderr.read())
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        rank_pids = {int(p.read_text()) for p in markers.iterdir()}
        family = descendants(proc.pid)
        assert rank_pids <= family
        helpers = {pid for pid in family if is_multiprocessing_helper(pid)}
        assert helpers, "expected the forkserver among the launching process's descendants"
        if how == signal.SIGKILL:
            os.kill(proc.pid, how)
        else:
            os.killpg(proc.pid, how)
        proc.communicate(timeout=10)
        assert proc.returncode == -how, f"the script should die of {how.name}"
        left = wait_until_gone(family, seconds=5.0, count_zombies=False)
        assert not left, f"alive 5 s after the launcher got {how.name}:\n" + describe(left)
        leftovers = [p.name for p in (tmp_path / "tmp").iterdir()
                     if p.name.startswith(("minitp-", "pymp-"))]
        if how == signal.SIGTERM:  # a signal that can be caught leaves no directory either
            assert leftovers == [], f"rendezvous directories left: {leftovers}"
        else:  # SIGKILL runs no cleanup: both directories stay, until the next launch
            assert sorted(name.split("-")[0] for name in leftovers) == ["minitp", "pymp"], (
                leftovers)
            done = subprocess.run([sys.executable, "-c", _NEXT_LAUNCH], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            after = [p.name for p in (tmp_path / "tmp").iterdir()
                     if p.name.startswith(("minitp-", "pymp-"))]
            assert after == [], f"left after the next launch: {after} (before: {leftovers})"
    finally:
        _kill_all(family | {proc.pid})
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- Ctrl-C at any time
_INTERRUPT_TRIALS = textwrap.dedent("""
    import gc, json, os, signal, sys, threading, time
    # With the garbage collector on, a descriptor held only by a reference cycle (an
    # interrupt's traceback and its frames) is freed or not depending on when it last
    # ran: the count below would pass or fail by chance. Off, every such one is seen.
    gc.disable()
    from pathlib import Path
    import multiprocessing.forkserver as mp_forkserver
    import torch.distributed as dist
    import minitp as mt
    from minitp.runtime import _forkserver
    # This script relies on Ctrl-C raising KeyboardInterrupt; a shell that started it
    # in the background would have it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(os.environ["TMPDIR"])
    me = os.getpid()
    # A launch's status array and its collectives' rings live in multiprocessing's
    # shared-memory heap, which keeps its small arenas (one /dev/shm file, two descriptors
    # each) for the life of the interpreter. Made here, once, so that the descriptors
    # counted below are the ones a launch leaves behind, whichever trial is the first to
    # allocate.
    import multiprocessing
    from minitp.runtime._flight_recorder import RING_BYTES
    from minitp.runtime._worker import STATUS_SLOT_BYTES
    for size in (STATUS_SLOT_BYTES, RING_BYTES):
        multiprocessing.get_context("forkserver").RawArray("c", size * 4)

    def children():
        table = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    cmd = (entry / "cmdline").read_bytes().replace(b"\\0", b" ").decode()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                if fields[0] != "Z":
                    table[int(entry.name)] = (int(fields[1]), cmd)
        kids, frontier = set(), {me}
        while frontier:
            frontier = {p for p, (ppid, _) in table.items() if ppid in frontier} - kids
            kids |= frontier
        # The forkserver and resource tracker live as long as this interpreter; the
        # ranks are the forkserver's children and carry its command line, so only
        # this process's own children are told apart by it.
        helpers = {p for p in kids if table[p][0] == me
                   and ("forkserver" in table[p][1] or "resource_tracker" in table[p][1])}
        return kids - helpers

    def state():
        return (len(os.listdir("/proc/self/fd")),
                sorted(p.name for p in tmp.iterdir() if p.name.startswith("minitp-")))

    main_thread = threading.main_thread().ident

    def interrupt_after(*delays):
        # Sent to the main thread, as a terminal's Ctrl-C or a Jupyter interrupt reaches
        # it: the wait it is in is cut short. (os.kill to this process, from a thread,
        # goes to that thread: the main thread would see the interrupt only once its wait
        # ended by itself, so the cold trial would interrupt a forkserver that had already
        # answered.) The delays count from the gate, which opens inside the try.
        gate = threading.Event()

        def send():
            gate.wait()
            for delay in delays:
                time.sleep(delay)
                signal.pthread_kill(main_thread, signal.SIGINT)
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        return gate, thread

    trials = json.loads(sys.argv[1])
    results = []
    fds_before = None
    for number, delays in enumerate(trials):
        if number == 1:
            # The first trial interrupts the cold start, which stops the forkserver it
            # started (with nothing of it left queued). The others are meant to find it
            # warm, forking, joining or running: so one launch first runs whole.
            mt.launch(int, 2, timeout=60)
        gate, sender = interrupt_after(*delays)
        started = time.monotonic()
        outcome = "returned"
        try:
            try:
                gate.set()
                mt.launch(time.sleep, 4, 60, timeout=5)
            finally:
                # A second interrupt may come after the launch ended: from here on it
                # waits, blocked, instead of landing in the bookkeeping below.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        except KeyboardInterrupt:
            outcome = "interrupted"
        sender.join()
        if signal.SIGINT in signal.sigpending():
            signal.sigwait({signal.SIGINT})  # taken, and dropped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        # No waiting: when a launch has returned or raised, each process it asked for has
        # ended and been reaped, or was never forked (a cold start's queued request dies
        # with the forkserver it stops), and its directory is gone.
        fds, dirs = state()
        fds_before = fds if fds_before is None else fds_before
        # A forkserver that never answered the warm-up still has its request queued: it
        # would fork that child whenever its imports end, after any check made here.
        unanswered = (mp_forkserver._forkserver._forkserver_pid is not None
                      and _forkserver._warm_forkserver_pid is None)
        results.append({"delays": delays, "outcome": outcome, "left": sorted(children()),
                        "dirs": dirs, "fds": fds, "fds_first": fds_before,
                        "unanswered server": unanswered,
                        "seconds": round(time.monotonic() - started, 2)})
    # and the next launch in the same interpreter works
    results.append({"after": list(mt.launch(lambda: dist.get_rank(), 2, timeout=30))})
    print(json.dumps(results), flush=True)
""")


def test_an_interrupt_at_any_moment_of_a_launch_leaves_nothing_behind(tmp_path):
    """Ctrl-C while the forkserver starts cold, while ranks are being forked, while
    they join the process group, while they run, twice in quick succession: each
    time no rank, directory or file descriptor is left, and the next launch works.
    Each is looked for the moment the launch has raised, with no waiting: by then
    everything it started has ended, or was never started (docs/testing.md)."""
    script = tmp_path / "trials.py"
    script.write_text(_INTERRUPT_TRIALS)
    trials = [[1.5],                              # cold: the forkserver is importing torch
              [0.0], [0.01], [0.05], [0.3],           # warm: forking, joining, running
              [0.01, 0.01], [0.03, 0.02], [0.2, 0.05]]  # twice in quick succession
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(trials)], cwd=tmp_path,
        env=_clean_env(tmp_path), capture_output=True, text=True, timeout=240,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]  # nor any child's, nor the server's
    *results, after = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in results:
        assert r["outcome"] == "interrupted", r
        assert r["left"] == [], f"ranks left after an interrupt: {r}"
        assert not r["unanswered server"], f"a request left queued in a forkserver: {r}"
        assert r["dirs"] == [], f"rendezvous directories left: {r}"
        assert r["fds"] <= results[1]["fds"], f"file descriptors leaked: {r}"
        assert r["seconds"] < 5 + sum(r["delays"]) + 10, r  # cold start included
    assert after == {"after": [0, 1]}


# --------------------------------------------------------------------------- soak
def _rank_plus(i):
    return dist.get_rank() + i


def _fails_on_rank_one(i):
    if dist.get_rank() == 1:
        raise ValueError(f"planned failure {i}")
    return i


def _skips_a_collective(_i):
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))


def _counts(tmp_path):
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
        "shm": sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else [],
        "temp": sorted(p.name for p in tmp_path.iterdir()),
    }


def test_a_soak_of_fifty_mixed_launches_leaks_nothing(tmp_path, monkeypatch):
    """50 launches: results, rank exceptions and collective timeouts mixed. Process
    count, descriptors, threads, /dev/shm and the temporary directory end as they began."""
    from processes import worker_processes

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where rendezvous dirs go
    assert list(mt.launch(_rank_plus, 2, 0, timeout=30)) == [0, 1]  # warm-up
    before, kids = _counts(tmp_path), worker_processes()
    outcomes = {"ok": 0, "error": 0, "timeout": 0}
    for i in range(50):
        if i in (17, 41):
            with pytest.raises(mt.CollectiveTimeout):
                mt.launch(_skips_a_collective, 2, i, timeout=1)
            outcomes["timeout"] += 1
        elif i % 5 == 2:
            with pytest.raises(mt.LaunchError, match=f"planned failure {i}"):
                mt.launch(_fails_on_rank_one, 2, i, timeout=30)
            outcomes["error"] += 1
        else:
            assert list(mt.launch(_rank_plus, 2, i, timeout=30)) == [i, i + 1]
            outcomes["ok"] += 1
    assert outcomes == {"ok": 39, "error": 9, "timeout": 2}
    left = wait_until_gone(worker_processes() - kids, seconds=2.0)
    assert not left, "processes left after the soak:\n" + describe(left)
    after = _counts(tmp_path)
    assert after["fds"] <= before["fds"], f"file descriptors: {before['fds']} -> {after['fds']}"
    assert after["threads"] <= before["threads"]
    assert after["shm"] == before["shm"]
    assert after["temp"] == before["temp"]  # (multiprocessing's own pymp-* may be there)
    assert not [name for name in after["temp"] if name.startswith("minitp-")]


# --------------------------------------------------------------------------- fault reports
def _mismatched_all_reduce():
    dist.all_reduce(torch.ones(4 if dist.get_rank() == 0 else 8))


def test_a_collective_mismatch_reports_what_gloo_printed():
    """gloo aborts the process on a size mismatch, explaining why on file descriptor 2
    (in Jupyter: the server's log). The error in the notebook must carry that reason
    (gloo's enforce text; torch 2.13 adds "Is there a distributed collective mismatch
    in your code?" after it, torch 2.4 does not)."""
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_mismatched_all_reduce, 2, timeout=20)
    assert "op.preamble.length <= op.nbytes" in str(info.value)
    assert "os._exit, a crash" not in str(info.value)  # no guessing when the rank said why


def _mismatched_traced_all_reduce():
    with mt.comm.checks(False):  # what gloo does with it (the check: test_collective_checks)
        mt.comm.all_reduce(torch.ones(4 if dist.get_rank() == 0 else 8), mt.world())


def test_a_collective_mismatch_names_each_ranks_op_and_shape():
    """With the calls' check off (a bench), gloo's own words give only two sizes; the
    launcher still knows every rank's traced call, so its report names the op and the
    shape each rank was in."""
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_mismatched_traced_all_reduce, 2, timeout=20)
    message = str(info.value)
    assert "rank 0: all_reduce on axis world ranks [0, 1], shape (4,)" in message, message
    assert "rank 1: all_reduce on axis world ranks [0, 1], shape (8,)" in message, message


class _OnlyRebuildsInTheRank:
    def __reduce__(self):
        return int, ("rebuilding this fails in the launching process",)


def _returns_what_the_parent_cannot_rebuild():
    return _OnlyRebuildsInTheRank() if dist.get_rank() == 1 else 0


def test_a_result_that_cannot_be_rebuilt_names_the_rank():
    with pytest.raises(mt.LaunchError, match="rank 1 of 2 returned a value") as info:
        mt.launch(_returns_what_the_parent_cannot_rebuild, 2, timeout=20)
    assert info.value.rank == 1


def _small_view_of_a_big_tensor():
    return torch.arange(25 * 2**20, dtype=torch.float32)[:4]  # 4 elements out of 100 MiB


def test_a_small_view_of_a_big_tensor_comes_back_small():
    run = mt.launch(_small_view_of_a_big_tensor, 2, timeout=30)
    assert torch.equal(run[0], torch.arange(4, dtype=torch.float32))
    assert run[0].untyped_storage().nbytes() == 16  # not the 100 MiB it was cut from


_CELL = '''
def cell_function(limit):
    too_big = limit + 1
    raise IndexError(f"index {too_big} is out of range in this notebook cell")
'''


def test_a_rank_traceback_shows_cell_source_and_not_the_launcher(monkeypatch):
    """Code from a notebook cell has no file; IPython keeps its lines in linecache.
    The rank's traceback shows them, and comes first: the launcher's own frames are
    trimmed (kept when MINITP_DEBUG is set)."""
    import linecache

    name = "/tmp/ipykernel_0/987654.py"  # how ipykernel names a cell; no such file
    monkeypatch.setitem(linecache.cache, name,
                        (len(_CELL), None, _CELL.splitlines(True), name))
    namespace = {"__name__": "__cell__"}
    exec(compile(_CELL, name, "exec"), namespace)
    cell_function = namespace["cell_function"]
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(cell_function, 2, 3, timeout=20)
    assert 'raise IndexError(f"index {too_big} is out of range' in str(info.value)
    frames = [f.filename for f in _frames(info.value.__traceback__)]
    assert sum(_in_the_launcher(f) for f in frames) <= 1, frames

    monkeypatch.setenv("MINITP_DEBUG", "1")
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(cell_function, 2, 3, timeout=20)
    frames = [f.filename for f in _frames(info.value.__traceback__)]
    assert sum(_in_the_launcher(f) for f in frames) > 1, frames


def _in_the_launcher(filename: str) -> bool:
    return any(filename.endswith(os.path.join("minitp", "runtime", name))
               for name in ("launch.py", "_rank_set.py", "_failure_report.py"))


def _frames(tb):
    import traceback

    return traceback.extract_tb(tb)


def _different_collectives():
    axis = mt.Mesh(dp=2, pp=1, tp=1).dp
    with mt.comm.checks(False):  # checked, the two calls are refused at once, before any wait
        if dist.get_rank() == 0:
            mt.comm.all_reduce(torch.ones(4), axis)
        else:
            mt.comm.all_gather(torch.ones(2), axis)


def test_a_timeout_names_every_waiting_rank_and_its_collective():
    """When gloo times one rank out it closes that rank's connections, and the peer's
    collective fails with 'connection closed' instead: that peer was waiting too, and
    must not be reported as 'busy outside any collective' (half the runs, before)."""
    for _ in range(4):
        with pytest.raises(mt.CollectiveTimeout) as info:
            mt.launch(_different_collectives, 2, timeout=1)
        assert sorted(info.value.waiting) == [0, 1], str(info.value)
        assert info.value.waiting[0].startswith("all_reduce on axis dp")
        assert info.value.waiting[1].startswith("all_gather on axis dp")
        # the hang report keeps the first line, then the table of each rank's last
        # collectives (the ring, read from shared memory) and the first that differs
        lines = str(info.value).splitlines()
        assert lines[0] == "a collective was not joined by every rank within timeout=1 s:"
        assert lines[-1] == ("the first collective the ranks disagree on: #0 on axis dp "
                             "ranks [0, 1]: rank 0: all_reduce shape (4,) float32; "
                             "rank 1: all_gather shape (2,) float32")
        assert [e.done for r in (0, 1) for e in info.value.last_collectives[r]] == [False] * 2


_CUT_SHORT = """
import json, os, signal, socket
import multiprocessing.forkserver as mp_forkserver
import minitp as mt
from minitp.runtime import _forkserver

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    mt.launch(os.getpid, 2, timeout=60)                      # the forkserver is up and warm
    server = mp_forkserver._forkserver
    first = server._forkserver_pid
    connect = socket.socket.connect

    def connect_then_interrupt(sock, address):  # Ctrl-C the moment a start has connected
        connect(sock, address)
        if address == server._forkserver_address:
            socket.socket.connect = connect
            os.kill(os.getpid(), signal.SIGINT)

    socket.socket.connect = connect_then_interrupt
    _forkserver._warm_forkserver_pid = None  # as after an interrupted cold start: it probes
    try:
        mt.launch(os.getpid, 2, timeout=60)
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "interrupted"
    run = mt.launch(os.getpid, 2, timeout=60)
    print(json.dumps({"outcome": outcome, "same server": server._forkserver_pid == first,
                      "ranks": len(set(run))}))
"""


def test_an_interrupt_just_after_connecting_to_the_forkserver_does_not_stop_it(tmp_path):
    """CPython's forkserver exits when a client connects and leaves without sending its
    request, then refuses connections for seconds while it still looks alive. A Ctrl-C
    landing between the warm-up's connect and its send did that (the interrupt test's
    flake: the next start, refused): the request now goes whole, only the wait is cut."""
    script = tmp_path / "cut_short.py"
    script.write_text(_CUT_SHORT)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=180, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "outcome": "interrupted", "same server": True, "ranks": 2}, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # the server's own EOFError


_DEAD_SERVER = """
import os, signal, time
import multiprocessing.forkserver as mp_forkserver
import minitp as mt
from minitp.runtime import _forkserver

mt.launch(os.getpid, 2, timeout=60)                      # the forkserver is up and warm
os.kill(mp_forkserver._forkserver._forkserver_pid, signal.SIGKILL)
time.sleep(0.5)
# As when it was still exiting when ensure_running looked (a start cut short by Ctrl-C
# makes CPython's forkserver exit): the next launch's first two looks (warm_up's, and
# the one inside connect_to_new_process) take it for alive; later looks are real.
server = mp_forkserver._forkserver
real, looks = server.ensure_running, []

def looks_alive_twice():
    looks.append(1)
    if len(looks) > 2:
        real()

mp_forkserver.ensure_running = server.ensure_running = looks_alive_twice
_forkserver._warm_forkserver_pid = None
run = mt.launch(os.getpid, 2, timeout=60)
print(len(set(run)))
"""


def test_a_forkserver_that_died_unnoticed_is_started_again(tmp_path):
    """The next launch after a forkserver died unnoticed starts a new one and runs,
    instead of failing with 'Connection refused' (seen after Ctrl-C during a cold start)."""
    script = tmp_path / "dead_server.py"
    script.write_text(_DEAD_SERVER)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=180, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "2"
