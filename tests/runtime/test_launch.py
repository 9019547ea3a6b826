"""mt.launch: real processes, results per rank, traces, printed output, and every
way a run can fail (an exception, a hang, a crash, Ctrl-C) ending quickly with
no process left behind; bad arguments refused before anything starts; torchrun."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from helpers import free_port, rotated
from processes import (
    clean_env,
    descendants,
    describe,
    process_table,
    wait_until_gone,
    worker_processes,
)

import minitp as mt

# Workers defined here travel by value, as a notebook's would: the ranks never import this file.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

launch_module = importlib.import_module("minitp.runtime.launch")  # `mt.launch` is the function

pytestmark = pytest.mark.usefixtures("no_leftover_processes")


# --------------------------------------------------------------------------- results
def _identify(base, *, scale):
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
            "value": base * scale + dist.get_rank()}


def test_results_come_back_per_rank():
    run = mt.launch(_identify, 3, 10, scale=2, timeout=30)
    assert len(run) == 3 and run.world_size == 3
    for r in range(3):
        assert run[r]["rank"] == r
        assert run[r]["world"] == 3
        assert run[r]["value"] == 20 + r
    assert run[-1] is run[2]
    assert [result["rank"] for result in run] == [0, 1, 2]
    pids = {result["pid"] for result in run}
    assert len(pids) == 3 and os.getpid() not in pids  # three real, separate processes
    assert run.backend == "gloo"


def test_a_pickled_function_keeps_its_file_name_under_every_cloudpickle():
    """cloudpickle 3.1 made payloads deterministic by renaming every pickled code
    object's file to "<dynamic-code>" (cloudpickle/cloudpickle.py, `_code_reduce`), and
    with it a rank's traceback lost the notebook cell's name and lines. minitp's
    payload keeps the name, nested code (a closure's, a comprehension's) included."""
    import pickle as std_pickle

    from minitp.runtime import _pickling

    def outer():
        def inner():
            return [x for x in range(2)]
        return inner

    here = outer.__code__.co_filename
    version = tuple(int(part) for part in cloudpickle.__version__.split(".")[:3])
    plain = std_pickle.loads(cloudpickle.dumps(outer))
    if version >= (3, 1, 3):  # the behaviour this test exists for: seen in 3.1.3 (and not in
        assert plain.__code__.co_filename == "<dynamic-code>"  # 3.1.2, on a GPU image)
    kept = std_pickle.loads(_pickling.dumps(outer))
    assert kept.__code__.co_filename == here
    assert kept()() == [0, 1]
    nested = [c for c in kept.__code__.co_consts if hasattr(c, "co_filename")]
    assert nested and all(c.co_filename == here for c in nested)


def test_closure_and_lambda_defined_here_run_on_every_rank():
    offset = 7  # captured: only cloudpickle can carry it
    scales = {0: 10, 1: 100}

    def closure(a, b=0):
        return dist.get_rank() * scales[dist.get_rank()] + a + b + offset

    run = mt.launch(closure, 2, 1, b=2, timeout=30)
    assert list(run) == [0 + 1 + 2 + 7, 100 + 1 + 2 + 7]

    run = mt.launch(lambda k, *, m: (dist.get_rank(), k * m + offset), 2, 3, m=5, timeout=30)
    assert list(run) == [(0, 22), (1, 22)]


def _tensor_results():
    x = torch.full((3,), float(dist.get_rank() + 1), requires_grad=True)
    return {
        "leaf": x,
        "nonleaf": x * 2,
        "param": torch.nn.Parameter(torch.ones(2) * dist.get_rank()),
        "nested": [x.sum() * 3, (x + 1,)],
        "plain": torch.arange(4, dtype=torch.float64),
    }


def test_tensors_come_back_detached_on_cpu():
    run = mt.launch(_tensor_results, 2, timeout=30)
    for r in range(2):
        res = run[r]
        tensors = [res["leaf"], res["nonleaf"], res["param"], res["nested"][0],
                   res["nested"][1][0], res["plain"]]
        for t in tensors:
            assert type(t) is torch.Tensor  # not a Parameter any more
            assert t.device.type == "cpu"
            assert not t.requires_grad and t.grad_fn is None
        torch.testing.assert_close(res["leaf"], torch.full((3,), r + 1.0), rtol=0, atol=0)
        torch.testing.assert_close(res["nonleaf"], torch.full((3,), 2 * (r + 1.0)), rtol=0, atol=0)
        torch.testing.assert_close(res["param"], torch.full((2,), float(r)), rtol=0, atol=0)
        assert res["nested"][0].item() == 9.0 * (r + 1)
        torch.testing.assert_close(res["plain"], torch.arange(4, dtype=torch.float64))


def test_device_is_cpu_in_a_gloo_worker():
    run = mt.launch(lambda: (mt.device(), torch.zeros(1, device=mt.device()).device), 2, timeout=30)
    assert list(run) == [(torch.device("cpu"), torch.device("cpu"))] * 2


# --------------------------------------------------------------------------- trace, stdout
def _staggered_collectives():
    rank, n = dist.get_rank(), dist.get_world_size()
    time.sleep(0.3 * (n - 1 - rank))  # the last rank enters first
    mt.comm.all_reduce(torch.ones(4), mt.world())
    mt.comm.all_reduce(torch.ones(2), mt.world())
    mt.comm.all_gather(torch.ones(3), mt.world())
    return rank


def test_trace_merges_every_rank_in_time_order():
    n = 3
    run = mt.launch(_staggered_collectives, n, timeout=30)
    trace = run.trace
    assert len(trace) == 3 * n
    starts = [e.start for e in trace]
    assert starts == sorted(starts)
    # Time order, not rank order: the ranks entered the first all_reduce last-rank-first.
    assert [e.rank for e in trace[:n]] == list(reversed(range(n)))
    for r in range(n):
        mine = [e for e in trace if e.rank == r]
        assert [(e.op, e.shape) for e in mine] == [
            ("all_reduce", (4,)), ("all_reduce", (2,)), ("all_gather", (3,)),
        ]
        assert all(e.end >= e.start >= 0 for e in mine)


def _chatty():
    rank = dist.get_rank()
    for i in range(3):
        print(f"rank {rank} line {i}")
        time.sleep(0.02)
    print(f"err {rank}", file=sys.stderr)
    return rank


def test_stdout_is_kept_apart_per_rank():
    run = mt.launch(_chatty, 3, timeout=30)
    assert len(run.stdout) == 3 and len(run.stderr) == 3
    for r in range(3):
        assert run.stdout[r] == "".join(f"rank {r} line {i}\n" for i in range(3))
        assert f"err {r}\n" in run.stderr[r]
        for other in set(range(3)) - {r}:
            assert f"err {other}" not in run.stderr[r]


def _reports_progress():
    from minitp.runtime.launch import console

    console().write(f"rank {dist.get_rank()} is at step 1\n")
    time.sleep(1.0)  # the rest of the work, during which the line is already on screen
    return dist.get_rank()


class _TimedStream:
    def __init__(self):
        self.writes: list[tuple[float, str]] = []

    def write(self, text):
        self.writes.append((time.monotonic(), text))
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def test_console_text_reaches_the_launchers_stderr_while_the_ranks_run(monkeypatch):
    """A progress bar's channel: what a rank writes to `console()` appears on the stderr
    of the process that launched it (a terminal; in a notebook, the cell) at once, and
    not in `run.stderr`, which comes back at the end."""
    stream = _TimedStream()
    monkeypatch.setattr(sys, "stderr", stream)
    run = mt.launch(_reports_progress, 2, timeout=30)
    returned = time.monotonic()
    monkeypatch.undo()
    seen = {text: t for t, text in stream.writes}
    for rank in range(2):
        line = f"rank {rank} is at step 1\n"
        assert line in seen, stream.writes
        assert returned - seen[line] > 0.5, "console text arrived only with the results"
        assert line not in run.stderr[rank]


# --------------------------------------------------------------------------- failures
def _fails_on(bad_rank, others):
    rank = dist.get_rank()
    if rank == bad_rank:
        time.sleep(0.2)  # let the others get into their wait first
        raise ValueError(f"user error on rank {rank}: boom-7f3a")
    if others == "barrier":
        mt.comm.barrier(mt.world())  # waits for a rank that will never come
    else:
        time.sleep(60)
    return rank


@pytest.mark.parametrize("bad_rank,others", [(1, "barrier"), (0, "sleep"), (2, "barrier")])
def test_exception_on_one_rank_raises_launch_error_and_stops_everyone(bad_rank, others):
    before = worker_processes()
    started = time.monotonic()
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_fails_on, 3, bad_rank, others, timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"the failure took {elapsed:.1f} s to surface"
    err = info.value
    assert not isinstance(err, mt.CollectiveTimeout)
    assert err.rank == bad_rank
    assert "boom-7f3a" in err.remote_traceback and "ValueError" in err.remote_traceback
    assert "_fails_on" in err.remote_traceback  # the user's frame, from the child process
    assert f"rank {bad_rank}" in str(err) and "boom-7f3a" in str(err)
    left = wait_until_gone(worker_processes() - before, seconds=0.5)
    assert not left, "ranks still running after LaunchError:\n" + describe(left)
    # The launcher is usable again straight away.
    assert list(mt.launch(lambda: dist.get_rank(), 2, timeout=30)) == [0, 1]


def _two_fail():
    rank = dist.get_rank()
    if rank in (1, 2):
        raise RuntimeError(f"failure of rank {rank}")
    mt.comm.barrier(mt.world())


def test_when_two_ranks_fail_the_error_names_one_with_its_own_traceback():
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_two_fail, 3, timeout=30)
    err = info.value
    assert err.rank in (1, 2)
    assert f"failure of rank {err.rank}" in err.remote_traceback
    assert f"failure of rank {3 - err.rank}" not in err.remote_traceback
    assert f"rank {err.rank} of 3" in str(err)


def _some_ranks_skip_the_all_reduce(joining):
    rank = dist.get_rank()
    if rank < joining:
        mt.comm.all_reduce(torch.ones(3), mt.world())
    return rank


def test_collective_not_joined_by_every_rank_times_out():
    started = time.monotonic()
    with pytest.raises(mt.CollectiveTimeout) as info:
        mt.launch(_some_ranks_skip_the_all_reduce, 3, 2, timeout=2)
    elapsed = time.monotonic() - started
    err = info.value
    assert isinstance(err, mt.LaunchError)
    assert sorted(err.waiting) == [0, 1]
    for op in err.waiting.values():
        assert "all_reduce" in op and "world" in op
    assert err.finished == [2]
    assert err.rank == 0
    assert "rank 0" in str(err) and "rank 1" in str(err) and "all_reduce" in str(err)
    assert elapsed < 2 + 5.0


def _raw_collective_on_rank0():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(3))  # not through minitp.runtime.comm: no op name to report
    return dist.get_rank()


def test_raw_torch_collective_not_joined_times_out_too():
    with pytest.raises(mt.CollectiveTimeout) as info:
        mt.launch(_raw_collective_on_rank0, 2, timeout=2)
    assert list(info.value.waiting) == [0]
    assert info.value.finished == [1]


def _exits_hard(code):
    if dist.get_rank() == 1:
        os._exit(code)
    mt.comm.barrier(mt.world())
    return 0


def test_rank_dying_with_os_exit_is_named():
    started = time.monotonic()
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_exits_hard, 2, 3, timeout=30)
    assert time.monotonic() - started < 5.0
    assert not isinstance(info.value, mt.CollectiveTimeout)
    assert info.value.rank == 1
    assert "rank 1" in str(info.value) and "code 3" in str(info.value)


def _unpicklable_on_rank1():
    return threading.Lock() if dist.get_rank() == 1 else 0


def test_result_that_cannot_be_sent_back_is_a_launch_error():
    with pytest.raises(mt.LaunchError) as info:
        mt.launch(_unpicklable_on_rank1, 2, timeout=30)
    assert info.value.rank == 1
    assert "cannot be sent back" in str(info.value)


# --------------------------------------------------------------------------- Ctrl-C
_INTERRUPT_SCRIPT = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    import torch.distributed as dist
    import minitp as mt

    # Ctrl-C must raise KeyboardInterrupt here even when the shell running the tests
    # started them in the background (which makes the script inherit SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def sleeper(marker_dir):
        pathlib.Path(marker_dir, f"rank{dist.get_rank()}").write_text(str(os.getpid()))
        time.sleep(120)

    if __name__ == "__main__":
        try:
            mt.launch(sleeper, 2, sys.argv[1], timeout=60)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise
        print("returned normally", flush=True)
""")


