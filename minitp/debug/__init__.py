"""When a parallel run goes wrong: tools that say where.

`first_divergence` (`minitp.debug.divergence`): the first module whose result on a mesh
departs from one device's, with its rank, phase and tensor;
``python -m minitp.debug diverge <minitp.train flags>`` from the command line.
"""

from .divergence import Divergence, first_divergence

__all__ = ["Divergence", "first_divergence"]
