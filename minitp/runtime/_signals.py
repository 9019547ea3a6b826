"""Signals during a launch: Ctrl-C and SIGTERM held over the stretches that must not be
cut in half, and SIGTERM turned into a teardown before the process dies of it."""

from __future__ import annotations

import contextlib
import multiprocessing.util as mp_util
import os
import shutil
import signal
import threading


@contextlib.contextmanager
def interrupts_deferred():
    """Inside: Ctrl-C (SIGINT) and, during a launch, SIGTERM are held until the block
    ends, then acted on.

    For the short stretches that must not be cut in half: starting a rank (a rank
    forked but never recorded would be lost) and tearing a launch down (a second
    Ctrl-C would leave the rendezvous directory and pipes behind). Only the main
    thread can handle signals, and only Python's own handlers are replaced: a
    shell that ignores SIGINT keeps ignoring it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    replaced = {}
    for signum, ours in ((signal.SIGINT, signal.default_int_handler),
                         (signal.SIGTERM, _terminate)):
        if signal.getsignal(signum) is ours:
            replaced[signum] = ours
            signal.signal(signum, lambda received, _frame: held.append(received))

    def restore():
        for signum, handler in replaced.items():
            signal.signal(signum, handler)

    try:
        yield
    except BaseException:
        restore()
        if signal.SIGTERM in held:
            raise Terminated from None
        raise  # already on its way out; a held Ctrl-C adds nothing
    restore()
    if signal.SIGTERM in held:
        raise Terminated
    if held:
        raise KeyboardInterrupt


class Terminated(BaseException):
    """SIGTERM arrived during a launch: tear it down, then die of SIGTERM as asked."""


def _terminate(_signum, _frame):
    raise Terminated


@contextlib.contextmanager
def cleaned_up_on_sigterm():
    """SIGTERM's default action ends the process on the spot, with no `finally`: the
    rendezvous directory would stay behind. During a launch, SIGTERM raises instead,
    the launch tears down, and then the signal is delivered again with its default
    action, so the process still dies of SIGTERM, as whoever sent it expects."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # What multiprocessing's exit handler would remove (the forkserver's socket
        # lives there); dying of the signal, this process runs no exit handlers.
        shutil.rmtree(mp_util.get_temp_dir(), ignore_errors=True)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
