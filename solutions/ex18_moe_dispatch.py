"""Exercise 18: expert parallelism's dispatch and combine.

A rank of the ep group (`axis`, ep ranks) holds E/ep of the E experts, a run of
them: rank j holds experts j·E/ep … (j+1)·E/ep − 1 (`expert_module`, whose
``count`` is E/ep). It also holds its own N tokens, each sent by the router to
k experts, anywhere. `dispatch_and_combine` must return what the one-device
layer returns: for each token, the gate-weighted sum of its kept experts'
outputs. The steps:

1. **permute** (given): the kept assignments' token rows, sorted by expert
   (stably: token order within an expert). The rows for rank j's experts are
   then one contiguous run;
2. **exchange counts**: a receiver must know how many rows each rank sends it,
   and for which of its experts, before the rows arrive. Only the senders
   know: one small all-to-all of integers tells it;
3. **dispatch**: one all-to-all of the rows, split by destination rank;
4. **run the local experts**: the rows arrive grouped by source rank
   ([from rank 0: expert 0's, expert 1's, …], [from rank 1: …]); the experts
   need them grouped by expert. Regroup, run, and put the results back in the
   order they arrived;
5. **combine**: the reverse all-to-all returns each result to the rank its
   token lives on;
6. **un-permute and weight by the gate**: each result back to its token, times
   its gate, summed over the token's experts.

What you may use:

* ``mt.comm.all_to_all(x, axis, send_splits, recv_splits)``: rank r sends the
  j-th run of ``send_splits[j]`` rows of `x` to the j-th rank of `axis` and
  returns what every rank sent it, in rank order (``recv_splits[s]`` rows from
  the s-th). One count per rank of the axis. Works for integer tensors; it
  carries no gradient;
* ``all_to_all(x, axis, send, recv, phase)`` (imported below): the same, but
  differentiable: the gradient of a row goes back the way the row came;
* ``source_to_expert_major(arrived)`` (imported below): for ``arrived`` (ep,
  E/ep), the rows from each source rank for each local expert, the permutation
  that sorts rows that arrived source-major into expert-major order;
* ``expert_module(x, counts)``: runs the local experts on rows `x` grouped by
  expert, ``counts[e]`` rows for the e-th local expert (a list of ints);
* `inverse(perm)` (below).

Grade it with `mt.grade("ex18")` in a notebook or `python -m minitp.course.grade ex18`:
on 4 ranks in float64, your function against the one-device layer (the split
sizes of each all-to-all, the output, the gradients), then installed in a
MoE GPT on ``Mesh(dp=4, ep=2)`` for a training step against one device.
"""

import torch

import minitp as mt
from minitp.expert_parallel import all_to_all, source_to_expert_major


def inverse(perm: torch.Tensor) -> torch.Tensor:
    """The permutation that undoes `perm`: ``x[perm][inverse(perm)]`` is `x`."""
    out = torch.empty_like(perm)
    out[perm] = torch.arange(perm.numel(), device=perm.device)
    return out


def dispatch_and_combine(tokens: torch.Tensor, experts: torch.Tensor, gates: torch.Tensor,
                         keep: torch.Tensor, expert_module, axis: mt.Axis,
                         n_experts: int) -> torch.Tensor:
    """This rank's MoE output (N, C).

    tokens (N, C): this rank's token rows. experts (N, k): each token's chosen
    experts (global ids, 0 … E−1). gates (N, k): their weights (0 where dropped).
    keep (N, k): which assignments survived the capacity (all, when dropless).
    expert_module: this rank's E/ep experts. axis: the ep group. n_experts: E.
    """
    N, k = experts.shape
    ep, local = axis.size, expert_module.count

    # 1. permute (given). assignment a (of the kept ones, token-major) is token token_of[a];
    # row i of `rows` is assignment order[i]; counts[e]: rows for expert e, this rank's.
    token_of = torch.arange(N, device=tokens.device).unsqueeze(1).expand(N, k)[keep]
    expert_of = experts[keep]
    order = torch.argsort(expert_of, stable=True)
    rows = tokens[token_of[order]]
    counts = torch.bincount(expert_of, minlength=n_experts)  # (E,), int64

    # 2. exchange counts: arrived (ep, local), row s: the rows source rank s sends you, per
    # local expert; send[j] and recv[s]: the rows for rank j, and from rank s (lists of ints).
    # BEGIN SOLUTION
    # hint: counts.view(ep, local): row j is what you send rank j's experts. All-to-all that
    # hint: integer table, one row to each rank (mt.comm.all_to_all), then sum its rows.
    table = counts.view(ep, local)
    arrived = mt.comm.all_to_all(table, axis, [1] * ep, [1] * ep)
    send, recv = table.sum(1).tolist(), arrived.sum(1).tolist()
    # END SOLUTION

    # 3-5. dispatch, run the local experts expert-major, combine: `back` (A, C) holds the
    # expert outputs of `rows`, row for row.
    # BEGIN SOLUTION
    # hint: all_to_all the rows (phase "dispatch"); regroup what arrived expert-major, run
    # hint: expert_module, undo the regroup; all_to_all back with the splits swapped
    # hint: (phase "combine").
    got = all_to_all(rows, axis, send, recv, "dispatch")
    regroup = source_to_expert_major(arrived)
    out = expert_module(got[regroup], arrived.sum(0).tolist())
    back = all_to_all(out[inverse(regroup)], axis, recv, send, "combine")
    # END SOLUTION

    # 6. un-permute and weight by the gate.
    # BEGIN SOLUTION
    # hint: row i of back is assignment order[i]: put the rows back in assignment order,
    # hint: weight each by its gate (gates[keep]), and sum each into its token
    # hint: (index_add over token_of).
    weighted = back[inverse(order)] * gates[keep].unsqueeze(1)
    return tokens.new_zeros(N, tokens.shape[1]).index_add(0, token_of, weighted)
    # END SOLUTION
