"""minitp: Megatron-style model parallelism, built from scratch to be read and taught.

    import minitp as mt
    run = mt.launch(fn, world_size=4)      # fn runs on 4 real processes
    mesh = mt.Mesh(dp=1, pp=1, tp=4)       # inside fn: the rank grid and its groups
    y = mt.comm.all_reduce(x, mesh.tp)     # traced collectives
"""

from . import (
    calc,
    checkpoint,
    comm,
    context_parallel,
    data,
    data_parallel,
    mappings,
    memory,
    pipeline,
    rules,
    trace,
    zero,
)
from ._device import device
from .errors import CollectiveTimeout, LaunchError
from .launch import Run, launch
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .loss import vocab_parallel_cross_entropy
from .mesh import Axis, Mesh, layout, world
from .model import GPT, GPTConfig
from .parallelize import parallelize
from .pipeline import PipelineGPT
from .rules import check_parallel_config
from .stage import ParallelGPT
from .step import train_step
from .tensor_parallel_2d import Linear2D
from .trace import Event
from .zero import make_optimizer

__all__ = [
    "Axis", "CollectiveTimeout", "ColumnParallelLinear", "Event", "GPT", "GPTConfig",
    "LaunchError", "Linear2D", "Mesh", "ParallelGPT", "PipelineGPT", "RowParallelLinear", "Run",
    "VocabParallelEmbedding", "calc", "check_parallel_config", "checkpoint", "comm",
    "context_parallel", "data", "data_parallel", "device", "explorer", "grade", "labs",
    "launch", "layout", "make_optimizer", "mappings", "memory",
    "parallelize", "pipeline", "rules", "scaling", "trace", "train_step", "viz",
    "vocab_parallel_cross_entropy", "world", "zero",
]


# viz and the course's labs pull in matplotlib (and ipywidgets): import them on first
# use, not in every rank. mt.explorer and mt.scaling are labs (minitp/labs/).
_LAZY = {"viz": ".viz", "labs": ".labs", "explorer": ".labs.explorer",
         "scaling": ".labs.scaling"}


def grade(exercise: str, solutions: bool = False, path=None):
    """``mt.grade("ex01")``: grade an exercise on real processes and show what holds.

    The grader (`minitp.grading`, with every exercise's checks) is part of the course,
    not the library: it is imported here, on first use, so that ``import minitp`` and
    every launched rank load none of it."""
    from .grading import grade as run_the_grader

    return run_the_grader(exercise, solutions=solutions, path=path)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name], __name__)
    raise AttributeError(f"module 'minitp' has no attribute {name!r}")


__version__ = "0.1.0"
