# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex16
# Made from solutions/ex16_tp_step_time.py by `python -m minitp.course.make_exercises`.
"""Exercise 16: a tensor-parallel step's compute and communication, predicted.

Lesson 16 found communication taking a growing share of a tensor-parallel step
as t grows, and more so on a faster GPU. Predict that share yourself, for one
training step of a GPT on t GPUs of one node (tensor parallelism only, one
microbatch of ``batch`` sequences, 16-bit activations, nothing overlapped):

* compute: the step's FLOPs (`mt.calc.flops_per_iteration`) shared by the t
  GPUs, each running at ``efficiency`` × ``cluster.peak_flops``;
* communication: the tensor-parallel all-reduces of the transformer layers,
  forward and backward, each a ring (lesson 01) on the node's links:
  ``cluster.intra_latency`` seconds per message and ``cluster.intra_bandwidth``
  bytes per second. Leave out the vocab-parallel embedding's and the loss's
  all-reduces (lesson 04), as the model you are graded against does: one more
  activation-sized all-reduce per step beside four per layer, and two of
  (batch, seq_len) numbers.

Return both, in seconds. The grader compares your numbers with
`mt.calc.step_time`'s for Megatron-LM's whole model family on 8×V100 and
8×H100 nodes — so build them from the pieces above: a solution that calls
`calc.step_time` (or `Cluster.collective_seconds`) is told so.
Grade it with `mt.grade("ex16")` in a notebook or `python -m minitp.course.grade ex16`.
"""

from minitp import calc


def tp_step_seconds(cfg, t: int, batch: int, cluster, efficiency: float) -> tuple[float, float]:
    """(compute seconds, communication seconds) of one training step on t GPUs."""
    # hint: all t GPUs share the step's FLOPs evenly; each achieves efficiency × peak.
    raise NotImplementedError(
        "all t GPUs share the step's FLOPs evenly; each achieves efficiency × peak."
    )
    # hint: count the all-reduces of one layer in forward and in backward (lesson 03),
    # hint: and what one of them moves: a (batch, seq_len, d_model) activation of 2-byte
    # hint: values. A ring over t ranks: how many steps, each paying the latency once and
    # hint: moving what fraction of the tensor (lesson 01)? What does t = 1 cost?
    raise NotImplementedError(
        'count the all-reduces of one layer in forward and in backward (lesson 03), and what '
        'one of them moves: a (batch, seq_len, d_model) activation of 2-byte values. A ring '
        'over t ranks: how many steps, each paying the latency once and moving what fraction '
        'of the tensor (lesson 01)? What does t = 1 cost?'
    )
