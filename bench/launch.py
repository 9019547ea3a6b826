"""Launch latency: mt.launch beside torch.multiprocessing.spawn, same work, one run.

The work is the smallest a lesson does: join a gloo process group and all-reduce
one small tensor. mt.launch forks ranks from a forkserver that has torch loaded;
spawn starts a fresh interpreter per rank, which imports torch again. We report
the median over repeated launches (mt.launch's first launch, which starts the
forkserver, is shown apart) and the ratio spawn / mt.launch.

    python bench/launch.py                 # world 2, 4, 8
    python bench/launch.py --repeats 20 --spawn-repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing

import minitp as mt


def launched_work():
    return mt.comm.all_reduce(torch.ones(4), mt.world()).sum().item()


def spawned_work(rank, world_size, store_path):
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.destroy_process_group()


def time_spawn(world_size: int) -> float:
    folder = tempfile.mkdtemp(prefix="bench-spawn-")
    started = time.perf_counter()
    torch.multiprocessing.spawn(spawned_work, args=(world_size, os.path.join(folder, "store")),
                                nprocs=world_size, join=True)
    return time.perf_counter() - started


def time_launch(world_size: int) -> float:
    started = time.perf_counter()
    run = mt.launch(launched_work, world_size, timeout=120)
    assert run[0] == 4 * world_size
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=10, help="mt.launch launches per world")
    parser.add_argument("--spawn-repeats", type=int, default=3, help="spawn launches per world")
    args = parser.parse_args()

    first = time_launch(args.worlds[0])  # starts the forkserver
    print(f"cores: {os.cpu_count()}, torch {torch.__version__}; "
          f"first mt.launch (starts the forkserver): {first:.2f} s")
    header = ("world", "mt.launch median", "spawn median", "spawn / launch")
    print(f"{header[0]:>5} | {header[1]:>16} | {header[2]:>12} | {header[3]:>14}")
    print(f"{'-' * 5}-+-{'-' * 16}-+-{'-' * 12}-+-{'-' * 14}")
    for world_size in args.worlds:
        launches = [time_launch(world_size) for _ in range(args.repeats)]
        spawns = [time_spawn(world_size) for _ in range(args.spawn_repeats)]
        ours, theirs = statistics.median(launches), statistics.median(spawns)
        print(f"{world_size:>5} | {ours:>14.3f} s | {theirs:>10.2f} s | {theirs / ours:>13.1f}x")


if __name__ == "__main__":
    main()
