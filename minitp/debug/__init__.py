"""When a parallel run goes wrong: tools that read a run and say where (docs/debugging.md).

* `stragglers`: from a run's trace, each rank's time computing and waiting, and who
  waited for whom.
"""

from .stragglers import Stragglers, stragglers

__all__ = ["Stragglers", "stragglers"]