@pytest.mark.parametrize("target", ["process", "process-group"])
def test_keyboard_interrupt_stops_every_rank(tmp_path, target):
    """SIGINT to the launching process alone (a Jupyter interrupt) or to its whole
    process group (Ctrl-C in a terminal): it ends, and every process it started ends."""
    script = tmp_path / "interrupt_me.py"
    script.write_text(_INTERRUPT_SCRIPT)
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(markers)], cwd=tmp_path, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(list(markers.iterdir())) < 2:
            if proc.poll() is not None:
                pytest.fail("the script ended before its ranks started:\n" + proc.stderr.read())
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        time.sleep(0.3)  # every rank is now asleep inside fn
        rank_pids = {int(p.read_text()) for p in markers.iterdir()}
        family = descendants(proc.pid) | rank_pids
        assert rank_pids <= family  # the ranks do descend from the launching process
        sent = time.monotonic()
        if target == "process":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        elapsed = time.monotonic() - sent
        assert "interrupted" in out, f"KeyboardInterrupt did not reach the caller:\n{out}\n{err}"
        assert "returned normally" not in out
        assert proc.returncode != 0
        assert elapsed < 5.0, f"took {elapsed:.1f} s to stop after SIGINT"
        left = wait_until_gone(family, seconds=3.0, count_zombies=False)
        assert not left, "still running after Ctrl-C:\n" + describe(left)
        in_session = {pid for pid, (_, sid, state) in process_table().items()
                      if sid == proc.pid and state != "Z"}
        assert not in_session, "still running in the script's session:\n" + describe(in_session)
    finally:
        for pid in family | {proc.pid}:  # only processes this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=10)


