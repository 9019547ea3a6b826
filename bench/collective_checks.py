"""What the ranks' agreement check costs each collective: the same ops timed with
`mt.comm.checks` on and off, side by side in one launch.

Before each collective the ranks of its axis exchange a few integers describing
their calls (`minitp.runtime._collective_checks`), so a mismatch raises on every rank
instead of returning garbage. That is one more small round trip per collective; this
measures it: all_reduce, all_gather, broadcast and all_to_all (equal splits, given)
at a few sizes, on gloo. Checks on and off alternate in rounds, so a drift of the
machine (another process, the clock) falls on both alike; each figure is the median
over rounds of the mean time of a block of calls, on rank 0 (every rank waits for the
slowest, so their times agree).

    python bench/collective_checks.py                 # world 2 and 4
    python bench/collective_checks.py --worlds 2 --rounds 5 --calls 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import minitp as mt
from minitp.runtime import comm

SIZES = (256, 16384, 262144)  # float32 elements: 1 KiB, 64 KiB, 1 MiB per rank
ROW = 64  # all_to_all: rows of 64 float32


def _calls(world):
    """Each op as a function of a prepared tensor, and how to prepare it."""
    n = world.size
    return {
        "all_reduce": lambda x: comm.all_reduce(x, world),
        "all_gather": lambda x: comm.all_gather(x, world),
        "broadcast": lambda x: comm.broadcast(x, world, src=0),
        "all_to_all": lambda x: comm.all_to_all(x.view(-1, ROW), world, [x.numel() // ROW // n] * n,
                                                [x.numel() // ROW // n] * n),
    }


def _time_block(call, x, calls: int) -> float:
    with comm.checks(False):
        comm.barrier(mt.world())  # start together, or the first call holds the others' lag
    started = time.perf_counter()
    for _ in range(calls):
        call(x)
    return (time.perf_counter() - started) / calls


def measure(sizes, rounds: int, calls: int):
    world = mt.world()
    results = []
    with mt.trace.paused():  # the trace costs both sides alike; nothing to keep
        for op, call in _calls(world).items():
            for size in sizes:
                x = torch.randn(size)
                for on in (True, False):  # warm-up: connections, allocator
                    with comm.checks(on):
                        _time_block(call, x, 2)
                times = {True: [], False: []}
                for r in range(rounds):
                    for on in ((True, False) if r % 2 == 0 else (False, True)):
                        with comm.checks(on):
                            times[on].append(_time_block(call, x, calls))
                results.append((op, size * 4, statistics.median(times[False]),
                                statistics.median(times[True])))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES),
                        help="float32 elements per rank (a multiple of 64 * world)")
    parser.add_argument("--rounds", type=int, default=9, help="blocks per side, alternating")
    parser.add_argument("--calls", type=int, default=20, help="calls per block")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; median of {args.rounds} blocks of {args.calls} calls, "
          "rank 0\n")
    print("| op | world | bytes per rank | checks off | checks on | on / off | added |")
    print("|---|---|---|---|---|---|---|")
    for n in args.worlds:
        run = mt.launch(measure, n, args.sizes, args.rounds, args.calls, backend="gloo",
                        timeout=600)
        for op, nbytes, off, on in run[0]:
            print(f"| {op} | {n} | {_bytes(nbytes)} | {off * 1e6:,.0f} µs | {on * 1e6:,.0f} µs "
                  f"| {on / off:.2f}× | {(on - off) * 1e6:+,.0f} µs |")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


def _bytes(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


if __name__ == "__main__":
    main()
