"""Whether a process still runs: how what a killed process left on disk is told apart
from what a live one is still using (a launch's directories, a save in progress)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while process `pid` exists (a zombie counts: its pid is not yet free)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds that pid
        return True
    return True
