"""Per-rank memory, measured (never modelled: `minitp.calc` is the model it is set beside).

* `model_states`: `measure_model_states`, the bytes of parameters, gradients and
  optimizer state this rank holds, each storage counted once.
* `activations`: `ActivationLedger`, every tensor autograd saves for backward,
  who saved it, its shape and bytes.
"""

from .activations import ActivationLedger
from .model_states import measure_model_states

__all__ = ["ActivationLedger", "measure_model_states"]
