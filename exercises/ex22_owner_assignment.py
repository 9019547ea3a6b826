# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex22
# Made from solutions/ex22_owner_assignment.py by `python -m minitp.course.make_exercises`.
"""Exercise 22: Muon's owner strategy — which data-parallel rank orthogonalises which matrix,
and the one exchange that brings each matrix home and takes its result back.

Muon's Newton–Schulz needs the WHOLE matrix, summed over the data-parallel ranks (lesson
21). ZeRO-1 has reduce-scattered the gradients, so over dp ranks rank r holds the summed
gradient of each matrix only on its own run of it. Here every matrix is cut alike, to keep
the bookkeeping small: rank r holds rows [r·R/dp, (r+1)·R/dp) of each R×C matrix, summed
(``mine[j]``). It also still holds ``local[j]``: its own gradient of every whole matrix, what
its backward left (its own micro-batch's, NOT summed over dp), as a ZeRO-1 parameter's
``.grad`` is.

The owner strategy (Megatron-LM's layer_wise_optimizer.py, torchtitan's dist_muon): each
matrix gets a home rank; one all-to-all sends every run to its matrix's home; each home
assembles its matrices, orthogonalises each once, and one all-to-all takes every rank's
rows of each result back. The Newton–Schulz work is spread over the ranks, not repeated.

Your parts:

* (a) `lpt_owners(costs, ranks)`: each matrix's home by longest processing time first
  (Graham 1969): the matrices by cost, largest first (ties: the lower index), each to the
  rank with the least work so far (ties: the lower rank). Every rank must compute the same
  map, and the busiest rank's work (the step waits for it) should be small;
* (b) `owner_update(mine, local, owners, axis)`: the exchange above, with
  ``newton_schulz`` (given) run once per matrix, on its home. Returns this rank's rows of
  each orthogonalised matrix, shaped like ``mine[j]``.

What you may need: ``mt.comm.all_to_all(x, axis, send_splits, recv_splits)`` (rank r sends
its k-th run of ``send_splits[k]`` rows of x to rank k and gets ``recv_splits[k]`` rows
from rank k, in rank order: here x is 1-D, a row is one number); ``torch.cat``, ``split``,
``chunk``, ``view``.

Grade it with `mt.grade("ex22")` in a notebook or `python -m minitp.course.grade ex22`: on
4 ranks in float64, (a) on several cost lists, (b) with the grader's owner map, against
Newton–Schulz of each whole summed matrix, the collectives and the Newton–Schulz calls
watched; (c) your (a) and (b) together.
"""

import torch

import minitp as mt
from minitp.optim import newton_schulz


def lpt_owners(costs: list[int], ranks: int) -> list[int]:
    """owners[j]: the rank that orthogonalises matrix j (its cost: `costs[j]`)."""
    # hint: sort the matrices by cost, largest first; give each to the rank whose work so
    # hint: far is least, and add its cost there
    raise NotImplementedError(
        'sort the matrices by cost, largest first; give each to the rank whose work so far is'
        ' least, and add its cost there'
    )


def owner_update(mine: list[torch.Tensor], local: list[torch.Tensor], owners: list[int],
                 axis) -> list[torch.Tensor]:
    """This rank's rows of newton_schulz(the whole summed matrix j), for every j."""
    # hint: in: to each rank k, your rows of the matrices homed at k, flattened, in matrix
    # hint: order (one all_to_all); at home, stack every rank's rows of each of its matrices
    # hint: and orthogonalise it once; out: to each rank k its rows of each result (one
    # hint: all_to_all). `local` is not summed over dp: Newton–Schulz of it is wrong
    raise NotImplementedError(
        'in: to each rank k, your rows of the matrices homed at k, flattened, in matrix order'
        " (one all_to_all); at home, stack every rank's rows of each of its matrices and "
        'orthogonalise it once; out: to each rank k its rows of each result (one all_to_all).'
        ' `local` is not summed over dp: Newton–Schulz of it is wrong'
    )
