# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex26
# Made from solutions/ex26_moe_dispatch.py by `python -m minitp.course.make_exercises`.
"""Exercise 26: expert parallelism's dispatch and combine.

A rank of the ep group (`axis`, ep ranks) holds E/ep of the E experts, a run of
them: rank j holds experts j·E/ep … (j+1)·E/ep − 1 (`expert_module`, whose
``count`` is E/ep). It also holds its own N tokens, each sent by the router to
k experts, anywhere. `dispatch_and_combine` must return what the one-device
layer returns: for each token, the gate-weighted sum of its kept experts'
outputs. How the rows get there and back is yours to design; what must hold:

* an expert runs only on the rank that holds it, and `expert_module` takes its
  rows grouped by local expert (``counts[e]`` rows for the e-th, in that order);
* rows move between ranks only by all-to-all, one run of rows for each rank
  (one split per rank of the axis, not per expert), and a rank must know how
  many rows it will receive from each rank before they arrive. Who knows those
  numbers, and how does the receiver learn them?
* the rows a rank sends rank j are the token rows of its kept assignments to
  rank j's experts, grouped by expert, in token order within an expert (the
  grader reads them as they leave);
* each expert's result goes back to the rank its token lives on, and there to
  its token, times its gate; a token's results are summed;
* the gradients of the tokens, the gates and the experts' parameters flow back
  through your function: the rows' all-to-alls must carry them.

What you may use:

* ``mt.comm.all_to_all(x, axis, send_splits, recv_splits)``: rank r sends the
  j-th run of ``send_splits[j]`` rows of `x` to the j-th rank of `axis` and
  returns what every rank sent it, in rank order (``recv_splits[s]`` rows from
  the s-th). One count per rank of the axis. Works for integer tensors; it
  carries no gradient;
* ``all_to_all(x, axis, send, recv, phase)`` (imported below): the same, but
  differentiable: the gradient of a row goes back the way the row came;
  ``phase`` names the call in the trace ("dispatch" going, "combine" back);
* ``expert_module(x, counts)``: runs the local experts on rows `x` grouped by
  expert, ``counts[e]`` rows for the e-th local expert (a list of ints);
* `inverse(perm)` (below), and torch: ``torch.argsort(..., stable=True)``,
  ``torch.bincount``, ``torch.repeat_interleave``, ``Tensor.index_add``.

Work one rank's view out on paper first (ep = 2, two experts each, three tokens):
what does it send, what arrives, in which order, and where does each row go back to?

Grade it with `mt.grade("ex26")` in a notebook or `python -m minitp.course.grade ex26`:
on 4 ranks in float64, your function against the one-device layer (the split
sizes of each all-to-all, the output, the gradients), then installed in a
MoE GPT on ``Mesh(dp=4, ep=2)`` for a training step against one device.
"""

import torch

import minitp as mt
from minitp.expert_parallel import all_to_all


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
    # the kept assignments, token-major: assignment a sends token token_of[a] to expert_of[a]
    token_of = torch.arange(N, device=tokens.device).unsqueeze(1).expand(N, k)[keep]
    expert_of = experts[keep]

    # hint: Which of your rows does each rank need, in what order, and how does a receiver
    # hint: learn how many rows to expect from each rank before they arrive? Rows arrive from
    # hint: several senders: are they grouped the way expert_module wants them? When the
    # hint: results come back, which token is each one's, and with what weight?
    raise NotImplementedError(
        'Which of your rows does each rank need, in what order, and how does a receiver learn'
        ' how many rows to expect from each rank before they arrive? Rows arrive from several'
        ' senders: are they grouped the way expert_module wants them? When the results come '
        "back, which token is each one's, and with what weight?"
    )
