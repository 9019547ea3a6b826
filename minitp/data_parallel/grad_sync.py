"""Data parallelism: every dp rank computes the gradient of its slice of the batch,
and the ranks sum them.

`train_step` weights each microbatch's mean loss by its share of the *global*
batch's target tokens, count_i / N (N counted over every dp rank's slice). So
the gradient of the batch mean is exactly the sum over dp ranks,

    ∇L = Σ_d Σ_i (count_di / N) ∇L_di,

and a plain all-reduce (sum) finishes it — no division left to do, and never
``ReduceOp.AVG`` (gloo gets it wrong on some versions; see minitp.runtime.comm). With
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

ZeRO-1, which sums the gradients with a reduce-scatter at its step instead:
`minitp.data_parallel.zero_stage1`; stages 2 and 3: `minitp.data_parallel.zero`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..mixed_precision import grad_of, set_grad
from ..runtime import comm, trace
from ..runtime.mesh import Axis
from ..sharding.tags import dense_and_experts


def grad_or_zeros(p: nn.Parameter) -> torch.Tensor:
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
        flat = torch.cat([grad_or_zeros(p).reshape(-1) for p in bucket])
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


class GradSyncs:
    """Several `GradSync`s armed and finished as one: the dense parameters' over dp×cp
    and the expert shards' over the expert-data-parallel group (`minitp.expert_parallel`)."""

    def __init__(self, syncs: list[GradSync]):
        self.syncs = syncs

    def arm(self, armed: bool = True) -> None:
        for sync in self.syncs:
            sync.arm(armed)

    def finish(self) -> None:
        for sync in self.syncs:
            sync.finish()

    def remove(self) -> None:
        for sync in self.syncs:
            sync.remove()


def attach_grad_sync(stages, dp: Axis, bucket_bytes: int = 1 << 20,
                     expert_dp: Axis | None = None) -> None:
    """Give every stage a bucketed gradient all-reduce over `dp` (none when dp is 1);
    `train_step` arms it for the last microbatch. Expert shards (tag ``ep_split_dim``)
    sum over `expert_dp` instead: the ranks that hold the same experts."""
    for stage in stages:
        dense, experts = dense_and_experts(stage.parameters())
        syncs = [GradSync(group, axis, bucket_bytes)
                 for group, axis in ((dense, dp), (experts, expert_dp))
                 if group and axis is not None and axis.size > 1]
        stage.grad_sync = None if not syncs else syncs[0] if len(syncs) == 1 else GradSyncs(syncs)
