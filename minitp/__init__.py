"""minitp: Megatron-style model parallelism, built from scratch to be read and taught.

    import minitp as mt
    run = mt.launch(fn, world_size=4)      # fn runs on 4 real processes
    mesh = mt.Mesh(dp=1, pp=1, tp=4)       # inside fn: the rank grid and its groups
    y = mt.comm.all_reduce(x, mesh.tp)     # traced collectives
"""

from . import comm, mappings, trace
from ._device import device
from .errors import CollectiveTimeout, LaunchError
from .grade import grade
from .launch import Run, launch
from .mesh import Axis, Mesh, layout, world
from .trace import Event

__all__ = [
    "Axis", "CollectiveTimeout", "Event", "LaunchError", "Mesh", "Run",
    "comm", "device", "grade", "launch", "layout", "mappings", "trace", "viz", "world",
]


def __getattr__(name):
    # viz pulls in matplotlib: import it on first use, not in every rank.
    if name == "viz":
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'minitp' has no attribute {name!r}")
__version__ = "0.1.0"
