"""Per-rank memory, measured (never modelled: `minitp.calc` is the model it is set beside).

* `model_states`: `measure_model_states`, the bytes of parameters, gradients and
  optimizer state this rank holds, each storage counted once.
* `activations`: `ActivationLedger`, every tensor autograd saves for backward,
  who saved it, its shape and bytes.
* `peak_allocated`: the most bytes a piece of work holds at once, temporaries included.
"""

from .activations import ActivationLedger
from .model_states import measure_model_states
from .peak_allocated import peak_allocated

__all__ = ["ActivationLedger", "measure_model_states", "peak_allocated"]