# The script has no ``if __name__ == "__main__":``. Ranks get fn by value: they must not
# re-run it (multiprocessing's default, which would fail without the guard), so its top
# level runs twice: itself, and the process it starts with multiprocessing (below).
_UNGUARDED_WITH_A_PROCESS_OF_ITS_OWN = textwrap.dedent("""
    import multiprocessing, os, sys
    import torch.distributed as dist
    import minitp as mt

    with open(sys.argv[2], "a") as log:  # one line each time this top level runs
        log.write(f"{os.getpid()}\\n")

    def double(k):
        return 2 * k + dist.get_rank()

    print("results", list(mt.launch(double, 2, 5, timeout=60)), flush=True)
    # Started by multiprocessing itself, this child runs the script's top level again
    # first (as __mp_main__), and with it the launch above.
    child = multiprocessing.get_context(sys.argv[1]).Process(target=print, args=("child ran",))
    child.start()
    child.join(120)
    print("child exit code", child.exitcode, flush=True)
    print("top levels", os.getpid(), child.pid, flush=True)
""")


# Both start methods bring the child through the same multiprocessing.spawn._main (the
# script's top level run with `_inheriting` set: what launch checks), spawn in a fresh
# interpreter (a torch import: seconds on CI's two cores), forkserver forked: one of the
# two a run, by rotation (helpers.rotated: the other the next UTC day; both with
# MINITP_FULL_MATRIX=1).
@pytest.mark.parametrize("method", rotated(["forkserver", "spawn"]))
def test_an_unguarded_script_whose_own_child_reaches_launch_gets_one_line(tmp_path, method):
    """A script without ``if __name__ == "__main__":`` works until it
    starts a process of its own with multiprocessing (or a DataLoader's workers, where
    forkserver is the default): that child runs the script's top level again and reaches
    mt.launch while it is still being started. It ends at once, saying what to add in one
    line, instead of printing multiprocessing's page-long bootstrapping error. And the
    launch's ranks never ran the top level: only the script and its child did."""
    script = tmp_path / "unguarded_with_a_child.py"
    script.write_text(_UNGUARDED_WITH_A_PROCESS_OF_ITS_OWN)
    log = tmp_path / "ran.txt"
    proc = subprocess.run([sys.executable, str(script), method, str(log)], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert len(out) == 3 and out[:2] == ["results [10, 11]", "child exit code 1"], proc.stdout
    assert out[2].startswith("top levels "), proc.stdout
    # one line for the script, one for its child, in that order; none for a rank
    assert log.read_text().split() == out[2].split()[2:], (log.read_text(), proc.stdout)
    said = proc.stderr.strip().splitlines()
    assert len(said) == 1, proc.stderr[-3000:]
    assert said[0].startswith("minitp: ") and 'if __name__ == "__main__":' in said[0], said


# (leaks over many launches: the soak in test_launch_faults.py)


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "fn,world_size,kwargs,error,words",
    [
        (lambda: 0, 0, {}, ValueError, "world_size"),
        (lambda: 0, -2, {}, ValueError, "world_size"),
        (lambda: 0, 2.0, {}, ValueError, "world_size"),
        (lambda: 0, "2", {}, ValueError, "world_size"),
        (42, 2, {}, TypeError, "function"),
        (None, 2, {}, TypeError, "function"),
        (lambda: 0, 2, {"timeout": 0}, ValueError, "timeout"),
        (lambda: 0, 2, {"timeout": -1.0}, ValueError, "timeout"),
        (lambda: 0, 2, {"timeout": "5"}, ValueError, "timeout"),
        (lambda: 0, 2, {"timeout": float("inf")}, ValueError, "timeout"),
        (lambda: 0, 2, {"timeout": float("nan")}, ValueError, "timeout"),
        (lambda: 0, 2, {"timeout": True}, ValueError, "timeout"),
        (lambda: 0, 2, {"backend": "nccl"}, ValueError, "GPU"),
        (lambda: 0, 2, {"backend": "mpi"}, ValueError, "backend"),
    ],
)
def test_bad_arguments_fail_before_any_process_starts(monkeypatch, fn, world_size, kwargs,
                                                      error, words):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= world_size:
        pytest.skip("this machine has the GPUs for NCCL")

    def no_processes(*a, **k):
        raise AssertionError("launch started processes for a call it should refuse")

    monkeypatch.setattr(launch_module, "_Launch", no_processes)
    forkserver = importlib.import_module("minitp.runtime._forkserver")
    monkeypatch.setattr(forkserver, "context", no_processes)
    before = worker_processes()
    with pytest.raises(error, match=words):
        mt.launch(fn, world_size, **kwargs)
    assert worker_processes() - before == set()


