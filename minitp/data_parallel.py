"""Data parallelism: every dp rank computes the gradient of its slice of the batch,
and the ranks sum them.

`train_step` weights each microbatch's mean loss by its share of the *global*
batch's target tokens, count_i / N (N counted over every dp rank's slice). So
the gradient of the batch mean is exactly the sum over dp ranks,

    ∇L = Σ_d Σ_i (count_di / N) ∇L_di,

and a plain all-reduce (sum) finishes it — no division left to do, and never
``ReduceOp.AVG`` (gloo gets it wrong on some versions; see minitp.comm). With
context parallelism each cp rank holds a partial gradient too (its tokens'
share of the mean over the cp group), so the sum runs over dp×cp
(`Mesh.dp_cp`, which `minitp.parallelize` passes here), as Megatron folds cp
into its data-parallel gradient group.

`GradSync`: bucketed all-reduce started from backward hooks. Each parameter's
hook fires as soon as autograd has accumulated its gradient; when every
parameter of a bucket has fired, the bucket's all-reduce starts in the
background while backward goes on with earlier layers (PyTorch DDP's design).
It is armed only for the last microbatch: while microbatches accumulate there
is nothing final to send.

`Zero1Optimizer` (Rajbhandari et al. 2020, stage 1): the optimizer state is
split across dp. The gradients, flattened into one buffer, are reduce-scattered
(rank d receives the summed d-th slice), the inner optimizer steps that slice
only, and an all-gather gives every rank the whole updated parameters. Adam's
update is elementwise, so stepping slices equals stepping the whole. (Stages 2
and 3, which shard the gradients and the parameters too: `minitp.zero`.)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import comm, trace
from .mesh import Axis, Mesh
from .mixed_precision import MASTER_DTYPE, grad_of, has_main_grads, set_grad, zero_main_grads
from .rules import model_chunks, round_up


def _grad_or_zeros(p: nn.Parameter) -> torch.Tensor:
    g = grad_of(p)
    return g if g is not None else torch.zeros_like(p)


class GradSync:
    """Sum the gradients of `params` over `axis`, bucket by bucket, during backward."""

    def __init__(self, params: list[nn.Parameter], axis: Axis, bucket_bytes: int = 1 << 20):
        self.axis, self.armed = axis, False
        # Backward reaches the last parameters first: fill buckets in reverse order.
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed(params):
            if self.buckets[-1] and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._arrived = [0] * len(self.buckets)
        self._pending: dict[int, comm.Pending] = {}
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in params]

    def arm(self, armed: bool = True) -> None:
        """Sync during the next backward (the last microbatch's) or not."""
        self.armed = armed

    def _ready(self, p: nn.Parameter) -> None:
        if not self.armed:
            return
        i = self._bucket_of[id(p)]
        self._arrived[i] += 1
        if self._arrived[i] == len(self.buckets[i]):
            self._start(i)

    def _start(self, i: int) -> None:
        bucket = self.buckets[i]
        flat = torch.cat([_grad_or_zeros(p).reshape(-1) for p in bucket])
        with trace.label(f"dp grads bucket{i}"), trace.phase("bwd"):
            self._pending[i] = comm.all_reduce_start(flat, self.axis)

    def finish(self) -> None:
        """Wait for every bucket's sum and write it back into ``.grad``. A bucket
        not started yet (a parameter that got no gradient) is started now, in
        bucket order, the same on every rank."""
        if not self.armed:
            return
        for i in range(len(self.buckets)):
            if i not in self._pending:
                self._start(i)
        for i, bucket in enumerate(self.buckets):
            flat = self._pending[i].wait()
            for p, g in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
                set_grad(p, g)
        self._pending.clear()
        self._arrived = [0] * len(self.buckets)
        self.armed = False

    def remove(self) -> None:
        """Unhook (ZeRO-1 sums the gradients itself, with a reduce-scatter)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


class ZeroOptimizerBase:
    """What every ZeRO optimizer answers through ``self.inner``, the optimizer that
    steps only this rank's shards (stage 1 here; stages 2 and 3: `minitp.zero`)."""

    def state_dict(self) -> dict:
        """The inner optimizer's state for this rank's shard (only this dp rank's slice)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (Adam: 2 per shard element, + steps)."""
        return sum(t.numel() for s in self.inner.state.values() for t in s.values()
                   if torch.is_tensor(t))


class Zero1Optimizer(ZeroOptimizerBase):
    """An optimizer whose state lives only for this dp rank's 1/dp of the parameters.

    ``step()``: reduce-scatter the flat gradient over dp (sum), step the shard with
    the inner optimizer, all-gather the updated shards into every parameter.
    """

    def __init__(self, params: list[nn.Parameter], axis: Axis, optimizer_class, **kwargs):
        self.params, self.axis = [p for p in params if p.requires_grad], axis
        numel = sum(p.numel() for p in self.params)
        self.padded = round_up(numel, axis.size)  # equal slices for the collectives
        self.shard_size = self.padded // axis.size
        lo = axis.rank * self.shard_size
        flat = self._flatten([p.detach() for p in self.params])
        # Under mixed precision the shard is this rank's float32 master slice.
        self.mixed = has_main_grads(self.params)
        shard = flat[lo:lo + self.shard_size]
        self.shard = nn.Parameter(shard.to(MASTER_DTYPE) if self.mixed else shard.clone())
        self.masters = [self.shard] if self.mixed else []
        self.inner = optimizer_class([self.shard], **kwargs)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def _flatten(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - flat.numel()))

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.mixed:
            zero_main_grads(self.params)
            return
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        grads = [_grad_or_zeros(p) for p in self.params]
        with trace.label("zero1 grads"), trace.phase("bwd"):
            self.shard.grad = comm.reduce_scatter(self._flatten(grads), self.axis)
        self.inner.step()
        with trace.label("zero1 params"):  # in the parameters' dtype: bf16 travels as bf16
            flat = comm.all_gather(self.shard.detach().to(self.params[0].dtype), self.axis)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


def attach_grad_sync(stages, dp: Axis, bucket_bytes: int = 1 << 20) -> None:
    """Give every stage a bucketed gradient all-reduce over `dp` (none when dp is 1);
    `train_step` arms it for the last microbatch."""
    for stage in stages:
        stage.grad_sync = (GradSync(list(stage.parameters()), dp, bucket_bytes)
                           if dp.size > 1 else None)


def zero1_optimizer(model: nn.Module, mesh: Mesh, optimizer_class=torch.optim.AdamW,
                    **kwargs) -> Zero1Optimizer:
    """ZeRO-1 for a model from `mt.parallelize`: its dp all-reduce hooks are removed
    (the optimizer's reduce-scatter sums the gradients instead), and
    ``optimizer_class(shard, **kwargs)`` steps this rank's slice."""
    for chunk in model_chunks(model):
        sync = getattr(chunk, "grad_sync", None)
        if sync is not None:
            sync.remove()
            chunk.grad_sync = None
    return Zero1Optimizer(list(model.parameters()), mesh.dp_cp, optimizer_class, **kwargs)
