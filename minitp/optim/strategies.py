"""The three ways to give Newton–Schulz the whole matrix when ZeRO and tensor parallelism
have cut it up. Each takes this rank's momentum inputs (one flat run per `Piece`: the
elements it holds) and returns, for the same elements, the orthogonalised whole's.

* ``gather`` (DeepSpeed's ZeRO Muon, runtime/zero/muon/): all-gather the pieces over dp,
  and the tp blocks over tp; every rank orthogonalises every matrix (its FLOPs dp·tp times
  over) and keeps its own elements. Bytes: an all-gather of the matrices.
* ``owner`` (Megatron's layer_wise_optimizer.py, torchtitan's dist_muon.py): each matrix
  has a home dp rank, chosen by longest processing time first (LPT: the costliest matrix
  to the least-loaded rank); one all-to-all brings its pieces home, it is orthogonalised
  once per tp rank there, and one all-to-all takes the pieces back. The FLOPs are spread,
  not repeated; the bytes are 2/dp of gather's.
* ``tp`` (Megatron's emerging_optimizers.py, newton_schulz_tp): the pieces all-gathered
  over dp into this rank's tp block, which `newton_schulz_tp` orthogonalises together with
  the other tp ranks' (a Gram all-reduce per iteration); the tp block never travels whole.
"""

from __future__ import annotations

import torch

from ..calc.footprint.muon import lpt_owners, ns_flops
from ..runtime import comm, trace
from ..runtime.mesh import Axis

STRATEGIES = ("gather", "owner", "tp")


def _sizes(pieces, rank: int, which=None) -> list[int]:
    return [b - a for j, p in enumerate(pieces) if which is None or which[j]
            for a, b in [p.held(rank)]]


def blocks_from_dp(pieces, inputs, dp: Axis) -> list[torch.Tensor]:
    """Each piece's whole tp block: all-gathered over dp (one collective, each rank's run
    padded to the longest), or as it is where every dp rank holds it all (ZeRO-0)."""
    if dp.size == 1 or all(p.ranges is None for p in pieces):
        return [x.view(p.shape) for p, x in zip(pieces, inputs, strict=True)]
    sizes = [_sizes(pieces, r) for r in range(dp.size)]
    width = max(sum(s) for s in sizes)
    mine = torch.cat(inputs)
    mine = torch.nn.functional.pad(mine, (0, width - mine.numel()))
    with trace.label("muon gather dp"):
        everything = comm.all_gather(mine, dp).view(dp.size, width)
    runs = [everything[r, :sum(sizes[r])].split(sizes[r]) for r in range(dp.size)]
    return [torch.cat([runs[r][j] for r in range(dp.size)]).view(p.shape)
            for j, p in enumerate(pieces)]


def dense_from_tp(pieces, blocks, tp: Axis) -> list[torch.Tensor]:
    """The whole matrices: the tp-split blocks all-gathered over tp (one collective) and
    joined along their split; the others as they are."""
    split = [j for j, p in enumerate(pieces) if p.split_dim is not None]
    out = list(blocks)
    if not split or tp.size == 1:
        return out
    mine = torch.cat([blocks[j].reshape(-1) for j in split])
    with trace.label("muon gather tp"):
        everything = comm.all_gather(mine, tp).view(tp.size, -1)
    runs = [everything[r].split([pieces[j].numel for j in split]) for r in range(tp.size)]
    for k, j in enumerate(split):
        out[j] = torch.cat([runs[r][k].view(pieces[j].shape) for r in range(tp.size)],
                           dim=pieces[j].split_dim)
    return out


def own_block(piece, dense: torch.Tensor, tp: Axis) -> torch.Tensor:
    """This tp rank's block of the whole matrix."""
    if piece.split_dim is None or tp.size == 1:
        return dense
    size = piece.shape[piece.split_dim]
    return dense.narrow(piece.split_dim, tp.rank * size, size)


