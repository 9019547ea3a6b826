"""Checkpoints that reshard: save at one (dp, pp, tp), load at another.

* `reshard`: `save` writes the dense model (and optimizer) state from every
  rank's shards (with the MoE layers' expert biases, `dense_expert_biases`); `load`
  cuts it again for the mesh it is loaded on (experts resharded over any ep).
* `files`: the files on disk, written atomically, read without executing code.
* `sharded`: periodic sharded saves (`Saver`): every rank writes its own elements into
  ``DIR/step-<n>/``, synchronously or beside the next steps; `sharded_read` finds the
  newest complete step and loads it at any layout, each rank reading only its bytes;
  `layout` says which dense elements each rank's tensors hold; `measure` runs the
  lesson's measurements (who writes what, bytes read per rank, save timing).
  `load`, `load_dense` and `read_meta` take either format. `DCPReader` (`dcp_reader`):
  torch.distributed.checkpoint reads a sharded one (imported on first use).
"""

from .files import FORMAT, check_save_target
from .reshard import dense_expert_biases, load_dense_optimizer, save
from .sharded import Saver
from .sharded_read import load, load_dense, newest_complete, read_meta, resolve

__all__ = ["DCPReader", "FORMAT", "Saver", "check_save_target", "dense_expert_biases", "load",
           "load_dense", "load_dense_optimizer", "newest_complete", "read_meta", "resolve", "save"]


def __getattr__(name):  # DCPReader imports torch.distributed.checkpoint: only when asked for
    if name == "DCPReader":
        from .dcp_reader import DCPReader
        return DCPReader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
