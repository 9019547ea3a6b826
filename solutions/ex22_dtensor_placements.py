"""Exercise 22: every tensor of a tensor-parallel MLP as DTensor names it, with and without
sequence parallelism.

Lessons 02 and 05 built this MLP by hand: fc1 = nn.Linear(d, f) split by columns (each of
the tp ranks computes f/tp of the hidden features), GELU, fc2 = nn.Linear(f, d) split by
rows (each rank multiplies its f/tp hidden features by its f/tp rows of the weight, and the
ranks' products are summed). With sequence parallelism the ranks hold the token rows split
outside the MLP: an all-gather before fc1 and a reduce-scatter after fc2 in place of the
all-reduce.

PyTorch's DTensor says where each piece of a tensor lives with a *placement* per mesh
dimension (lesson 22's table):

* ``Shard(d)``: the tensor is cut into tp equal blocks along dim d, rank i holds block i;
* ``Replicate()``: every rank holds the whole tensor;
* ``Partial()``: every rank holds a tensor of the full shape, and the true value is the
  SUM of the ranks' (what a row-parallel matmul leaves before its reduction).

Here activations are 2-D, (tokens, features): the batch and sequence flattened into rows.
`nn.Linear` keeps its weight as (out_features, in_features) and computes x @ W.T + b.

Write `placements(sp)`: for each name in `NAMES` the placement of that tensor as every tp
rank holds it, without (``sp=False``) and with (``sp=True``) sequence parallelism:

* ``x``: the MLP's input as a rank holds it before anything is communicated;
* ``x_in``: the input fc1 multiplies (after SP's all-gather, if there is one);
* ``fc1.weight``, ``fc1.bias``: the column-parallel layer's parameters;
* ``h``: fc1's output (and GELU's: the same placement);
* ``fc2.weight``, ``fc2.bias``: the row-parallel layer's parameters;
* ``y_partial``: h @ fc2.weight.T on each rank, before any communication (no bias yet);
* ``y``: the MLP's output as a rank holds it after fc2's communication (bias added).

Grade it with `mt.grade("ex22")` in a notebook or `python -m minitp.course.grade ex22`:
on 2 ranks, each rank's true piece of every tensor is wrapped by `DTensor.from_local`
with your placement and gathered back (``full_tensor()``): it must be the whole tensor
of one device. Then the MLP runs in DTensor from your placements of the input and the
parameters, and must give one device's output.
"""

from torch.distributed.tensor import Partial, Replicate, Shard

NAMES = ("x", "x_in", "fc1.weight", "fc1.bias", "h", "fc2.weight", "fc2.bias", "y_partial", "y")


def placements(sp: bool) -> dict:
    """{name: placement} for every name in NAMES, without or with sequence parallelism."""
    # BEGIN SOLUTION
    # hint: For each weight: which of its two dims does the split cut, given that
    # hint: nn.Linear stores (out_features, in_features)? After fc2's matmul, does any rank
    # hint: hold the output yet, or only a term of it? Under SP, what is split outside the
    # hint: MLP: the tokens (rows) or the features (columns)?
    outside = Shard(0) if sp else Replicate()
    return {"x": outside, "x_in": Replicate(), "fc1.weight": Shard(0), "fc1.bias": Shard(0),
            "h": Shard(1), "fc2.weight": Shard(1), "fc2.bias": Replicate(),
            "y_partial": Partial(), "y": outside}
    # END SOLUTION
