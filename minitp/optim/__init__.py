"""Optimizers that are not elementwise: Muon (Jordan et al. 2024), on one device and over
a parallel model, where ZeRO's "each rank steps its own slice" no longer holds.

* `newton_schulz`: the orthogonalisation (torch's, in any dtype) and its tensor-parallel
  form (a Gram all-reduce per iteration); FLOPs and torch's lr adjustment.
* `muon`: `Muon` (torch.optim.Muon step for step), which parameters it takes (linear
  weights; AdamW the rest), `muon_with_adamw` for a plain model.
* `pieces`: which elements of which matrix a rank steps, at each ZeRO stage.
* `strategies`: gather, owner and tp, the three ways to reach the whole matrix.
* `distributed`: `DistributedMuon`, what ``mt.make_optimizer(model, mesh, "muon",
  strategy=...)`` returns.
* `traps`: the two known bugs (DeepSpeed #8090, Megatron #5961), run on purpose.
See docs/muon.md.
"""

from ..calc.footprint.muon import ns_flops
from . import traps
from .distributed import DistributedMuon, make_muon
from .muon import Muon, muon_with_adamw, split_parameters
from .newton_schulz import newton_schulz, newton_schulz_tp
from .strategies import STRATEGIES, lpt_owners

__all__ = ["STRATEGIES", "DistributedMuon", "Muon", "lpt_owners", "make_muon", "traps",
           "muon_with_adamw", "newton_schulz", "newton_schulz_tp", "ns_flops",
           "split_parameters"]
