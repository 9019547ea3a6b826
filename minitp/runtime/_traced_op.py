"""The window every collective and message is recorded in: mark this rank as waiting
in the op (for the launcher's timeout report), time it, count the bytes this process
writes meanwhile (measured) beside the ring model's bytes, and turn a backend's
timeout into `RankTimedOut`."""

from __future__ import annotations

import re

from ..rules import ring_wire_bytes
from . import _flight_recorder, trace
from .errors import RankTimedOut
from .io_counters import Window
from .mesh import Axis

# gloo says "Timed out waiting 5000ms for recv operation"; NCCL's watchdog says
# "Watchdog caught collective operation timeout". Either means a peer never came.
TIMEOUT_PATTERN = re.compile(r"timed out|timeout", re.IGNORECASE)


def record_p2p(op, tensor, peer, start) -> None:
    rec = trace.recorder()
    nbytes = tensor.numel() * tensor.element_size()
    rec.add(
        op=op, axis="p2p", shape=tuple(tensor.shape),
        dtype=str(tensor.dtype).removeprefix("torch."), nbytes=nbytes,
        model_bytes=ring_wire_bytes(op, nbytes, 2), start=start, end=rec.now(),
        phase=trace.current_phase(), peer=peer,
    )


def describe(op, axis: Axis | None, shape, peer=None) -> str:
    """What a rank waiting in this op is waiting in, as the launcher's reports say it."""
    where = f"axis {axis.name} ranks {list(axis.ranks)}" if axis else f"peer rank {peer}"
    return f"{op} on {where}, shape {tuple(shape)}"


def _model_bytes(op: str, nbytes: int, axis: Axis | None, src: int) -> int:
    """The ring model of what this rank sends (`minitp.rules.ring_wire_bytes`),
    except a broadcast, whose chain from `src` has every rank send S but the last."""
    if op == "barrier":
        return 0
    if op == "broadcast":
        return 0 if (axis.rank - src) % axis.size == axis.size - 1 else nbytes
    return ring_wire_bytes(op, nbytes, axis.size if axis else 2)


class TracedOp:
    """Context manager: mark this rank as waiting in `op`, time it, count the bytes
    this process writes meanwhile, record the Event. `window`: one already opened
    (by `Pending`, when the op was posted); `start`: when this rank entered the op, if
    before this (its ranks' calls were compared first: `_collective_checks.agree`)."""

    def __init__(self, op, axis: Axis | None, tensor, nbytes, peer=None, src=0, window=None,
                 via: str = "p2p", model_bytes: int | None = None, start=None):
        self.op, self.axis, self.tensor, self.nbytes, self.peer = op, axis, tensor, nbytes, peer
        self.src, self.window, self.via = src, window, via  # via: a send's axis name
        self.model = model_bytes  # where the ring formula does not say (an all-to-all)
        self.start = start

    def describe(self) -> str:
        return describe(self.op, self.axis, self.tensor.shape, self.peer)

    def __enter__(self):
        self.rec = trace.recorder()
        self.rec.enter(self.describe)
        if self.start is None:
            self.start = self.rec.now()
        if self.window is None:
            self.window = Window(measurable=self.tensor.device.type == "cpu")
        return self

    def __exit__(self, exc_type, exc, tb):
        sent = self.window.close()
        if exc is not None:
            if TIMEOUT_PATTERN.search(str(exc)):
                # Keep the status slot set: the launcher reads it to name every waiting
                # rank, including ranks whose own report it has not read yet.
                raise RankTimedOut(self.describe(), str(exc).strip()) from exc
            self.rec.leave()
            return False
        self.rec.leave()
        _flight_recorder.completed(self.op, self.axis)
        self.rec.add(
            op=self.op,
            axis=self.axis.name if self.axis else self.via,
            shape=tuple(self.tensor.shape),
            dtype=str(self.tensor.dtype).removeprefix("torch."),
            nbytes=int(self.nbytes),
            model_bytes=(self.model if self.model is not None
                         else _model_bytes(self.op, int(self.nbytes), self.axis, self.src)),
            sent_bytes=sent,
            start=self.start,
            end=self.rec.now(),
            phase=trace.current_phase(),
            peer=self.peer,
            group_ranks=tuple(self.axis.ranks) if self.axis else (),
        )
        return False
