"""Each rank's last few collectives, where the launcher can read them while the rank is
stuck: what a `CollectiveTimeout` prints as one table, with the first collective the
ranks disagree on.

After PyTorch's Flight Recorder (torch/csrc/distributed/c10d/FlightRecorder.hpp keeps
TORCH_FR_BUFFER_SIZE entries, 2000 by default, dumped on a timeout and read by
torch/distributed/flight_recorder/fr_trace.py). minitp keeps `SLOTS` a rank, as text in
the shared memory the launcher hands each rank (beside its status slot): a rank waiting
in a collective, or busy in a loop, cannot send anything back, but the launcher can
read its ring. Like Flight Recorder's ``collective_seq_id``, each entry is numbered on
its group (#k: the k-th collective this rank called on that axis): every rank of a
group must call the same op, with the same shape, at the same #k.

An entry is written when a rank enters a collective (before the check of the ranks'
calls: `_collective_checks.agree`) and marked done when the op completes. Messages
(send, recv) and collectives called outside `minitp.runtime.comm` are not recorded; under
torchrun there is no launcher to read a ring, and none is kept.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, replace

from . import trace

SLOTS = 8  # the last collectives each rank keeps
SLOT_BYTES = 192  # one entry's text: "n|k|op|axis|ranks|shape|dtype|start|state"
RING_BYTES = SLOTS * SLOT_BYTES  # a rank's ring
_FIELDS = 9


@dataclass(frozen=True)
class Entry:
    """One collective a rank entered: its number among this rank's (``n``) and on its
    group (``k``), what it was, when this rank entered it, and whether it completed."""

    n: int
    k: int
    op: str
    axis: str
    ranks: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    start: float
    done: bool

    def call(self) -> str:
        return f"{self.op} shape {self.shape} {self.dtype}"

    def key(self) -> tuple:
        """What must be the same on every rank of the group (an all-to-all's rows, dim 0,
        may differ: its splits are uneven)."""
        return self.op, self.dtype, self.shape[1:] if self.op == "all_to_all" else self.shape

    def text(self) -> str:
        return "|".join(map(str, (self.n, self.k, self.op, self.axis,
                                  ",".join(map(str, self.ranks)),
                                  "x".join(map(str, self.shape)), self.dtype,
                                  f"{self.start:.6f}", "done" if self.done else "entered")))


class Ring:
    """This rank's ring of `SLOTS` entries in the launcher's shared array."""

    def __init__(self, array, rank: int):
        offset = rank * RING_BYTES
        self._slots = [(ctypes.c_char * SLOT_BYTES).from_buffer(array, offset + i * SLOT_BYTES)
                       for i in range(SLOTS)]
        self._entries: list[Entry | None] = [None] * SLOTS
        self._count = 0
        self._on_group: dict[tuple[str, tuple[int, ...]], int] = {}
        self._lock = threading.Lock()  # backward's hooks may post collectives from a thread

    def entered(self, op: str, axis, shape, dtype, start: float) -> None:
        group = (axis.name, tuple(axis.ranks))
        with self._lock:
            k = self._on_group.get(group, 0)
            self._on_group[group] = k + 1
            entry = Entry(self._count, k, op, axis.name, tuple(axis.ranks), tuple(shape),
                          str(dtype).removeprefix("torch."), start, done=False)
            self._write(self._count % SLOTS, entry)
            self._count += 1

    def completed(self, op: str, axis) -> None:
        """Mark done the oldest entry of `op` on `axis` not yet done (ops started without
        waiting complete in the order they were posted)."""
        with self._lock:
            waiting = [(i, e) for i, e in enumerate(self._entries)
                       if e is not None and not e.done and e.op == op
                       and e.axis == axis.name and e.ranks == tuple(axis.ranks)]
            if waiting:
                i, entry = min(waiting, key=lambda pair: pair[1].n)
                self._write(i, replace(entry, done=True))

    def _write(self, i: int, entry: Entry) -> None:
        self._entries[i] = entry
        self._slots[i].value = entry.text().encode()[: SLOT_BYTES - 1]


def entered(op: str, axis, tensor, start: float) -> None:
    ring = trace.recorder().flight
    if ring is not None:
        ring.entered(op, axis, tensor.shape, tensor.dtype, start)


def completed(op: str, axis) -> None:
    ring = trace.recorder().flight
    if ring is not None and axis is not None:
        ring.completed(op, axis)


def read(array, world_size: int) -> dict[int, list[Entry]]:
    """Every rank's entries, oldest first, from the launcher's shared array (a torn
    entry, half rewritten while it was read, is left out)."""
    raw = array.raw if array is not None else b""
    out = {}
    for rank in range(world_size):
        entries = []
        for i in range(SLOTS):
            at = (rank * SLOTS + i) * SLOT_BYTES
            entry = _parse(raw[at:at + SLOT_BYTES].split(b"\0")[0].decode(errors="replace"))
            if entry is not None:
                entries.append(entry)
        out[rank] = sorted(entries, key=lambda e: e.n)
    return out


def _parse(text: str) -> Entry | None:
    parts = text.split("|")
    if len(parts) != _FIELDS:
        return None
    n, k, op, axis, ranks, shape, dtype, start, state = parts
    try:
        return Entry(int(n), int(k), op, axis, tuple(int(r) for r in ranks.split(",") if r),
                     tuple(int(d) for d in shape.split("x") if d), dtype, float(start),
                     state == "done")
    except ValueError:
        return None


def first_disagreement(rings: dict[int, list[Entry]]) -> str | None:
    """The first collective (#k on a group) that the group's ranks disagree on: a
    different op, shape or dtype, or a rank that never called it. Only what every
    member's ring still holds is compared; "first": entered earliest."""
    found = []
    groups = {(e.axis, e.ranks) for entries in rings.values() for e in entries}
    for axis, ranks in groups:
        members = [r for r in ranks if r in rings]
        calls = {r: {e.k: e for e in rings[r] if (e.axis, e.ranks) == (axis, ranks)}
                 for r in members}
        for k in sorted({k for by_k in calls.values() for k in by_k}):
            if any(k not in calls[r] and not _never_called(rings[r], calls[r], k)
                   for r in members):
                continue  # overwritten in a ring: not known
            seen = {r: calls[r].get(k) for r in members}
            if len({e.key() if e else None for e in seen.values()}) > 1:
                first = min(e.start for e in seen.values() if e)
                found.append((first, _describe(axis, ranks, k, seen)))
                break
    return min(found)[1] if found else None


def _never_called(ring: list[Entry], on_group: dict[int, Entry], k: int) -> bool:
    """Whether a rank whose ring lacks #k never called it (rather than its ring having
    overwritten it): its ring is not full, or holds an earlier call on the group."""
    return len(ring) < SLOTS or ring[0].n == 0 or any(j < k for j in on_group)


def _describe(axis: str, ranks, k: int, seen: dict[int, Entry | None]) -> str:
    each = "; ".join(f"rank {r}: {e.call() if e else 'never called it'}"
                     for r, e in seen.items())
    return f"#{k} on axis {axis} ranks {list(ranks)}: {each}"


def report(rings: dict[int, list[Entry]]) -> str:
    """The table a `CollectiveTimeout` prints after its first lines ("" if empty)."""
    if not any(rings.values()):
        return ""
    rows = [("rank", "#k", "op", "axis", "ranks", "shape", "dtype", "entered at", "state")]
    for rank, entries in sorted(rings.items()):
        if not entries:
            rows.append((str(rank), "-", "(no collective yet)", "", "", "", "", "", ""))
        for e in entries:
            rows.append((str(rank), f"#{e.k}", e.op, e.axis, str(list(e.ranks)), str(e.shape),
                         e.dtype, f"{e.start:.3f} s", "done" if e.done else "entered"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                      .rstrip() for row in rows)
    first = first_disagreement(rings)
    verdict = (f"the first collective the ranks disagree on: {first}" if first else
               "every collective the rings hold agrees across its ranks (an older one, or "
               "one outside minitp.runtime.comm, may not)")
    return (f"each rank's last collectives (at most {SLOTS}, oldest first; #k: the k-th "
            f"call on that axis):\n{table}\n{verdict}")
