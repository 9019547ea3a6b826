"""``python -m minitp.generate``: generate from a checkpoint `minitp.train` saved, over
tensor and pipeline ranks, through the KV cache (`minitp.serving`).

* `flags`: the flags and every check on them, run before any process starts;
* `cli`: the parent — launches the ranks, runs the --check reference, prints the report
  (``main``).
"""

from .cli import main, reference
from .flags import build_parser, validate

__all__ = ["build_parser", "main", "reference", "validate"]
