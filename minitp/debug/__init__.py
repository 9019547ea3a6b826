"""When a parallel run goes wrong: tools that say where (docs/debugging.md,
docs/debugging-divergence.md).

* `first_divergence` (`minitp.debug.divergence`): the first module whose result on a mesh
  departs from one device's, with its rank, phase and tensor;
  ``python -m minitp.debug diverge <minitp.train flags>`` from the command line.
* `stragglers`: from a run's trace, each rank's time computing and waiting, and who
  waited for whom.
* `museum` (`minitp.debug.museum`): real bugs from the anchors' trackers, each one setting
  of minitp away, run spoiled or fixed on 4 ranks (lesson 28).
"""

from . import museum
from .divergence import Divergence, first_divergence
from .stragglers import Stragglers, stragglers

__all__ = ["Divergence", "first_divergence", "Stragglers", "museum", "stragglers"]
