"""Bytes this process has written, as the kernel counts them (Linux ``/proc/self/io``).

``wchar`` is every byte the process (all its threads) handed to write(2) and
writev(2): files, pipes and sockets alike. gloo writes its TCP messages with
those calls from this process's threads, so the bytes a rank sends to its peers
show up there, headers included. That is how `minitp.runtime.comm` *measures* what an
operation sent, instead of computing it from the ring formula.

What it cannot see, and why the measured numbers are only what they claim:
  * bytes received: gloo reads its sockets with recv(2), which ``rchar`` does
    not count (it counts read(2)): measured on torch 2.13, a 1 MiB all-reduce
    adds nothing to ``rchar``. On one machine every byte a rank receives was
    sent by a peer, so the received side is the peers' sent side;
  * NCCL: it moves CUDA memory over NVLink, PCIe or InfiniBand, not through the
    process's write calls. On a GPU the measured bytes are ``None``;
  * macOS, Windows, containers without procfs: ``written()`` returns ``None``.

Reading ``/proc/self/io`` is a read, so it moves ``rchar`` but never ``wchar``;
a rank's ``print`` goes to a StringIO (see `minitp.runtime._worker`), not to a write.
"""

from __future__ import annotations

import os

PATH = "/proc/self/io"


def written() -> int | None:
    """Bytes this process has written so far (``wchar``), or None where the kernel
    does not say (no ``/proc/self/io``)."""
    try:
        fd = os.open(PATH, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)  # one read: the whole file is ~120 bytes
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith(b"wchar:"):
            return int(line.split()[1])
    return None


def available() -> bool:
    """Whether this process can count its written bytes."""
    return written() is not None


class Window:
    """The bytes this process writes between opening and `close()`.

    The counter is per process: while two operations are in flight at once (an
    asynchronous all-reduce progressing in gloo's thread while a tensor-parallel
    all-reduce runs, a pipeline's posted send while it receives), their bytes
    are mixed and no attribution would be honest. So a window that was ever open
    together with another is *shared* and `close()` returns None for it; so does
    one opened with ``measurable=False`` (a GPU tensor) or where the counter is
    missing. A posted-then-waited operation opens its window when it is posted
    and closes it when its wait returns: everything gloo wrote for it in between,
    in whatever thread, is in the count.
    """

    _open: list[Window] = []  # per process, like the counter

    def __init__(self, measurable: bool = True):
        self.start = written() if measurable else None
        self.shared = bool(Window._open)
        for other in Window._open:
            other.shared = True
        Window._open.append(self)
        self.closed = False

    def close(self) -> int | None:
        """Stop counting; the bytes written since opening, or None (see the class)."""
        if self.closed:
            return None
        self.closed = True
        Window._open.remove(self)
        if self.start is None or self.shared:
            return None
        end = written()
        return None if end is None else end - self.start
