"""What several test files need, written once: a free port, random token batches.

Workers that call these run in ranks, which cannot import this file: like the test
modules, it travels to them by value.
"""

from __future__ import annotations

import socket
import sys

import cloudpickle
import torch

cloudpickle.register_pickle_by_value(sys.modules[__name__])

IGNORED = -100  # minitp.rules.IGNORE_INDEX: targets the loss skips


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_batches(steps: int, cfg, batch: int, ignored=((0, slice(0, 3)),),
                   device=None) -> list:
    """`steps` global batches (x, y) of random ids, the same on every rank (one seeded
    generator), on `device` (default: the CPU); the targets at each (row, columns) of
    `ignored` are IGNORED, so the loss's mean over non-ignored targets is exercised."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator)
        y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=generator)
        for row, columns in ignored:
            y[row, columns] = IGNORED
        out.append((x.to(device), y.to(device)) if device is not None else (x, y))
    return out
