"""``python -m minitp.train``: train a 3D-parallel GPT on the embedded corpus.

* `cli`: the parent — checks the flags, launches the ranks, trains the --check
  reference, writes the run directory (``main``).
* `flags`: the flags and every check on them, run before any process starts.
* `machine`: torchrun or not, the world size, GPUs, and whether the run's memory fits.
* `model_flags`: every model flag used or refused (with --load: what the checkpoint fixes).
* `rank`: what every rank runs: build (or load) the model, train, evaluate, save.
"""

from .cli import main, reference_losses, train_one_process
from .flags import MODEL_SIZES, build_parser, validate
from .machine import available_memory, memory_needed
from .rank import lr_at, sample

__all__ = ["MODEL_SIZES", "available_memory", "build_parser", "lr_at", "main",
           "memory_needed", "reference_losses", "sample", "train_one_process", "validate"]
