"""`Run`: what a launch produced, one entry per rank, with the trace and what each printed."""

from __future__ import annotations

from collections.abc import Sequence

from . import trace
from .chrome_trace import Trace


class Run(Sequence):
    """What a launch produced: ``run[r]`` is rank r's return value.

    ``run.trace`` holds every rank's `Event` in time order (a list; its
    ``to_chrome(path)`` writes it for Perfetto), ``run.stdout[r]`` and ``run.stderr[r]``
    what rank r printed (kept apart, never interleaved).
    """

    def __init__(self, results, events, stdout, stderr, backend, seconds):
        self._results = list(results)
        self.trace: Trace = Trace(trace.merge(events))
        self.stdout: list[str] = list(stdout)
        self.stderr: list[str] = list(stderr)
        self.backend = backend
        self.seconds = seconds

    @property
    def world_size(self) -> int:
        return len(self._results)

    def __getitem__(self, index):
        return self._results[index]

    def __len__(self) -> int:
        return len(self._results)

    def show_stdout(self) -> None:
        """Print what each rank printed, rank by rank."""
        for rank, text in enumerate(self.stdout):
            for line in text.splitlines() or ["(nothing)"]:
                print(f"[rank {rank}] {line}")

    def __repr__(self) -> str:
        comm = sum(1 for e in self.trace if e.is_comm)
        return (
            f"Run(world_size={self.world_size}, backend={self.backend!r}, "
            f"{len(self.trace)} events ({comm} communication), {self.seconds:.2f} s)"
        )
