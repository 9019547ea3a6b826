# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex00
# Made from solutions/ex00_mesh_coordinates.py by `python -m minitp.course.make_exercises`.
"""Exercise 00: where does each rank sit in the mesh?

A run of dp·pp·tp processes arranges its ranks in a 3-D grid (lesson 00, "The
mesh"): every rank has a data-parallel index, a pipeline stage and a
tensor-parallel index, and belongs to three groups, one along each dimension.
Megatron-LM numbers the ranks with the tensor-parallel index changing fastest,
so that the group that talks most sits on neighbouring GPUs of one node.

Write the two functions below with plain integer arithmetic (no `mt.Mesh`, no
`mt.layout`: the grader compares your answers with theirs, on real processes,
for several meshes):

* `coordinates(rank, dp, pp, tp)`: this rank's (dp index, pipeline stage, tp index);
* `group_ranks(rank, axis, dp, pp, tp)`: the ranks of this rank's group along
  ``axis`` ("dp", "pp" or "tp"), in increasing order (for "pp": stage 0 first).

Grade it with `mt.grade("ex00")` in a notebook or `python -m minitp.course.grade ex00`.
"""


def coordinates(rank: int, dp: int, pp: int, tp: int) -> tuple[int, int, int]:
    """(dp index, pipeline stage, tp index) of ``rank`` in a (dp, pp, tp) mesh."""
    # hint: the tp index changes fastest: ranks 0, 1, …, tp-1 differ only in it.
    # hint: Ask how many ranks share one pipeline stage, and how many share one
    # hint: (stage, dp index); then // and % peel the indices off one by one.
    raise NotImplementedError(
        'the tp index changes fastest: ranks 0, 1, …, tp-1 differ only in it. Ask how many '
        'ranks share one pipeline stage, and how many share one (stage, dp index); then // '
        'and % peel the indices off one by one.'
    )


def group_ranks(rank: int, axis: str, dp: int, pp: int, tp: int) -> list[int]:
    """The ranks that share every coordinate with ``rank`` except the one along ``axis``."""
    # hint: keep two of the three coordinates of `rank` (your coordinates() above),
    # hint: let the third run over its whole range, and turn each back into a rank:
    # hint: the inverse of coordinates().
    raise NotImplementedError(
        'keep two of the three coordinates of `rank` (your coordinates() above), let the '
        'third run over its whole range, and turn each back into a rank: the inverse of '
        'coordinates().'
    )
