"""The most bytes a piece of work holds at once, measured by the allocator.

`ActivationLedger` (`minitp.memory.activations`) lists what autograd *keeps*; a peak is
what is alive at the worst moment, temporaries included — a loss's whole-size float32
copies, say, which live only inside its forward or backward. On a GPU that is torch.cuda's
own peak counter. On the CPU torch keeps no such counter, so the profiler records every
allocation and free (``profile_memory=True``), and their running sum, in time order, is
the number of bytes alive; its maximum is the peak.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys

import torch
from torch.autograd.profiler import profile


def peak_allocated(fn, device=None):
    """(fn(), peak bytes): the most bytes allocated at once while `fn` ran, above what was
    allocated when it began (the work's own tensors, freed or not by its end)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - before
    prof = profile(profile_memory=True)
    with _quiet_stderr():  # the profiler's C++ side logs each start and stop to stderr
        prof.__enter__()
    try:
        out = fn()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    changes = sorted((e.start_ns(), e.nbytes()) for e in prof.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type().name == "CPU")
    return out, max(itertools.accumulate((b for _, b in changes), initial=0))


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to /dev/null (C++ writes there, not to sys.stderr), then back."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
