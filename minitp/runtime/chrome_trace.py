"""A run's trace as a file that Perfetto (https://ui.perfetto.dev) and chrome://tracing
open: ``run.trace.to_chrome("trace.json")``, and ``python -m minitp.train --trace-out``.

The format is Chrome's trace-event JSON ("Trace Event Format", the Google document
linked from docs/debugging.md): one complete event (``"ph": "X"``) per `Event`, with
``ts`` and ``dur`` in microseconds since the launch began (every rank's clock is the
same one), ``pid`` the rank and ``tid`` a lane of it. A collective is named by its op
(``all_reduce``, ``all_gather``, ...) and carries its axis, its group's global ranks
and its bytes in ``args``; a compute span (`trace.region`) is named by its label.

Lanes: a viewer draws the events of one thread as a stack and expects each to end
before the next one starts or to nest inside it. A collective started without waiting
(``all_reduce_start``) runs while the rank computes, and two may be in flight at once,
so each rank has a lane for compute and one for communication, and more of either
where events overlap (the first lane free at an event's start takes it).

Why no library writes it for us: torch.profiler's ``export_chrome_trace`` writes only
what its own profiler recorded (no call takes events from elsewhere), and the
``perfetto`` package's builder writes Perfetto's protobuf format, which
chrome://tracing does not open. The JSON is a list of small dicts: ``json.dump``.
"""

from __future__ import annotations

import json
import os

from .trace import Event

_MICROSECONDS = 1e6


class Trace(list):
    """``run.trace``: every rank's `Event` in time order (a list, as before), which can
    also write itself for a trace viewer (`to_chrome`)."""

    def to_chrome(self, path) -> str:
        """Write this trace to `path` in the Chrome trace-event format (open it in
        https://ui.perfetto.dev or chrome://tracing); returns the path."""
        return write_chrome(self, path)


def check_writable(path) -> None:
    """Raise ValueError (one line) if a file cannot be written at `path`, before any work
    is done whose trace it would hold. Tried by opening it: permissions, a folder that
    does not exist, a folder in the way and a read-only disk all answer the same way."""
    path = _not_a_folder(path)
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write a trace to {path!r}: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)  # only tried: the run writes it at the end


def chrome_events(events: list[Event]) -> list[dict]:
    """The trace-event dicts: a complete ("X") event per Event, then the names of the
    processes (ranks) and threads (lanes) as metadata ("M") events."""
    lanes: dict[tuple[int, str], list[float]] = {}  # (rank, kind) -> each lane's last end
    out, names = [], {}
    for e in sorted(events, key=lambda e: (e.start, e.rank)):
        kind = "comm" if e.is_comm else "compute"
        ends = lanes.setdefault((e.rank, kind), [])
        lane = next((i for i, end in enumerate(ends) if end <= e.start), len(ends))
        if lane == len(ends):
            ends.append(e.end)
        ends[lane] = e.end
        tid = 2 * lane + (kind == "comm")  # 0: compute, 1: communication, 2, 3: overlaps
        names[(e.rank, tid)] = ("communication" if kind == "comm" else "compute") + (
            f" {lane + 1}" if lane else "")
        ts = round(e.start * _MICROSECONDS, 3)
        out.append({"name": _name(e), "cat": _category(e), "ph": "X", "ts": ts,
                    "dur": round(round(e.end * _MICROSECONDS, 3) - ts, 3),
                    "pid": e.rank, "tid": tid, "args": _args(e)})
    for rank in sorted({r for r, _ in names}):
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"name": f"rank {rank}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
    for (rank, tid), name in sorted(names.items()):
        out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid,
                    "args": {"sort_index": tid}})
    return out


def write_chrome(events: list[Event], path) -> str:
    """Write `events` to `path` as a Chrome trace-event file; returns the path."""
    path = _not_a_folder(path)
    document = {"traceEvents": chrome_events(events), "displayTimeUnit": "ms",
                "otherData": {"source": "minitp", "clock": "microseconds since the launch "
                              "began, the same clock on every rank of one machine"}}
    try:
        with open(path, "w") as f:
            json.dump(document, f)
    except OSError as exc:
        raise ValueError(f"cannot write a trace to {path!r}: {exc.strerror or exc}") from None
    return path


def _not_a_folder(path) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder, not a file to write the trace to")
    return path


def _name(e: Event) -> str:
    return e.op if e.is_comm else (e.label or "compute")


def _category(e: Event) -> str:
    if not e.is_comm:
        return "compute"
    return "collective" if e.group_ranks else "p2p"


def _args(e: Event) -> dict:
    if not e.is_comm:
        return {"phase": e.phase, "label": e.label}
    args = {"axis": e.axis, "group": list(e.group_ranks), "bytes": e.nbytes,
            "model_bytes": e.model_bytes, "sent_bytes": e.sent_bytes,
            "shape": list(e.shape), "dtype": e.dtype, "phase": e.phase, "label": e.label}
    if e.peer is not None:
        args["peer"] = e.peer
    return args