def _held_run(piece, block: torch.Tensor, rank: int) -> torch.Tensor:
    a, b = piece.held(rank)
    return block.reshape(-1)[a:b]


def gather(opt, inputs):
    """Everything to everyone: every rank assembles and orthogonalises every matrix."""
    blocks = blocks_from_dp(opt.pieces, inputs, opt.dp)
    dense = dense_from_tp(opt.pieces, blocks, opt.tp)
    rank = opt.dp.rank
    return [_held_run(p, own_block(p, opt.ns(p, d), opt.tp), rank)
            for p, d in zip(opt.pieces, dense, strict=True)]


def tp(opt, inputs):
    """The tp block assembled over dp; Newton–Schulz across the tp ranks, each on its block."""
    blocks = blocks_from_dp(opt.pieces, inputs, opt.dp)
    rank = opt.dp.rank
    return [_held_run(p, opt.ns(p, b) if p.split_dim is None else opt.ns_tp(p, b), rank)
            for p, b in zip(opt.pieces, blocks, strict=True)]


def owner(opt, inputs):
    """Each matrix to its home (the same LPT map on every rank, from the matrices' FLOPs),
    orthogonalised there once, and each rank's elements of the result back to it."""
    pieces, dp = opt.pieces, opt.dp
    if not pieces:
        return []
    n, me = dp.size, dp.rank
    owners = lpt_owners([ns_flops(*p.dense_shape) for p in pieces], n)
    mine = [owners[j] == me for j in range(len(pieces))]
    sharded = any(p.ranges is not None for p in pieces) and n > 1
    if sharded:  # in: each piece to its matrix's home; from rank r, the pieces of the
        # matrices homed here, in matrix order (everyone knows every rank's sizes: no counts sent)
        send = [torch.cat([inputs[j] for j in range(len(pieces)) if owners[j] == k]
                          or [inputs[0][:0]]) for k in range(n)]
        recv_sizes = [_sizes(pieces, r, mine) for r in range(n)]
        with trace.label("muon owner in"):
            got = comm.all_to_all(torch.cat(send), dp, [s.numel() for s in send],
                                  [sum(s) for s in recv_sizes])
        runs = [part.split(recv_sizes[r]) for r, part in
                enumerate(got.split([sum(s) for s in recv_sizes]))]
        homed = [j for j in range(len(pieces)) if mine[j]]
        blocks = {j: torch.cat([runs[r][k] for r in range(n)]).view(pieces[j].shape)
                  for k, j in enumerate(homed)}
    else:  # ZeRO-0: the home already holds the whole block
        blocks = {j: inputs[j].view(pieces[j].shape) for j in range(len(pieces)) if mine[j]}
    homed = sorted(blocks)
    dense = dense_from_tp([pieces[j] for j in homed], [blocks[j] for j in homed], opt.tp)
    done = {j: own_block(pieces[j], opt.ns(pieces[j], d), opt.tp).reshape(-1)
            for j, d in zip(homed, dense, strict=True)}
    if n == 1:
        return [done[j] for j in range(len(pieces))]
    # out: each rank's elements of every matrix homed here, back to it
    send = [torch.cat([_held_run(pieces[j], done[j], k) for j in homed] or [inputs[0][:0]])
            for k in range(n)]
    recv_sizes = [_sizes(pieces, me, [owners[j] == r for j in range(len(pieces))])
                  for r in range(n)]
    with trace.label("muon owner out"):
        got = comm.all_to_all(torch.cat(send), dp, [s.numel() for s in send],
                              [sum(s) for s in recv_sizes])
    runs = [iter(part.split(recv_sizes[r])) for r, part in
            enumerate(got.split([sum(s) for s in recv_sizes]))]
    return [next(runs[owners[j]]) for j in range(len(pieces))]


ORTHOGONALISE = {"gather": gather, "owner": owner, "tp": tp}
