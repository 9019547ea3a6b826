# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex01
# Made from solutions/ex01_ring_allreduce.py by `python -m minitp.course.make_exercises`.
"""Exercise 01: ring all-reduce from point-to-point messages.

Every rank of `axis` holds a tensor `x` of the same shape. Return, on every
rank, the elementwise sum of all ranks' tensors, using only
`mt.comm.sendrecv(send_tensor, dst, recv_buffer, src)` between neighbours on a
ring (`axis.next`, `axis.prev`), in 2(n-1) steps:

1. reduce-scatter: cut the (flattened) tensor into n chunks. In each of n-1
   steps every rank sends one chunk to the next rank and adds the chunk it
   receives into its own copy of that chunk. Choose which chunk each rank sends
   at each step so that every chunk travels once around the ring, picking up
   every rank's part: after n-1 steps each rank holds the finished sum of one
   chunk, a different one on every rank.
2. all-gather: n-1 more steps pass the finished chunks around the ring, each
   received chunk overwriting (not added to) the rank's copy.

Which index is which is the exercise. Draw the ring for n = 3 (three ranks,
three chunks) before you write a line; if a chunk comes out wrong, the grader
says whose parts it holds and whose are missing.

Each rank sends 2(n-1) chunks of size S/n: 2(n-1)/n of the data, whatever n is.
Grade it with `mt.grade("ex01")` in a notebook or `python -m minitp.course.grade ex01`.
"""

import torch

import minitp as mt


def ring_all_reduce(x: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    n, r = axis.size, axis.rank
    if n == 1:
        return x.clone()
    # hint: cut x.flatten() into n chunks (torch.tensor_split); then n-1 reduce-scatter
    # hint: steps (send one chunk, add what arrives into another) and n-1 all-gather steps
    # hint: (send a finished chunk, overwrite with what arrives), each step one
    # hint: mt.comm.sendrecv(chunk, axis.next, buffer, axis.prev). At step 0, rank r
    # hint: sends its own chunk r; what does it receive, and what does it send next?
    raise NotImplementedError(
        'cut x.flatten() into n chunks (torch.tensor_split); then n-1 reduce-scatter steps '
        '(send one chunk, add what arrives into another) and n-1 all-gather steps (send a '
        'finished chunk, overwrite with what arrives), each step one mt.comm.sendrecv(chunk, '
        'axis.next, buffer, axis.prev). At step 0, rank r sends its own chunk r; what does it'
        ' receive, and what does it send next?'
    )
