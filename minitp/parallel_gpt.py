"""`ParallelGPT`: this rank's shard of a GPT, or of one pipeline stage of it.

It *is* a `GPT` — the same forward (`minitp.model.GPT.forward`) over pieces that
`minitp.parallelize` has swapped: sharded layers for tensor parallelism, and
pass-throughs where a pipeline stage lacks the embedding or the head. What it
adds is what a parallel model must answer beyond the forward: which mesh it
runs on, which gradients are partial, and its dense (plain-GPT) state.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .mixed_precision import grad_of
from .model import GPT, GPTConfig
from .runtime.mesh import Mesh
from .sharding.dense import gather_dense
from .sharding.tags import tag
from .tensor_parallel.partial_grads import sum_partial_grads


class ParallelGPT(GPT):
    """This rank's shard of a GPT — or, in a pipeline, of one stage of its layers.

    ``forward(inputs, targets, positions=None)``: the first stage takes the token ids (B, T), a
    later stage the previous stage's activations (B, T or T/t, C). A stage that
    is not the last returns (activations, None); the last returns
    (local_logits, loss): local_logits (B, T, V'/t) are this rank's vocabulary
    columns; the loss is the full model's, the same on every tensor-parallel rank.
    Without a pipeline there is one stage, first and last: the whole model. A packed
    batch's positions are the whole sequence's, (B, T), on every stage and every rank:
    each piece that needs them takes its part (`minitp.model.GPT.forward`).
    """

    def __init__(self, cfg: GPTConfig, mesh: Mesh, sequence_parallel: bool, pieces: dict,
                 layers: range, first: bool = True, last: bool = True):
        # Not GPT.__init__: that would allocate a whole fresh model. The pieces come
        # from the sharded copy `parallelize` made of the plain one.
        nn.Module.__init__(self)
        self.cfg, self.mesh, self.sequence_parallel = cfg, mesh, sequence_parallel
        self.first, self.last, self.layer_offset = first, last, layers.start
        for name in ("wte", "vision", "wpe", "dropout", "blocks", "ln_f", "head", "loss"):
            setattr(self, name, pieces[name])
        # What the pipeline sends: the dtype its layers compute in, read now, since ZeRO-3
        # will leave the stage only its shards (float32 under mixed precision).
        self.activation_dtype = next(self.parameters()).dtype
        # What `parallelize`'s last steps attach, declared here so every stage answers:
        self.mixed_precision = False  # bf16 parameters with float32 masters (`param_dtype`)
        self.zero_stage = 0           # and data parallelism (`minitp.data_parallel`): the
        self.grad_sync = None         # gradients' reduction started from backward hooks,
        self.zero_units = []          # and ZeRO-2/3's units (each with its shard)
        self.tp_overlap = False       # the layers' GEMMs overlapped with SP's collectives

    def forward(self, inputs, targets=None, positions=None):
        tp = self.mesh.tp
        if self.first and self.sequence_parallel and inputs.shape[1] % tp.size:
            raise ValueError(f"sequence of {inputs.shape[1]} tokens cannot be split across "
                             f"tp={tp.size}")
        return super().forward(inputs, targets, positions)

    def partial_grad_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients each rank holds only in part (sequence parallelism)."""
        return [p for p in self.parameters() if tag(p, "grad_partial_over_tp")]

    def sync_partial_grads(self) -> None:
        """Sum the partial gradients over the tensor-parallel group."""
        sum_partial_grads(self.partial_grad_parameters(), self.mesh.tp)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's parameters, gathered from every rank's shard (on every
        rank), under the plain GPT's names."""
        return gather_dense(((n, p, p.detach()) for n, p in self.named_parameters()),
                            self.mesh.tp, self.layer_offset, self.mesh.ep,
                            self.mesh.etp)

    def full_grad_dict(self) -> dict[str, torch.Tensor]:
        """The dense model's gradients, gathered likewise (call after backward and,
        with sequence parallelism, after `sync_partial_grads`)."""
        return gather_dense(((n, p, grad_of(p)) for n, p in self.named_parameters()),
                            self.mesh.tp, self.layer_offset, self.mesh.ep,
                            self.mesh.etp)
