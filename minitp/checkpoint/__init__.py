"""Checkpoints that reshard: save at one (dp, pp, tp), load at another.

* `reshard`: `save` writes the dense model (and optimizer) state from every
  rank's shards; `load` cuts it again for the mesh it is loaded on.
* `files`: the files on disk, written atomically, read without executing code.
"""

from .files import FORMAT, check_save_target, read_meta
from .reshard import load, load_dense, load_dense_optimizer, save

__all__ = ["FORMAT", "check_save_target", "load", "load_dense", "load_dense_optimizer",
           "read_meta", "save"]
