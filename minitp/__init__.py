"""minitp: Megatron-style model parallelism, built from scratch to be read and taught.

    import minitp as mt
    run = mt.launch(fn, world_size=4)      # fn runs on 4 real processes
    mesh = mt.Mesh(dp=1, pp=1, tp=4)       # inside fn: the rank grid and its groups
    y = mt.comm.all_reduce(x, mesh.tp)     # traced collectives

Where each concept lives (one sub-package per axis, the course apart):
runtime/ (launch, mesh, comm, trace), tensor_parallel/, context_parallel/, pipeline/,
data_parallel/ (with ZeRO 1-3), memory/ (measured), calc/ (modelled), checkpoint/,
train/ (``python -m minitp.train``), course/ (graders, labs, pictures, doctor); and at
the top the model, `parallelize`, `train_step` and the rules they share.
"""

from . import calc, checkpoint, context_parallel, memory
from .data_parallel import make_optimizer
from .model import GPT, GPTConfig
from .parallelize import parallelize
from .rules import check_parallel_config
from .runtime import (
    Axis,
    CollectiveTimeout,
    LaunchError,
    Mesh,
    comm,
    device,
    launch,
    layout,
    trace,
    world,
)
from .step import train_step
from .tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    mappings,
    vocab_parallel_cross_entropy,
)

# What a learner types in the lessons; everything else is reached through its sub-package.
__all__ = [
    "Axis", "CollectiveTimeout", "ColumnParallelLinear", "GPT", "GPTConfig", "LaunchError",
    "Mesh", "RowParallelLinear", "VocabParallelEmbedding", "calc", "check_parallel_config",
    "checkpoint", "comm", "context_parallel", "device", "grade", "labs", "launch", "layout",
    "make_optimizer", "mappings", "memory", "parallelize", "question", "trace", "train_step",
    "viz", "vocab_parallel_cross_entropy", "world",
]


# The course (pictures, labs, the grader) pulls in matplotlib and ipywidgets: it is
# imported on first use, never by `import minitp` or a launched rank.
_LAZY = {"viz": ".course.viz", "labs": ".course.labs"}


def grade(exercise: str, solutions: bool = False, path=None):
    """``mt.grade("ex01")``: grade an exercise on real processes and show what holds.

    The grader (`minitp.course.grading`, with every exercise's graders) is part of the
    course, not the library: it is imported here, on first use."""
    from .course.grading import grade as run_the_grader

    return run_the_grader(exercise, solutions=solutions, path=path)


def question(key: str, seed=None):
    """``mt.question("01.ring-bytes", seed="your name")``: a graded question with your own
    numbers; ``.check(answer)`` says whether it is right and then works it out. Part of
    the course, imported on first use."""
    from .course.questions import question as ask

    return ask(key, seed)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name], __name__)
    raise AttributeError(f"module 'minitp' has no attribute {name!r}")


__version__ = "0.1.0"