# --------------------------------------------------------------------------- torchrun
_TORCHRUN_SCRIPT = textwrap.dedent("""
    import atexit, json, os
    import torch
    import torch.distributed as dist
    import minitp as mt

    SCRIPT_PID = os.getpid()

    def info(scale):
        rank = dist.get_rank()
        total = mt.comm.all_reduce(torch.full((2,), float(rank + 1)) * scale, mt.world())
        return {"pid": os.getpid(), "rank": rank, "sum": total.tolist(),
                "device": str(mt.device())}

    def tensors():
        x = torch.full((3,), float(dist.get_rank() + 1), requires_grad=True)
        return {"leaf": x, "nonleaf": x * 2}

    if __name__ == "__main__":
        out = {"script_pid": SCRIPT_PID, "env_rank": int(os.environ["RANK"])}
        run = mt.launch(info, 2, 3.0)
        out["results"] = list(run)
        out["len"] = len(run)
        out["trace"] = sorted((e.rank, e.op) for e in run.trace)
        try:
            tensor_run = mt.launch(tensors, 2)
            out["tensors"] = [
                {k: [t.requires_grad, t.device.type, t.tolist()] for k, t in res.items()}
                for res in tensor_run
            ]
        except Exception as exc:
            out["tensors"] = repr(exc)
        try:
            mt.launch(info, 3, 1.0)
            out["mismatch"] = None
        except ValueError as exc:
            out["mismatch"] = str(exc)
        # What the interpreter will run at exit, run now: afterwards no process group
        # that launch created may still be alive (exiting with one alive aborts now and then).
        atexit._run_exitfuncs()
        out["group_alive_after_exit_handlers"] = dist.is_available() and dist.is_initialized()
        with open(f"report{out['env_rank']}.json", "w") as f:  # not stdout: ranks share it
            json.dump(out, f)
""")


