"""The most bytes a piece of work holds at once, measured by the allocator.

`ActivationLedger` (`minitp.memory.activations`) lists what autograd *keeps*; a peak is
what is alive at the worst moment, temporaries included — a loss's whole-size float32
copies, say, which live only inside its forward or backward. On a GPU that is torch.cuda's
own peak counter. On the CPU torch keeps no such counter, so the profiler records every
allocation and free (``profile_memory=True``), and their running sum, in time order, is
the number of bytes alive; its maximum is the peak.
"""

from __future__ import annotations

import itertools

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
    with profile(profile_memory=True) as prof:
        out = fn()
    changes = sorted((e.start_ns(), e.nbytes()) for e in prof.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type().name == "CPU")
    return out, max(itertools.accumulate((b for _, b in changes), initial=0))
