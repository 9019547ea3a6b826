"""Exercise 19: the refit plan of one weight, from training at (pp 2, tp 2) to serving at tp 4.

Four ranks train a GPT of `n_layer` layers on ``Mesh(pp=2, tp=2)``; the same four ranks
then serve it on ``Mesh(tp=4)``. Between the two, every weight must move to where the
serving layout wants it: `refit_plan` says which rank sends which piece of one weight to
which rank.

The weight belongs to layer `layer` and is tensor-parallel: split into equal slices along
dimension `split_dim` of its dense ``shape`` (0: a column-parallel weight, its output
features, such as the MLP's first matrix; 1: a row-parallel one, its input features, such as
the MLP's second matrix). Training splits it 2 ways, serving 4 ways, each slice in rank
order along its tensor-parallel group. What you need of the training layout:

* the ranks of ``Mesh(pp=2, tp=2)``: tensor-parallel innermost (the mesh's order, lesson 00: a
  rank's pipeline stage is its rank // 2, its tensor-parallel index its rank % 2);
* the layers split evenly over the two stages, in order.

Return a list of pieces, each ``(source, target, rows, cols)``: rank `source` gives rank
`target` the block ``weight[rows[0]:rows[1], cols[0]:cols[1]]`` of the dense weight (half-open
ranges of the dense weight's coordinates). A piece a rank already holds in its training
shard is kept, not sent: list it with ``source == target``. Every serving rank must end up
with exactly its slice, each element once, each piece taken from a rank that holds it, and
one piece for each (source, target) pair.

Grade it with `mt.grade("ex19")` in a notebook or `python -m minitp.course.grade ex19`:
the grader runs your plan on a dense weight of numbers for column- and row-parallel weights
of layers on each stage, sets it beside the library's plan (`minitp.serving.refit`) and
names the usual mistakes.
"""

PP, TP, SERVE_TP = 2, 2, 4


def refit_plan(layer: int, n_layer: int, shape: tuple[int, int],
               split_dim: int) -> list[tuple[int, int, tuple[int, int], tuple[int, int]]]:
    """The pieces (source, target, rows, cols) that move one weight of `layer` from
    Mesh(pp=2, tp=2) to Mesh(tp=4)."""
    # BEGIN SOLUTION
    # hint: Which stage holds `layer`, and so which two ranks hold its two training slices?
    # hint: Each serving rank's slice: which training slice is it in, along which dimension?
    # hint: The other dimension is whole on every rank.
    stage = layer // (n_layer // PP)
    size = shape[split_dim]
    plan = []
    for target in range(SERVE_TP):
        lo, hi = target * size // SERVE_TP, (target + 1) * size // SERVE_TP
        for t in range(TP):  # the stage's training slices: the one this piece lies in
            a, b = max(lo, t * size // TP), min(hi, (t + 1) * size // TP)
            if a < b:
                whole = (0, shape[1 - split_dim])
                rows, cols = ((a, b), whole) if split_dim == 0 else (whole, (a, b))
                plan.append((stage * TP + t, target, rows, cols))
    return plan
    # END SOLUTION
