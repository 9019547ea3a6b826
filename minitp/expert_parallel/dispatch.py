"""Expert parallelism's dispatch and combine: the all-to-all that carries each token to
the rank holding its expert, and back.

A rank of the ep group holds E/ep experts, a run of them: rank j experts
j·E/ep … (j+1)·E/ep − 1. After `minitp.model.moe.permute` sorts this rank's kept
assignments by expert, the rows bound for rank j are one contiguous run, so one
all-to-all with uneven splits sends them all (DeepSpeed's and Megatron-Core's
"alltoall" token dispatcher):

1. counts: this rank's rows per expert (E,), exchanged first as an (ep, E/ep) table by
   a small all-to-all of integers, so every receiver can size its buffer and knows
   which of its experts each arriving row is for;
2. dispatch: the rows, send split j = the rows for rank j's experts;
3. the rows that arrived are grouped source-major ([from rank 0: expert 0, expert 1, …],
   [from rank 1: …]); the local experts need them expert-major, so they are permuted
   again, run, and permuted back;
4. combine: the reverse all-to-all (the splits swapped) returns every row to its token's
   rank, where `minitp.model.moe.unpermute` weights it by its gate.

Backward is the same two all-to-alls with the splits swapped (`_AllToAll`): the
gradient of a row goes back the way the row came.

With expert tensor parallelism (etp > 1, folded layouts) each expert is split over the
etp ranks (`minitp.expert_parallel.slices`), and between steps 2 and 4, in Megatron-Core's
order (its all-to-all token dispatcher: all-to-all over ep, then all-gather over the
experts' tp group):

2a. every etp rank gathers the rows the others' dispatch brought (an all-gather of uneven
    runs, written as an all-to-all that sends each rank the same rows: "moe etp gather"),
    regroups them expert-major and computes each row's partial output;
3a. the partials go back to the etp rank that brought the row and are summed there (a
    reduce-scatter of uneven runs, as an all-to-all and a sum: "moe etp scatter").

Backward, each is the other's adjoint: the scatter's sends every etp rank the gradient of
every gathered row; the gather's sums each row's gradients back at its owner.
"""

from __future__ import annotations

import torch

from ..model.moe import Experts, LocalDispatch
from ..runtime import comm, trace
from ..runtime.mesh import Axis


class _AllToAll(torch.autograd.Function):
    """Rows out by `send` splits, in by `recv`; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, x, axis: Axis, send: list[int], recv: list[int], phase: str):
        ctx.axis, ctx.send, ctx.recv, ctx.phase = axis, send, recv, phase
        ctx.label = trace.recorder().label  # e.g. "layer3": backward records under it too
        with trace.label(f"moe {phase}"):
            return comm.all_to_all(x, axis, send, recv)

    @staticmethod
    def backward(ctx, grad):
        with trace.relabel(ctx.label), trace.label(f"moe {ctx.phase}"), trace.phase("bwd"):
            return comm.all_to_all(grad.contiguous(), ctx.axis, ctx.recv, ctx.send), \
                None, None, None, None


def all_to_all(x: torch.Tensor, axis: Axis, send: list[int], recv: list[int],
               phase: str = "dispatch") -> torch.Tensor:
    """A differentiable all-to-all of rows (`minitp.runtime.comm.all_to_all`)."""
    return _AllToAll.apply(x, axis, send, recv, phase)


def source_to_expert_major(counts: torch.Tensor) -> torch.Tensor:
    """The permutation that regroups rows arrived source-major into expert-major order.
    counts (ep, E_local): rows from each source rank for each local expert."""
    ep, local = counts.shape
    starts = (counts.flatten().cumsum(0) - counts.flatten()).view(ep, local)
    pieces = [torch.arange(int(starts[s, e]), int(starts[s, e] + counts[s, e]),
                           device=counts.device)
              for e in range(local) for s in range(ep)]
    return torch.cat(pieces) if pieces else counts.new_zeros(0)


def _inverse(order: torch.Tensor) -> torch.Tensor:
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return back


class AllToAllDispatch(LocalDispatch):
    """`LocalDispatch` with the experts spread over `axis` (the ep group) and, where
    `etp` has more than one rank, each expert split over it."""

    def __init__(self, axis: Axis, etp: Axis | None = None):
        super().__init__()
        self.axis, self.etp = axis, etp

    def run_experts(self, rows, counts, expert_module: Experts):
        ep, local = self.axis.size, expert_module.count
        table = counts.view(ep, local)  # rows for each rank's experts
        with trace.label("moe counts"):
            # row j of the table to rank j; back, row s: what source s sends, per expert
            arrived = comm.all_to_all(table.to(torch.int64), self.axis, [1] * ep, [1] * ep)
        send, recv = table.sum(1).tolist(), arrived.sum(1).tolist()
        got = all_to_all(rows, self.axis, send, recv, "dispatch")
        regroup = source_to_expert_major(arrived)
        out = self.run_local(got[regroup], arrived.sum(0), expert_module)
        return all_to_all(out[_inverse(regroup)], self.axis, recv, send, "combine")

    def run_local(self, rows, per_expert: torch.Tensor, expert_module: Experts):
        """This ep rank's experts on the rows that reached it (expert-major), over etp."""
        etp = self.etp
        if etp is None or etp.size == 1:
            return expert_module(rows, per_expert.tolist())
        with trace.label("moe etp counts"):  # every etp rank's rows per local expert
            table = comm.all_gather(per_expert.view(1, -1).to(torch.int64), etp, dim=0)
        mine, theirs = rows.shape[0], table.sum(1).tolist()
        got = all_to_all(rows.repeat(etp.size, 1), etp, [mine] * etp.size, theirs,
                         "etp gather")
        regroup = source_to_expert_major(table)
        partial = expert_module(got[regroup], table.sum(0).tolist())
        back = all_to_all(partial[_inverse(regroup)], etp, theirs, [mine] * etp.size,
                          "etp scatter")
        return back.view(etp.size, mine, rows.shape[1]).sum(0)
