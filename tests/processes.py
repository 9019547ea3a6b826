"""Who is still running: the process helpers the multi-process tests share (imported as
`from processes import ...`; tests/conftest.py's fixture uses them too).

Processes are read from /proc (Linux). The multiprocessing forkserver and its
resource tracker are started by the first `mt.launch` and live as long as the
pytest process does, by design: they are not leaks and are never counted.
"""

from __future__ import annotations

import os
import time

_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, state letter) for every process on the machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # it ended while we looked
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parens
        table[int(entry)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def descendants(root: int, table=None) -> set[int]:
    """Every process whose chain of parents leads to `root` (root excluded)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def is_multiprocessing_helper(pid: int) -> bool:
    """The forkserver or the resource tracker (expected to stay for the whole session)."""
    line = cmdline(pid)
    return any(name in line for name in _HELPERS)


def worker_processes() -> set[int]:
    """Descendants of this (pytest) process other than the multiprocessing helpers.

    Zombies count too: a rank that ended but was never reaped is a leak as well.
    """
    return {pid for pid in descendants(os.getpid()) if not is_multiprocessing_helper(pid)}


def wait_until_gone(pids, seconds: float = 3.0, count_zombies: bool = True) -> set[int]:
    """Poll until none of `pids` exists any more; return those still there after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        table = process_table()
        left = {p for p in pids if p in table and (count_zombies or table[p][2] != "Z")}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def describe(pids) -> str:
    table = process_table()
    return "\n".join(
        f"  pid {p} (parent {table.get(p, ('?',))[0]}, state {table.get(p, (0, 0, '?'))[2]}): "
        f"{cmdline(p)[:160]}"
        for p in sorted(pids)
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without torchrun's variables (a script started from a test must
    launch its own ranks, not think it runs under torchrun), plus `extra`."""
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)
    return env | extra
