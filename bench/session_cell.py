"""A live session's cell against a fresh launch of the same body: what `%%ranks` saves.

Three bodies: nothing (``pass``), a print, and one all-reduce of one element over every
rank. Each is timed (median over repeats) as a ``%%ranks`` cell (through IPython's own
cell-magic call, output captured), as ``s.exec`` on the session, and as a fresh
``mt.launch`` of a function doing the same (the forkserver warm). The session's start is
timed too, cold (first of this process: the forkserver imports torch) and warm.

    python bench/session_cell.py                 # world 4 and 8
    python bench/session_cell.py --worlds 4 --repeats 50
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import minitp as mt

BODIES = {
    "pass": "pass",
    "print": "print(rank)",
    "all_reduce": "mt.comm.all_reduce(torch.ones(1), mt.world())",
}


def launched(body: str):
    def fn():
        import torch

        import minitp as mt
        # the names a session's rank has in its namespace
        exec(body, {"mt": mt, "torch": torch, "rank": mt.world().rank})
    return fn


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def bench_world(world_size: int, repeats: int, launch_repeats: int, shell) -> dict:
    from IPython.utils.capture import capture_output

    started = time.perf_counter()
    shell.run_line_magic("ranks", f"start {world_size}")
    start_s = time.perf_counter() - started
    session = shell.magics_manager.registry["RanksMagics"].session
    row = {"world": world_size, "start_s": start_s}
    for name, body in BODIES.items():
        def cell(body=body):
            with capture_output():
                shell.run_cell_magic("ranks", "", body)
        row[f"{name}: %%ranks ms"] = median_ms(cell, repeats)
        row[f"{name}: exec ms"] = median_ms(lambda body=body: session.exec(body), repeats)
        row[f"{name}: launch ms"] = median_ms(
            lambda body=body: mt.launch(launched(body), world_size), launch_repeats)
    shell.run_line_magic("ranks", "stop")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=30, help="cells per body and world")
    parser.add_argument("--launch-repeats", type=int, default=5)
    args = parser.parse_args()
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "minitp")
    torch.set_num_threads(1)
    rows = [bench_world(w, args.repeats, args.launch_repeats, shell) for w in args.worlds]
    print(f"MEASURED on {torch.get_num_threads()} thread(s) here; medians; "
          f"launch = a fresh mt.launch of the same body, forkserver warm")
    for row in rows:
        print(f"\nworld {row['world']}: session start {row['start_s']:.2f} s "
              f"({'cold: the forkserver imports torch' if row is rows[0] else 'warm'})")
        print(f"  {'body':<12}{'%%ranks ms':>12}{'s.exec ms':>12}{'launch ms':>12}"
              f"{'launch / cell':>15}")
        for name in BODIES:
            cell, exec_, launch = (row[f"{name}: {k} ms"] for k in ("%%ranks", "exec", "launch"))
            print(f"  {name:<12}{cell:>12.1f}{exec_:>12.1f}{launch:>12.0f}{launch / cell:>14.0f}x")


if __name__ == "__main__":
    main()
