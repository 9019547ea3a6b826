"""What several test files need, written once: a free port, random token batches, the
bytes a model and its optimizer keep alive (counted without minitp).

Workers that call these run in ranks, which cannot import this file: like the test
modules, it travels to them by value.
"""

from __future__ import annotations

import gc
import socket
import sys
import types

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


# --------------------------------------------------------------------------- live bytes
_NOT_STATE = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
              types.CodeType, types.FrameType)


def live_bytes(model, optimizer) -> int:
    """Bytes of every storage reachable from `model` and `optimizer`, following
    Python references (gc.get_referents) and each tensor's ``.grad``, each storage
    once: what stays alive because of them. Independent of `measure_model_states`: it
    knows nothing of param_groups, shards or state. Buffers are not model state."""
    modules = {id(m.__dict__) for m in list(sys.modules.values()) if m is not None}
    skip = {id(b) for b in model.buffers()}
    seen, storages, todo = set(), {}, [model, optimizer]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in modules or id(obj) in skip or isinstance(obj, _NOT_STATE):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[(str(obj.device), storage.data_ptr())] = storage.nbytes()
            if obj.grad is not None:  # kept by autograd's metadata, out of gc's sight
                todo.append(obj.grad)
        todo.extend(gc.get_referents(obj))
    return sum(storages.values())