def _reports(folder: Path) -> dict[int, dict]:
    """What each rank of a torchrun script wrote to report<rank>.json."""
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("report*.json"))]
    return {rep["env_rank"]: rep for rep in reports}


@pytest.fixture(scope="module")
def torchrun_result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchrun")
    script = folder / "script.py"
    script.write_text(_TORCHRUN_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)],
        cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=180,
    )
    return proc, _reports(folder)


def test_under_torchrun_launch_runs_in_place(torchrun_result):
    proc, reports = torchrun_result
    assert sorted(reports) == [0, 1], proc.stdout + proc.stderr
    for rank, rep in reports.items():
        assert rep["len"] == 2
        # fn ran in this very process, not in a child it started
        assert rep["results"][rank]["pid"] == rep["script_pid"]
        assert rep["results"] == [
            {"pid": reports[r]["script_pid"], "rank": r, "sum": [9.0, 9.0], "device": "cpu"}
            for r in range(2)
        ]
        assert rep["trace"] == [[0, "all_reduce"], [1, "all_reduce"]]
        assert "3" in rep["mismatch"] and "2" in rep["mismatch"]


def test_under_torchrun_tensors_come_back_detached_on_cpu(torchrun_result):
    """run[r] means the same thing in place as in a launched run."""
    proc, reports = torchrun_result
    assert sorted(reports) == [0, 1], proc.stdout + proc.stderr
    for rep in reports.values():
        assert rep["tensors"] == [
            {"leaf": [False, "cpu", [r + 1.0] * 3], "nonleaf": [False, "cpu", [2 * (r + 1.0)] * 3]}
            for r in range(2)
        ]


