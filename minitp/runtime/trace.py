"""Event records of every collective, point-to-point message and compute phase.

Each process keeps one `Recorder`. `minitp.runtime.comm` appends an `Event` for every
collective it runs; `region(...)` records a named compute phase. The launcher
ships each rank's events back to the parent, where `Run.trace` merges them in
time order. That list is what the notebooks draw and what the tests count.

The recorder is per *process* (a rank is a process), which is why it may live at
module level: it holds no process group and no model state, only a log.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Event:
    """One thing a rank did, with when it started and ended.

    ``shape`` is the shape of this rank's input tensor; ``nbytes`` is the size of
    the full logical tensor the op is about (the all-reduced tensor, the gathered
    output, the reduce-scatter input, the message).

    Two byte counts, never to be confused:
      * ``model_bytes``: what this rank sends under the ring MODEL, computed from
        ``nbytes`` (all-reduce 2(n-1)/n·S, all-gather and reduce-scatter
        (n-1)/n·S, a send S; a broadcast's chain: S, 0 for its last rank);
      * ``sent_bytes``: what this rank MEASURABLY wrote to its sockets during the
        op, from the kernel's per-process counter (`minitp.runtime.io_counters`), or
        ``None`` where it cannot be measured: NCCL/GPU tensors, no
        ``/proc/self/io``, or another op in flight in this process at the same
        time (the counter is per process and cannot split bytes between them).
    On gloo they agree within headers for all-reduce, all-gather, send; they do
    not for reduce-scatter (gloo sends an all-reduce's bytes) nor for a
    broadcast over more than two ranks (gloo uses a tree, not a chain).
    ``start``/``end`` are seconds since the launch began (the same clock on
    every rank of one machine). ``phase`` is "fwd", "bwd" or "" (neither).
    """

    rank: int
    op: str
    axis: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    model_bytes: int
    start: float
    end: float
    phase: str = ""
    label: str = ""
    peer: int | None = None  # the other global rank of a send / recv
    group_ranks: tuple[int, ...] = field(default=())
    sent_bytes: int | None = None  # measured; None: not measurable (see above)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def is_comm(self) -> bool:
        return self.op != "compute"


class Recorder:
    """Collects this process's events; `phase` and `label` are set by context managers."""

    def __init__(self, rank: int = 0, t0: float | None = None):
        self.rank = rank
        self.t0 = time.perf_counter() if t0 is None else t0
        self.events: list[Event] = []
        self.enabled = True
        self._local = threading.local()  # phase/label stacks: autograd may run backward in a thread
        # Shared memory the launcher reads if this rank hangs: what it is waiting in.
        self.status_slot = None
        self.flight = None  # and this rank's last collectives (`_flight_recorder.Ring`)

    # -- context -------------------------------------------------------------
    def _stack(self, name: str) -> list[str]:
        stack = getattr(self._local, name, None)
        if stack is None:
            stack = []
            setattr(self._local, name, stack)
        return stack

    @property
    def phase(self) -> str:
        stack = self._stack("phase")
        return stack[-1] if stack else ""

    @property
    def label(self) -> str:
        stack = self._stack("label")
        return ".".join(stack)

    def enter(self, describe) -> None:
        """Say (to the launcher, through shared memory) which collective this rank waits in."""
        if self.status_slot is not None:
            self.status_slot.value = describe().encode()[: len(self.status_slot) - 1]

    def leave(self) -> None:
        if self.status_slot is not None:
            self.status_slot.value = b""

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, **fields) -> Event:
        fields.setdefault("rank", self.rank)
        fields.setdefault("phase", self.phase)
        fields.setdefault("label", self.label)
        event = Event(**fields)
        if self.enabled:
            self.events.append(event)
        return event


_recorder = Recorder()


def recorder() -> Recorder:
    """This process's recorder (the launcher installs a fresh one in every rank)."""
    return _recorder


def install(rank: int, t0: float | None = None) -> Recorder:
    """Start a fresh log for `rank`; called by the launcher as a rank starts."""
    global _recorder
    _recorder = Recorder(rank, t0)
    return _recorder


def events() -> list[Event]:
    """The events this rank recorded so far."""
    return list(_recorder.events)


def clear() -> None:
    _recorder.events.clear()


@contextlib.contextmanager
def phase(name: str):
    """Mark everything inside as forward ("fwd") or backward ("bwd") work."""
    stack = _recorder._stack("phase")
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def label(name: str):
    """Name what the events inside belong to (nested labels join with dots)."""
    stack = _recorder._stack("label")
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def relabel(full_label: str):
    """Record inside under exactly `full_label` (how backward reuses its forward's label)."""
    stack = _recorder._stack("label")
    saved = list(stack)
    stack[:] = [full_label] if full_label else []
    try:
        yield
    finally:
        stack[:] = saved


@contextlib.contextmanager
def paused():
    """Record nothing inside (for warm-ups and bookkeeping collectives)."""
    was = _recorder.enabled
    _recorder.enabled = False
    try:
        yield
    finally:
        _recorder.enabled = was


@contextlib.contextmanager
def region(name: str, phase_name: str | None = None):
    """Record the time spent inside as one "compute" event called `name`."""
    rec = _recorder
    start = rec.now()
    try:
        yield
    finally:
        rec.add(
            op="compute", axis="", shape=(), dtype="", nbytes=0, model_bytes=0,
            start=start, end=rec.now(), label=name,
            **({"phase": phase_name} if phase_name else {}),
        )


def current_phase() -> str:
    """The phase in force: an explicit `phase(...)`, else "bwd" inside autograd's
    backward, else "" (a collective that is part of neither pass)."""
    explicit = _recorder.phase
    if explicit:
        return explicit
    return "bwd" if _in_backward() else ""


@contextlib.contextmanager
def forward_phase():
    """Mark what runs inside as forward work, unless a phase is already set or we are
    inside backward (a forward recomputed there belongs to the backward pass's time)."""
    if _recorder.phase or _in_backward():
        yield
    else:
        with phase("fwd"):
            yield


def label_module(module, name: str) -> None:
    """Record everything `module`'s forward does under the label `name`.

    Forward hooks, not code in the module: the model stays free of tracing (it
    holds no parallel code), and `parallelize` names its pieces ("embedding",
    "layer3", "head", "loss") after building them. A backward collective gets
    its forward's label through the autograd Function that records it."""

    def enter(_module, _args):
        _recorder._stack("label").append(name)

    def leave(_module, _args, _output):
        _recorder._stack("label").pop()

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


def forward_phase_module(module) -> None:
    """Run `module`'s forward under `forward_phase()` (hooks, as `label_module`)."""
    entered: list[bool] = []

    def enter(_module, _args):
        pushed = not (_recorder.phase or _in_backward())
        if pushed:
            _recorder._stack("phase").append("fwd")
        entered.append(pushed)

    def leave(_module, _args, _output):
        if entered.pop():
            _recorder._stack("phase").pop()

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


def _in_backward() -> bool:
    # The autograd engine sets a graph-task id while it runs backward functions.
    get_id = getattr(torch._C, "_current_graph_task_id", None)
    return get_id is not None and get_id() != -1


def merge(per_rank: list[list[Event]]) -> list[Event]:
    """All ranks' events in one list, ordered by start time then rank."""
    merged = [e for events_ in per_rank for e in events_]
    merged.sort(key=lambda e: (e.start, e.rank))
    return merged
