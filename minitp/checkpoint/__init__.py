"""Checkpoints that reshard: save at one (dp, pp, tp), load at another.

* `reshard`: `save` writes the dense model (and optimizer) state from every
  rank's shards (with the MoE layers' expert biases, `dense_expert_biases`); `load`
  cuts it again for the mesh it is loaded on (experts resharded over any ep).
* `files`: the files on disk, written atomically, read without executing code.
"""

from .files import FORMAT, check_save_target, read_meta
from .reshard import dense_expert_biases, load, load_dense, load_dense_optimizer, save

__all__ = ["FORMAT", "check_save_target", "dense_expert_biases", "load", "load_dense",
           "load_dense_optimizer", "read_meta", "save"]
