"""minitp: Megatron-style model parallelism, built from scratch to be read and taught.

    import minitp as mt
    run = mt.launch(fn, world_size=4)      # fn runs on 4 real processes
    mesh = mt.Mesh(dp=1, pp=1, tp=4)       # inside fn: the rank grid and its groups
    y = mt.comm.all_reduce(x, mesh.tp)     # traced collectives

Where each concept lives: model/ (one device, no parallel code), rules/ (what may be split
how, torch-free), runtime/ (launch, mesh, comm, trace), one package per axis
(tensor_parallel/, context_parallel/, pipeline/, data_parallel/ with ZeRO 1-3,
expert_parallel/), sharding/ (plain -> shards and back), step/ (mt.train_step), data/,
memory/ (measured), calc/ (modelled), checkpoint/, fp8/, serving/, debug/ (where a run
departs from one device), torch_parallel/
(PyTorch's own DTensor/FSDP2, imported by name), train/ (``python -m minitp.train``);
the course (graders, labs, pictures, doctor) in course/, never loaded by ``import minitp``.
"""

from . import calc, checkpoint, context_parallel, data, debug, fp8, memory, optim, rules, serving
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
    session,
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

# What the lessons type, and nothing else (tests/test_docs.py keeps the two the same);
# everything else is reached through its sub-package.
__all__ = [
    # launching ranks and what they did
    "launch", "LaunchError", "CollectiveTimeout", "world", "device", "Mesh", "Axis", "layout",
    "comm", "trace",
    # ranks that stay alive between cells (``%load_ext minitp``: %ranks, %%ranks)
    "session",
    # the model and its split
    "GPT", "GPTConfig", "parallelize", "train_step", "make_optimizer", "check_parallel_config",
    "rules", "data",
    # optimizers that need the whole matrix (Muon)
    "optim",
    # the layers, by hand
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy", "mappings", "context_parallel",
    # measured, modelled, saved
    "memory", "calc", "checkpoint",
    # FP8, emulated (mt.fp8.convert, the rule's table; mt.parallelize(..., fp8=…))
    "fp8",
    # generation through the KV cache, on one device and over tp and pp ranks
    "serving",
    # when a run goes wrong: the first module that departs from one device, who waited
    # for whom (docs/debugging.md)
    "debug",
    # the course, imported on first use
    "grade", "question", "viz", "alike",
]


# The course (pictures, labs, the grader) pulls in matplotlib and ipywidgets: it is
# imported on first use, never by `import minitp` or a launched rank.
_LAZY = {"viz": ".course.viz", "labs": ".course.labs", "alike": ".course.alike"}


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


def load_ipython_extension(ipython):
    """``%load_ext minitp``: the ``%ranks`` and ``%%ranks`` magics (`minitp.runtime.ranks_magic`);
    IPython is imported only here."""
    from .runtime.ranks_magic import load_ipython_extension as load

    load(ipython)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name], __name__)
    raise AttributeError(f"module 'minitp' has no attribute {name!r}")


__version__ = "0.1.0"
