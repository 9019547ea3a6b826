"""Exercise 08: bucketed gradient sync for data parallelism.

Every data-parallel rank of `axis` has run backward on its own slice of the
global batch, its loss weighted by its share of the batch's counted tokens
(as `mt.train_step` does), so each ``p.grad`` holds one term of the sum
∇L = Σ_d (n_d / N) ∇L_d. Replace every ``p.grad`` by that sum over the ranks,
in buckets:

1. walk the parameters in *reverse* order (backward reaches the last layers
   first) and fill buckets: start a new bucket when the current one is not
   empty and adding this parameter's gradient would take it over
   `bucket_bytes` (``p.numel() * p.element_size()`` bytes);
2. for each bucket, in order: flatten its gradients into one tensor
   (``torch.cat`` of ``g.reshape(-1)``), sum it over the ranks with ONE
   ``mt.comm.all_reduce(flat, axis)`` (a sum: the weighting already made the
   division, and gloo mishandles AVG), and copy the slices back into each
   ``p.grad`` (``flat.split(sizes)``, ``view_as(p)``).

Return the buckets, a list of lists of parameters. (The library does the same
from backward hooks, so that each bucket starts while backward goes on:
`minitp.data_parallel.GradSync`.)
Grade it with `mt.grade("ex08")` in a notebook or `python -m minitp.grade ex08`.
"""

import torch

import minitp as mt


def bucketed_sync(params: list[torch.nn.Parameter], axis: mt.Axis,
                  bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    # BEGIN SOLUTION
    # hint: buckets = [[]]; for p in reversed(params): open a new bucket when the current
    # hint: one is non-empty and would exceed bucket_bytes; then per bucket one
    # hint: mt.comm.all_reduce of torch.cat([p.grad.reshape(-1) ...]) and copy the
    # hint: pieces (flat.split([p.numel() ...])) back with p.grad.copy_(piece.view_as(p))
    buckets, size = [[]], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    for bucket in buckets:
        flat = mt.comm.all_reduce(torch.cat([p.grad.reshape(-1) for p in bucket]), axis)
        for p, piece in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
            p.grad.copy_(piece.view_as(p))
    return buckets
    # END SOLUTION
