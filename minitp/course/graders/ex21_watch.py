"""ex21 on the ranks: what a ZeRO-3 unit holds, seen from outside the learner's code —
the tensors its forward makes, the buffers backward's all-gathers fill, and the bytes
their storages still hold (ex21_rank.py reads them at each moment the checks name).
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode


class _MadeInForward(TorchFunctionMode):
    """Weak references to every tensor of at least `numel` values made while active."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.made = numel, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.numel:
            self.made.append(weakref.ref(out))
        return out


class _WatchBackward:
    """While active: every buffer an all-gather fills (weakly), and at each
    reduce-scatter the bytes each unit's forward-made tensors hold. (Autograd's
    backward runs outside the forward's function mode: the collectives are watched.)"""

    def __init__(self, made: list[list]):
        self.made, self.gathered, self.held = made, [], []
        self._originals = None

    # torch 2.13's names (minitp's comm calls these) and the deprecated ones a learner
    # may still call: the old ones reach the new through torch's module, not `dist`'s
    # attributes, so each call is watched once.
    GATHERS = ("all_gather_single", "all_gather_into_tensor")
    SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")

    def __enter__(self):
        self._originals = {name: getattr(dist, name) for name in self.GATHERS + self.SCATTERS}

        def watched_gather(gather):
            def watched(output, *args, **kwargs):
                self.gathered.append(weakref.ref(output))
                return gather(output, *args, **kwargs)
            return watched

        def watched_scatter(scatter):
            def watched(*args, **kwargs):
                self.held.append([_bytes(refs) for refs in self.made])
                return scatter(*args, **kwargs)
            return watched

        for name, original in self._originals.items():
            setattr(dist, name, (watched_gather if name in self.GATHERS else watched_scatter)(
                original))
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(dist, name, original)


def _bytes(refs) -> int:
    """Bytes the storages of the still-referenced tensors of `refs` hold (each once)."""
    seen, total = set(), 0
    for ref in refs:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
        del t
    return total


def _alive_bytes(refs, settle: float = 0.2) -> int:
    """`_bytes`, once more than nothing has stayed so `settle` seconds: gloo's worker
    thread may drop its reference to a collective's buffer a moment after ``wait()``."""
    deadline = time.perf_counter() + settle
    while (total := _bytes(refs)) and time.perf_counter() < deadline:
        time.sleep(0.002)
    return total
