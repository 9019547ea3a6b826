"""A linear layer whose weight gradient can wait: the backward split into B and W.

The backward of y = x Wᵀ (+ b) computes two things from the output gradient g:

* ∂L/∂x = g W — the *input* gradient, which the previous pipeline stage is waiting for
  (on the critical path): pass **B**;
* ∂L/∂W = gᵀ x — the *weight* gradient, which nothing needs before the optimizer step:
  pass **W**, which a zero-bubble schedule runs later, where the pipeline would idle
  (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2; Megatron-Core's
  ``--delay-wgrad-compute`` is the same idea).

`linear` is the tensor-parallel layers' matmul (`minitp.tensor_parallel.layers`). While a
layer's ``weight_grads`` holds a `DeferredWeightGrads` (`minitp.pipeline` sets it around
the forward and the B of a microbatch whose backward it splits), the weight enters the
graph detached: B computes ∂L/∂x and the bias gradient and stores (W, x, g), and never
touches the weight (a gradient hook would otherwise fire there for nothing: PyTorch calls
a parameter's post-accumulate hooks even when a backward returns no gradient for it).
`DeferredWeightGrads.run` is W: it computes each gᵀ x and adds it to the weight's
gradient through autograd (``backward`` on the parameter itself), so every gradient hook
— the data-parallel all-reduce's, mixed precision's ``main_grad`` — sees it once, as it
would have. Everything else in the model (LayerNorms, embeddings, the output head, the experts)
computes its gradients in B: W holds the linear layers' weight GEMMs, the bulk of it.

Under ZeRO-3 a weight is a view of its unit's gathered vector, which carries
``reduce_grad`` (`minitp.data_parallel.zero_stage3`): the vector is freed after B, so W
hands that unit one flat gradient with its weights' slots filled, and the unit
reduce-scatters it over dp — a second reduction beside B's (whose slots for these weights
were zero: the two add up to the whole gradient exactly), rather than keeping a
whole-size gradient from B until W.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DeferredWeightGrads:
    """The weight gradients one B left for its W: (weight, input, output gradient)."""

    def __init__(self):
        self.pending: list[tuple[torch.nn.Parameter | _Slot, torch.Tensor, torch.Tensor]] = []

    def add(self, weight, x, grad) -> None:
        base = weight._base
        if base is not None and hasattr(base, "reduce_grad"):  # ZeRO-3: where, not the view
            weight = _Slot(base, weight)  # (which would keep the gathered values alive)
        self.pending.append((weight, x, grad))

    def run(self) -> None:
        """Pass W: every stored weight gradient, computed and accumulated."""
        pending, self.pending = self.pending, []
        flats = {}  # ZeRO-3: reduce_grad -> its unit's flat gradient, filled slot by slot
        for weight, x, grad in pending:
            grad_weight = grad.reshape(-1, grad.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))
            if isinstance(weight, _Slot):
                flat = flats.setdefault(weight.reduce_grad, weight.zeros())
                flat[weight.offset:weight.offset + grad_weight.numel()] += (
                    grad_weight.reshape(-1).to(flat.dtype))
            else:
                torch.autograd.backward([weight], [grad_weight.to(weight.dtype)])
        for reduce_grad, flat in flats.items():
            reduce_grad(flat)


class _Slot:
    """A ZeRO-3 weight's place in its unit's gathered vector: its unit's reduction, the
    vector's size and dtype, and the weight's offset in it."""

    def __init__(self, base: torch.Tensor, view: torch.Tensor):
        self.reduce_grad = base.reduce_grad
        self.offset = view.storage_offset() - base.storage_offset()
        self.numel, self.dtype, self.device = base.numel(), base.dtype, base.device

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.numel, dtype=self.dtype, device=self.device)


class _DeferredLinear(torch.autograd.Function):
    """F.linear whose weight is outside autograd's graph (it came in detached): backward
    gives the input and bias gradients and stores what the weight's needs."""

    @staticmethod
    def forward(ctx, x, weight, bias, store, param):
        ctx.save_for_backward(x, weight)
        ctx.store, ctx.param, ctx.has_bias = store, param, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.has_bias else None
        ctx.store.add(ctx.param[0], x, grad)
        return grad_x, None, grad_bias, None, None


def linear(x, weight, bias, layer) -> torch.Tensor:
    """`_linear`, or under FP8 (``layer.fp8``, `minitp.fp8`) `_linear` of the cast weight, its
    output gradient cast too (the layer cast x already)."""
    fp8 = getattr(layer, "fp8", None)
    return _linear(x, weight, bias, layer) if fp8 is None else fp8.linear(x, weight, bias,
                                                                          _linear, layer)


def _linear(x, weight, bias, layer) -> torch.Tensor:
    """F.linear(x, weight, bias) — unless ``layer.weight_grads`` holds a
    `DeferredWeightGrads` as it runs: then the weight enters the graph detached, so that
    backward (B) never touches it (no gradient, no gradient hook), and its gradient is
    left to that store's `run` (W). A pipeline sets the store around the forward of a
    microbatch whose backward it splits, and again around its B (a recomputed forward
    runs inside B)."""
    store = layer.weight_grads
    if store is None:
        return F.linear(x, weight, bias)
    # the parameter travels in a tuple: autograd must not see it as an input
    return _DeferredLinear.apply(x, weight.detach(), bias, store, (weight,))
