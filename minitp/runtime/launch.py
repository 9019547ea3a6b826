"""``mt.launch(fn, world_size)``: run a function on N real processes, get back what each returned.

How, and why (the start-up times are measured by bench/launch.py):

* Ranks are forked from a *forkserver* that has torch and minitp imported
  already, so a launch costs a fraction of a second instead of a fresh
  interpreter importing torch per rank (``spawn``). Plain ``fork`` is unsafe
  from a Jupyter kernel (it has threads) and cannot re-initialise CUDA.
* ``fn`` travels as cloudpickle bytes, so a function (or closure) defined in a
  notebook cell runs on every rank.
* The rendezvous is a file store in a fresh temporary directory, not a TCP
  store on a port: nothing to race for, and (measured, torch 2.13) a TCP store
  client now and then stalls 5 s on connect. gloo's own connections bind to
  the loopback interface on ports the kernel picks.
* Each rank sends back exactly one message. The parent waits on all pipes and
  process sentinels at once, so the first failure is seen at once; then every
  rank is killed and the failure raised here, naming the rank.
* While a rank waits inside a collective it writes what it waits in to a small
  shared-memory slot; a rank that waits longer than ``timeout`` makes the whole
  run fail with `CollectiveTimeout` naming every waiting rank and its op.

Under ``torchrun`` (its environment variables set) `launch` does not start
processes: it runs ``fn`` in place, on the process group torchrun set up, and
gathers every rank's return value so ``run[r]`` means the same thing.

Where each part lives: `minitp.runtime._forkserver` (where ranks come from, and what a
killed launcher left), `minitp.runtime._rank_set` (one launch's ranks from start to end),
`minitp.runtime._failure_report` (what a failed launch says), `minitp.runtime._signals` (Ctrl-C and
SIGTERM during a launch), `minitp.runtime._run` (`Run`, what comes back). What runs *inside*
a rank lives in `minitp.runtime._worker`.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from ..rules import check_positive_int, check_timeout
from . import _device, _pickling, trace
from ._failure_report import is_cascade, tail
from ._rank_set import Launch as _Launch
from ._run import Run as Run
from ._worker import console as console
from ._worker import dumps as _dump_result
from .errors import LaunchError

DEBUG_ENV = "MINITP_DEBUG"  # set it (to anything) to keep minitp's frames in launch errors


def launch(
    fn, world_size: int, *args, backend: str = "auto", timeout: float = 120.0, **kwargs
) -> Run:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` processes joined in one process group.

    backend: "auto" picks NCCL (rank r on cuda:r) when CUDA has at least
        ``world_size`` devices, else gloo on the CPU; or say "gloo" / "nccl".
    timeout: seconds a rank may wait in one collective (or the rendezvous)
        before the run fails with `CollectiveTimeout`.
    Returns a `Run`; raises `LaunchError` naming the first rank that failed.
    What ranks print comes back in ``run.stdout``/``run.stderr`` at the end; what a
    rank writes to `console()` (``from minitp.runtime.launch import console``: a progress bar)
    reaches this process's stderr as it is written.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        _stop_a_script_run_again()
    if not callable(fn):
        raise TypeError(f"launch needs a function to run, got {type(fn).__name__}")
    check_positive_int("world_size", world_size)
    check_timeout(timeout)
    if _under_torchrun():
        return _run_in_place(fn, world_size, args, kwargs, backend, timeout)
    backend = _choose_backend(backend, world_size)
    payload = _pickling.dumps((fn, args, kwargs))
    try:
        return _Launch(payload, world_size, backend, float(timeout)).run()
    except LaunchError as error:
        if os.environ.get(DEBUG_ENV):
            raise
        # The rank's traceback (in the message) is what the learner needs; the
        # launcher's own frames above it would only push it off the screen.
        raise error.with_traceback(None) from None


def _stop_a_script_run_again():
    """One line and out, in a process that multiprocessing is starting from a script.

    multiprocessing's spawn and forkserver children run the starting script's top level
    again (as ``__mp_main__``) before their target. `launch`'s ranks never do, so a script
    that calls `launch` at its top level works; but if the script also starts processes of
    its own (multiprocessing, a DataLoader's workers where forkserver is the default), each
    of those reaches this call. Going on would start processes from a process still being
    started: multiprocessing refuses with a page-long RuntimeError, printed by every such
    child. Instead: what to add, once, and this child ends (SystemExit passes any
    ``except Exception`` around the call, and prints no traceback).
    """
    print("minitp: a process that multiprocessing started from this script ran its top level "
          "again, and reached mt.launch there: put the script's top-level code under "
          'if __name__ == "__main__":', file=sys.stderr, flush=True)
    raise SystemExit(1)


def _choose_backend(backend: str, local_ranks: int) -> str:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    chosen, why = _device.choose_backend(backend, local_ranks, gpus, dist.is_nccl_available())
    if backend == "auto" and chosen == "gloo" and gpus > 0:
        _say_once(why)
    return chosen


_said: set[str] = set()
# Set to "0" to keep the fallback notice off stderr: notebooks/conftest.py does, so a
# notebook checked by nbval on a GPU node shows what the committed (CPU) outputs show.
NOTICE_ENV = "MINITP_FALLBACK_NOTICE"


def _say_once(line: str) -> None:
    """One line on stderr the first time a launch falls back from the GPUs it sees."""
    if line not in _said and os.environ.get(NOTICE_ENV, "1") != "0":
        _said.add(line)
        print(f"minitp: {line}", file=sys.stderr)


# --------------------------------------------------------------------------- torchrun
def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _destroy_if_initialized() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _run_in_place(fn, world_size, args, kwargs, backend, timeout) -> Run:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"launch(fn, {world_size}) under torchrun, which started {env_world} processes: "
            f"pass world_size={env_world} (or use --nproc-per-node/--nnodes to match)"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", env_world))
    if not dist.is_initialized():
        backend = _choose_backend(backend, local_ranks)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(_device.process_group_backend(backend),
                                timeout=timedelta(seconds=timeout))
        # We opened it, so we close it: a gloo group left open at interpreter exit
        # sometimes aborts the process ("terminate called without an active exception").
        atexit.register(_destroy_if_initialized)
    else:  # torchrun's script made the group itself: follow what it chose
        backend = "nccl" if "nccl" in str(dist.get_backend()) else "gloo"
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    _device.set_current(device)
    started = time.perf_counter()
    trace.install(dist.get_rank(), started)
    rank = dist.get_rank()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        # Fail here, at once. The other ranks may be waiting in a collective this rank
        # will never join, so gathering the error would hang (or pair with their
        # collective and fail with a gloo error instead). torchrun stops the others.
        text = traceback.format_exc()
        if is_cascade(text):  # the echo of another rank's end, not this rank's own fault
            raise LaunchError(
                f"rank {rank} of {env_world} lost a peer: a collective failed with "
                f"{text.strip().splitlines()[-1]!r}. Another rank of this job ended first "
                "(its process or its node died, or it failed): the error that ended it is "
                f"in that rank's log, on its node.\n{tail(text, 8)}",
                rank=rank, remote_traceback=text,
            ) from exc
        raise LaunchError(
            f"rank {rank} of {env_world} failed:\n{tail(text)}",
            rank=rank, remote_traceback=text,
        ) from exc
    # As in a launched run, results travel as CPU tensors detached from autograd.
    mine = {"result": _dump_result(result), "events": trace.events()}
    gathered: list = [None] * env_world
    dist.all_gather_object(gathered, mine)
    return Run(
        [pickle.loads(g["result"]) for g in gathered],
        [g["events"] for g in gathered],
        [""] * env_world,  # under torchrun each rank prints to its own terminal stream
        [""] * env_world,
        backend,
        time.perf_counter() - started,
    )
