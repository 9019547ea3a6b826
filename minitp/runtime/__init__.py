"""The runtime every axis stands on: real processes, the rank grid, traced messages.

* `launch`: ``launch(fn, world_size)`` runs `fn` on N processes (a forkserver's
  children, or torchrun's) and returns a `Run`; ``_forkserver``, ``_rank_set``,
  ``_worker``, ``_failure_report`` (with ``_flight_recorder``: a hang's last collectives),
  ``_signals``, ``_run`` and ``_pickling`` are its parts.
* `mesh`: `Mesh`, the (dp, pp, cp, tp) grid of ranks with one process group per
  axis, and `Axis`, one of them.
* `comm`: every collective (all-to-all with uneven splits included) and point-to-point
  message, traced (`comm_pending` for those posted now and waited on later).
* `trace`: the events each rank records, with bytes measured by the kernel
  (`io_counters`); `chrome_trace`: ``run.trace.to_chrome(path)``, a file Perfetto opens.
* `_device`: the device this rank computes on (`device()`); `peak`: its peak FLOP/s for MFU.
* `session`: ``session(N)``, ranks that stay alive between requests, each with a namespace
  (``_session_group``, ``_session_rank``); `ranks_magic`: ``%%ranks`` cells over it.
* `errors`: what a failed launch raises.
"""

from . import comm, trace
from ._device import device
from .errors import CollectiveTimeout, LaunchError
from .launch import Run, console, launch
from .mesh import Axis, Mesh, layout, world
from .session import session

__all__ = ["Axis", "CollectiveTimeout", "LaunchError", "Mesh", "Run", "comm", "console",
           "device", "launch", "layout", "session", "trace", "world"]
