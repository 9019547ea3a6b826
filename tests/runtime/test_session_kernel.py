"""Live ranks in a real Jupyter kernel (jupyter_client, as JupyterLab talks to it): one kernel
and one `%ranks` group for every check, in the order a learner meets them; each failure
must be reported and survived, and the kernel's shutdown must leave nothing behind."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from processes import descendants, wait_until_gone

jupyter_client = pytest.importorskip("jupyter_client")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel-tmp")  # the kernel's TMPDIR: what is left shows
    env = {**os.environ, "TMPDIR": str(tmp)}
    manager, client = jupyter_client.manager.start_new_kernel(
        kernel_name="python3", env=env, startup_timeout=60)
    try:
        out, error = run(client, "%load_ext minitp\n%ranks start 4 --mesh dp=2,tp=2 --timeout 1")
        assert error is None and "4 ranks started (gloo, mesh {'dp': 2, 'tp': 2})" in out, out
        yield manager, client, tmp
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)


def run(client, code: str, interrupt_after: float | None = None, manager=None):
    """Execute ``code``; (what it printed, its error's content or None)."""
    msg_id = client.execute(code)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        manager.interrupt_kernel()
    printed, error = [], None
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            printed.append(content["text"])
        elif kind == "execute_result":
            printed.append(content["data"]["text/plain"] + "\n")
        elif kind == "error":
            error = content
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(printed), error


def rank_pids(client) -> list[int]:
    out, error = run(client, "%%ranks\nimport os\nos.getpid()")
    assert error is None, error
    return [int(line.split()[-1]) for line in out.splitlines()]


def test_a_namespace_lives_on_each_rank_and_outputs_are_labelled(kernel):
    _, client, _ = kernel
    out, error = run(client, "%%ranks\nw = torch.full((2,), float(rank))\n"
                             "print('tp', mesh.tp.rank)")
    assert error is None, error
    assert out.splitlines() == ["[rank 0] tp 0", "[rank 1] tp 1", "[rank 2] tp 0", "[rank 3] tp 1"]
    # ranks 0 and 2 make one dp group: the cell runs on them alone
    out, error = run(client, "%%ranks 0,2\nmt.comm.all_reduce(w, mesh.dp)")
    assert error is None, error
    assert out.splitlines() == ["[rank 0] tensor([2., 2.])", "[rank 2] tensor([2., 2.])"]
    out, _ = run(client, "[e.op for e in _ranks.trace], _ranks[1]")  # that cell's trace
    assert out.strip() == "(['all_reduce', 'all_reduce'], None)"
    # the same group from Python: a function defined in the kernel, and a name's values
    out, error = run(client, "import minitp as mt\n"
                             "from minitp.runtime.ranks_magic import RanksMagics\n"
                             "s = RanksMagics.session\n"
                             "list(s.run(lambda: mt.world().rank + 1, ranks=[1, 3])), "
                             "s.get('w')[3]")
    assert error is None and out.strip() == "([None, 2, None, 4], tensor([3., 3.]))", (out, error)


def test_a_raising_cell_names_the_rank_and_line_and_the_ranks_stay(kernel):
    _, client, _ = kernel
    out, error = run(client, "%%ranks\nkept = rank\nif rank == 2:\n    raise ValueError('no')")
    assert error["ename"] == "LaunchError"
    assert "rank 2 of 4 failed" in error["evalue"] and "line 4" in error["evalue"], error
    out, error = run(client, "%%ranks 3\nkept")
    assert error is None and out == "[rank 3] 3\n", (out, error)


def test_an_interrupt_stops_the_cell_on_every_rank_and_keeps_the_group(kernel):
    manager, client, _ = kernel
    started = time.perf_counter()
    out, error = run(client, "%%ranks\nimport time\ntime.sleep(30)", interrupt_after=0.3,
                     manager=manager)
    assert error["ename"] == "KeyboardInterrupt" and time.perf_counter() - started < 10
    assert "interrupted on ranks [0, 1, 2, 3]; the group and its namespaces are kept" in out
    out, error = run(client, "%%ranks 1\nkept")
    assert error is None and out == "[rank 1] 1\n", (out, error)


def test_a_collective_not_every_rank_joins_times_out_then_restart(kernel):
    _, client, _ = kernel
    out, error = run(client, "%%ranks 0,1\nmt.comm.all_reduce(torch.ones(1), mt.world())")
    assert error["ename"] == "CollectiveTimeout", error
    assert "rank 0: waiting in all_reduce" in error["evalue"]
    assert "ranks [2, 3]: not asked to run this cell" in error["evalue"]
    _, error = run(client, "%%ranks\n1")
    assert error["ename"] == "LaunchError" and "%ranks restart" in error["evalue"]
    out, error = run(client, "%ranks restart")
    assert error is None and out == "4 ranks restarted (namespaces empty)\n", (out, error)
    out, error = run(client, "%%ranks 3\n'kept' in globals()")
    assert error is None and out == "[rank 3] False\n", (out, error)


def test_a_killed_rank_is_reported_and_restart_brings_the_group_back(kernel):
    _, client, _ = kernel
    os.kill(rank_pids(client)[1], signal.SIGKILL)
    _, error = run(client, "%%ranks\n1")
    assert error["ename"] == "LaunchError" and "rank 1 of 4 was killed by signal 9" in error[
        "evalue"], error
    out, error = run(client, "%ranks restart")
    assert error is None, error
    out, error = run(client, "%%ranks\nrank * 10")
    assert error is None and out.splitlines()[-1] == "[rank 3] 30", (out, error)


def test_an_idle_group_sleeps_and_the_kernel_leaves_nothing(kernel):
    manager, client, tmp = kernel
    pids = rank_pids(client)
    out, _ = run(client, "import os; print(os.getpid())")
    everything = descendants(int(out)) | {int(out)}  # ranks, forkserver, resource tracker
    cpu = [_cpu_ticks(pid) for pid in pids]
    time.sleep(0.5)
    # A rank blocks in a read; only gloo's own socket loop thread wakes now and then
    # (measured: one 10 ms tick in 6 s). A polling rank would take ~50 ticks here.
    used = [_cpu_ticks(pid) - before for pid, before in zip(pids, cpu, strict=True)]
    assert max(used) <= 3, f"idle ranks used {used} ticks of 10 ms in 0.5 s"
    segments = {path for pid in everything for path in _shared_memory(pid)}
    client.stop_channels()
    manager.shutdown_kernel(now=False)  # as JupyterLab's "shut down kernel" does
    assert not wait_until_gone(everything, seconds=10)
    assert not [p for p in segments if os.path.exists(p)]
    # torch's compile cache folder (made by importing torch._dynamo) is torch's, not ours
    assert [name for name in os.listdir(tmp) if not name.startswith("torchinductor_")] == []


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _shared_memory(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f
                    if "/dev/shm/" in line and "(deleted)" not in line}
    except OSError:
        return set()
