"""One optimizer step of a parallel model.

* `train`: `mt.train_step` (microbatches through the schedule, then the optimizer step)
  and `eval_loss`;
* `grads`: `finalize_grads`, what happens to gradients after backward, in order;
* `grad_norm`: the global gradient norm over the mesh (each element once), clipping.
"""

from .train import eval_loss, train_step

__all__ = ["eval_loss", "train_step"]
