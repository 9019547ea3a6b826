"""Exercise 01: ring all-reduce from point-to-point messages.

Every rank of `axis` holds a tensor `x` of the same shape. Return, on every
rank, the elementwise sum of all ranks' tensors, using only
`mt.comm.sendrecv(send_tensor, dst, recv_buffer, src)` between neighbours on a
ring (`axis.next`, `axis.prev`), in 2(n-1) steps:

1. reduce-scatter: cut the (flattened) tensor into n chunks. In step s
   (s = 0 … n-2), rank r sends chunk (r - s) mod n to the next rank and adds
   the chunk it receives, chunk (r - s - 1) mod n, into its own. After n-1 steps
   rank r holds the full sum of chunk (r + 1) mod n.
2. all-gather: n-1 more steps pass the finished chunks around the ring. In step
   s, rank r sends chunk (r + 1 - s) mod n and overwrites its chunk (r - s) mod n
   with the one it receives.

Each rank sends 2(n-1) chunks of size S/n: 2(n-1)/n of the data, whatever n is.
Grade it with `mt.grade("ex01")` in a notebook or `python -m minitp.course.grade ex01`.
"""

import torch

import minitp as mt


def ring_all_reduce(x: torch.Tensor, axis: mt.Axis) -> torch.Tensor:
    n, r = axis.size, axis.rank
    if n == 1:
        return x.clone()
    # BEGIN SOLUTION
    # hint: cut x.flatten() into n chunks (torch.tensor_split); then n-1 reduce-scatter
    # hint: steps (send chunk (r-s)%n, add what arrives into chunk (r-s-1)%n) and n-1
    # hint: all-gather steps (send chunk (r+1-s)%n, overwrite chunk (r-s)%n with what
    # hint: arrives), each step one mt.comm.sendrecv(chunk, axis.next, buffer, axis.prev)
    chunks = [c.clone() for c in torch.tensor_split(x.flatten(), n)]
    for step in range(n - 1):  # reduce-scatter: accumulate partial sums around the ring
        send, receive = (r - step) % n, (r - step - 1) % n
        buffer = torch.empty_like(chunks[receive])
        mt.comm.sendrecv(chunks[send], axis.next, buffer, axis.prev)
        chunks[receive] += buffer
    for step in range(n - 1):  # all-gather: pass the finished chunks around the ring
        send, receive = (r + 1 - step) % n, (r - step) % n
        buffer = torch.empty_like(chunks[receive])
        mt.comm.sendrecv(chunks[send], axis.next, buffer, axis.prev)
        chunks[receive] = buffer
    return torch.cat(chunks).view_as(x)
    # END SOLUTION
