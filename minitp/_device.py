"""The device this rank computes on: cuda:r under NCCL, the CPU under gloo.

The launcher sets it as a rank starts; `mt.device()` reads it.
"""

from __future__ import annotations

import torch

_current = torch.device("cpu")


def set_current(device: torch.device) -> None:
    global _current
    _current = torch.device(device)


def device() -> torch.device:
    """Where this rank's tensors belong (allocate with ``device=mt.device()``)."""
    return _current
