"""What runs inside each rank of a live session (`minitp.runtime.session`): join the group
once, then answer one request at a time (run a function, run a cell's code in this rank's
namespace, read a name from it) until the session ends.

A rank started by `mt.launch` runs one function and leaves; a session's rank stays, blocked
in a read on its pipe between requests, so an idle group costs no CPU. It is forked from the
same forkserver as a launch's ranks and reuses their parts (`_worker`): the lifeline that ends
it with the kernel, the status slot and flight ring a hang is reported from, the trace.
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from . import _device, _flight_recorder, _worker, trace
from .errors import RankTimedOut

INTERRUPT_SIGNAL = signal.SIGUSR1  # the session's "stop this cell"; see `_install_signals`
READY, INTERRUPTED = "ready", "interrupted"
PREAMBLE = "import torch\nimport torch.distributed as dist\nimport minitp as mt\n"
RENDEZVOUS_S = 60.0  # how long ranks may take to join, whatever the session's timeout
_running = False  # inside a request: only then does the session's interrupt raise


def _interrupt(_signum, _frame):
    if _running:
        raise KeyboardInterrupt


def _install_signals() -> None:
    # Jupyter interrupts a kernel by signalling its whole process group, which these ranks
    # are in: they ignore SIGINT, and the session forwards the interrupt itself, to the
    # ranks still running the cell, with a signal of its own (and only while one runs).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(INTERRUPT_SIGNAL, _interrupt)


def main(rank, world_size, store_path, backend, timeout, threads, conn, status, flight,
         env, lifeline, native_stderr_path, mesh):
    _worker._die_with_launcher(lifeline)
    _install_signals()
    _worker._console = _worker._Console(conn, False)
    _worker._capture_native_stderr(native_stderr_path)
    os.environ.update(env)
    torch.set_num_threads(threads)
    recorder = trace.install(rank)
    recorder.status_slot = _worker._StatusSlot(status, rank)
    recorder.flight = _flight_recorder.Ring(flight, rank)
    namespace = {"__name__": "__ranks__", "rank": rank, "world_size": world_size}
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        _device.set_current(device)
        recorder.enter(lambda: "the rendezvous (joining the process group)")
        # Joining may take longer than a collective may wait (a session's timeout can be
        # a second, and forking N ranks on a busy machine takes longer): its own limit.
        joining = timedelta(seconds=max(timeout, RENDEZVOUS_S))
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(joining)
        dist.init_process_group(_device.process_group_backend(backend), store=store, rank=rank,
                                world_size=world_size, timeout=joining)
        dist.distributed_c10d._get_default_group().set_timeout(timedelta(seconds=timeout))
        recorder.leave()
        # The learner's namespace starts as a notebook's would: these lines run as its
        # first cell (the library itself never imports its own facade).
        _exec(PREAMBLE + (f"mesh = mt.Mesh(**{mesh!r})\n" if mesh else ""), namespace,
              "<session start>")
        reply = {"status": READY}
    except BaseException as exc:  # noqa: BLE001 - the parent reports it, naming this rank
        reply = {"status": "error", "error": _traceback(exc), "stdout": "", "stderr": ""}
    _send(conn, reply)
    if reply["status"] != READY:
        return
    serve(conn, namespace, recorder)


def serve(conn, namespace, recorder) -> None:
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())  # blocks: an idle rank uses no CPU
        except (EOFError, OSError):
            return  # the session closed its end: leave
        _send(conn, _answer(request, namespace, recorder))


def _answer(request, namespace, recorder) -> dict:
    global _running
    kind, body, t0 = request["kind"], request["body"], request["t0"]
    recorder.t0 = t0  # every rank's events on one clock, counted from this request
    recorder.status_slot.value = b""  # what an interrupted collective left there
    trace.clear()
    linecache.cache.update(request.get("sources", {}))
    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    reply: dict = {"rank": recorder.rank}
    try:
        _running = True
        try:
            result = _do(kind, body, namespace, request.get("filename", "<ranks>"))
        finally:
            _running = False
        reply.update(status="ok", result=_worker.dumps(result))
    except RankTimedOut as exc:
        reply.update(status="timeout", op=exc.op, error=_traceback(exc))
    except KeyboardInterrupt as exc:
        reply.update(status=INTERRUPTED, error=_traceback(exc))
    except BaseException as exc:  # noqa: BLE001 - a cell's error is reported, the rank stays
        timed_out = isinstance(exc, RuntimeError) and "timed out" in str(exc).lower()
        reply.update(status="timeout" if timed_out else "error", error=_traceback(exc),
                     op="a collective outside minitp.runtime.comm")
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    reply.update(events=trace.events(), stdout=out.getvalue(), stderr=err.getvalue(),
                 last_collective=recorder.status_slot.last_entered)
    return reply


def _do(kind, body, namespace, filename):
    if kind == "run":
        fn, args, kwargs = cloudpickle.loads(body)
        return fn(*args, **kwargs)
    if kind == "get":
        if body not in namespace:
            raise NameError(f"name {body!r} is not defined on this rank")
        return namespace[body]
    return _exec(body, namespace, filename)


def _exec(code: str, namespace: dict, filename: str):
    """Run a cell's code; the value of its last line if that is an expression (as IPython
    shows it), else None. The source goes into linecache so tracebacks show the lines."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    return eval(compile(last, filename, "eval"), namespace) if last is not None else None


def _traceback(exc: BaseException) -> str:
    """The traceback from the user's code down, without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__ and tb.tb_next:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _send(conn, message) -> None:
    try:
        with _worker._console._lock:  # after any console text still being sent
            conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    except OSError:
        pass  # the session is gone; the lifeline ends this rank
