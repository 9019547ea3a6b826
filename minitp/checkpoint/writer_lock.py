"""One writer at a time in a checkpoint directory, and readers that leave its files alone.

Two runs saving sharded steps into one DIR would interleave their shards into steps that
are half of each run; a reader's clean-up of hidden partial folders would remove a live
writer's files in flight. So the run that writes (global rank 0 of a `sharded.Saver`)
holds an exclusive ``flock`` on ``DIR/.minitp-writer.lock`` from its start to its
`close()`, and everyone else asks first:

* a second writer's check (`holder`) sees the lock taken and is refused in one line;
* a reader cleans up only while it holds a shared lock (`no_writer`), so never beside a
  live writer, and no writer starts in the middle of its clean-up.

An flock belongs to the open file, so the kernel drops it when the process that holds it
dies, however it dies: a killed run never leaves the directory locked for good. The lock
file itself stays (removing it would race a writer opening it); it holds the holder's pid,
for the message only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

LOCK = ".minitp-writer.lock"


def _open(directory: str, create: bool) -> int | None:
    """The lock file: read-write for the writer, read-only for a check (an flock needs no
    write permission, and a classmate reading a shared checkpoint has none); None if no
    writer ever made it."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    try:
        return os.open(os.path.join(directory, LOCK), flags, 0o644)
    except FileNotFoundError:
        return None


def holder(directory: str) -> str | None:
    """Who is writing into `directory` now ("pid 1234"), or None when nobody is."""
    try:
        fd = _open(directory, create=False) if os.path.isdir(directory) else None
    except OSError:  # unreadable: the save's own checks say why it cannot write there
        return None
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # drops the shared lock, if taken
    return None


@contextlib.contextmanager
def no_writer(directory: str):
    """Inside: True if no run is writing into `directory` (and none can start until the
    block ends: a shared lock is held), False if one is (leave its files alone)."""
    try:
        fd = _open(directory, create=False)
    except OSError:  # unreadable: whether a writer is live is unknown, so clean nothing
        yield False
        return
    if fd is None:  # no run has ever held the lock here
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def in_use_message(directory: str, who: str) -> str:
    return (f"{directory!r} is in use: another run ({who}) is saving checkpoints there; "
            f"wait for it to end, or save elsewhere")


def acquire(directory: str, wait: float = 5.0) -> int:
    """Take the writer's lock on `directory` (which exists); returns the file descriptor
    that holds it (`release`). Waits up to `wait` seconds: readers hold their shared
    locks for a moment; a writer that holds it longer is another run (refused)."""
    fd = _open(directory, create=True)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:  # (the pid text may be a killed writer's: not a test)
            if time.monotonic() > deadline:
                who = os.pread(fd, 64, 0).decode(errors="replace").strip() or "a reader"
                os.close(fd)
                raise BlockingIOError(in_use_message(directory, who)) from None
            time.sleep(0.01)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
    return fd


def release(fd: int) -> None:
    """Drop the writer's lock: clear the pid first, so a reader never names a writer gone."""
    os.ftruncate(fd, 0)
    os.close(fd)
