"""Exercise 06: SUMMA's backward — the gradients of a 2D tensor-parallel linear layer.

Lesson 06 ran Y = X Wᵀ + b (nn.Linear's convention) on a q × q grid of ranks. Rank
(i, j) holds the activation block X_ij (token block i, d_in block j), the weight block
W_ij, kept in nn.Linear's layout (d_out block j, d_in block i: shape (d_out/q, d_in/q)),
and the bias block b_j. Its forward gathered X_i· along its grid row (``x_row``, shape
(T/q, d_in)) and W's d_out block j along its grid column (``w_col``, shape
(d_out/q, d_in)), and computed its output block Y_ij = X_i· w_colᵀ + b_j.

Write the backward. Given ``grad``, this rank's block dY_ij of the output's gradient
(T/q, d_out/q), and the two tensors the forward saved, return this rank's blocks of
the three gradients, shaped like what it holds:

* grad_x: dX_ij, (T/q, d_in/q);
* grad_w: the gradient of its weight block, (d_out/q, d_in/q), nn.Linear's layout;
* grad_b: db_j, (d_out/q,).

Before any collective, ask who holds the pieces of each sum. Rank (i, j) can form its
own term of dX for the whole token block i, and its own term of the weight's gradient
for the whole d_out block j — but only its term: the other terms of each sum live on
other ranks of its grid row or of its grid column. Which, and which collective sums
them and hands each rank only its own block? And the bias b_j is added on every rank
of grid column j, each on its own tokens.

What you need: ``mt.comm.reduce_scatter(x, axis, dim)``, ``mt.comm.all_reduce(x, axis)``,
the grid's axes ``grid.row`` (the q ranks of this rank's grid row; ``grid.row.rank`` is
j) and ``grid.col`` (its grid column; ``grid.col.rank`` is i). minitp's own backward is
`minitp.tensor_parallel.two_d`: try first.
Grade it with `mt.grade("ex06")` in a notebook or `python -m minitp.course.grade ex06`:
at q = 2 and 3 on real processes, in float64, against the dense layer's autograd.
"""

import minitp as mt


def summa_backward(grad, x_row, w_col, grid):
    """(grad_x, grad_w, grad_b): this rank's blocks of the three gradients."""
    # BEGIN SOLUTION
    # hint: grad @ w_col is this rank's term of dX for all of token block i, and
    # hint: grad.T @ x_row its term of the weight's gradient for all of d_out block j.
    # hint: Which ranks hold the other terms of each sum? Sum them, keep your d_in block.
    grad_x = mt.comm.reduce_scatter(grad @ w_col, grid.row, dim=1)
    grad_w = mt.comm.reduce_scatter(grad.T @ x_row, grid.col, dim=1)
    grad_b = mt.comm.all_reduce(grad.sum(0), grid.col)
    return grad_x, grad_w, grad_b
    # END SOLUTION