def test_under_torchrun_the_script_exits_cleanly(torchrun_result):
    proc, reports = torchrun_result
    assert sorted(reports) == [0, 1], proc.stdout + proc.stderr
    for rep in reports.values():
        assert rep["group_alive_after_exit_handlers"] is False
    assert proc.returncode == 0, proc.stderr[-3000:]


_TORCHRUN_FAILING_SCRIPT = textwrap.dedent("""
    import json, os, time
    import torch.distributed as dist
    import minitp as mt

    def failing():
        if dist.get_rank() == 1:
            raise ValueError("torchrun-boom")
        mt.comm.barrier(mt.world())  # rank 0 waits for a rank that has failed
        return 0

    if __name__ == "__main__":
        started = time.monotonic()
        try:
            mt.launch(failing, 2, timeout=6)
            report = {"error": None}
        except Exception as exc:
            report = {"error": type(exc).__name__, "rank": getattr(exc, "rank", None),
                      "traceback": getattr(exc, "remote_traceback", "")}
            raise
        finally:
            report["env_rank"] = int(os.environ["RANK"])
            report["seconds"] = time.monotonic() - started
            with open(f"report{report['env_rank']}.json", "w") as f:
                json.dump(report, f)
""")


def test_under_torchrun_an_exception_on_one_rank_is_a_launch_error_at_once(tmp_path):
    """As in a launched run: the failing rank raises LaunchError naming itself, with its
    traceback, right away (not after `timeout`, with a gloo error in place of the user's),
    and the job ends (torchrun stops the other rank)."""
    script = tmp_path / "failing.py"
    script.write_text(_TORCHRUN_FAILING_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
    )
    reports = _reports(tmp_path)
    assert proc.returncode != 0  # the job failed, as it should
    assert 1 in reports, proc.stdout + proc.stderr[-3000:]
    failed = reports[1]
    assert failed["error"] == "LaunchError" and failed["rank"] == 1, failed
    assert "torchrun-boom" in failed["traceback"]
    assert failed["seconds"] < 4.0, f"rank 1 learnt of its error after {failed['seconds']:.1f} s"


def test_outside_a_launch_there_is_no_process_group():
    # The tests above must not have initialised torch.distributed in the pytest process.
    assert not dist.is_initialized()
