# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex11
# Made from solutions/ex11_one_f_one_b.py by `python -m minitp.course.make_exercises`.
"""Exercise 11: run one 1F1B training step on one pipeline stage.

A pipeline of p stages trains on m microbatches; this process is stage r (rank
r of p). The grader hands you `stage`, which computes; everything between the
stages is yours: what to receive and from whom, what to send on, what to keep
until a microbatch's backward, and when to let it go.

    stage.r, stage.p            this stage's index (0 first) and the number of stages
    stage.prev, stage.next      the global ranks of the neighbouring stages (None at the ends)
    stage.activation_buffer()   a new, empty tensor shaped like one microbatch's activation
    stage.forward(i, x)         runs this stage's layers on microbatch i and returns `out`:
                                the activation for the next stage, or, on the last stage,
                                the microbatch's share of the loss. x: the activation from
                                the previous stage (None on the first stage); it must
                                require grad, so that backward leaves its gradient in x.grad
    stage.backward(i, out, g)   backpropagates microbatch i from its `out`; g is the gradient
                                of `out` from the next stage (None on the last stage)

Messages: ``mt.comm.irecv(buffer, rank)`` and ``mt.comm.isend(tensor, rank)`` post
a message and return a `Pending` at once; its ``wait()`` finishes it (an irecv's
returns the filled buffer). Wait for every send you posted before you return.

The schedule is 1F1B (PipeDream-Flush; lesson 11 prints its order): microbatches
in order, forward and backward alike; each stage starts a microbatch's
backward as early as the pipeline lets it, and from then on runs one forward
and one backward in turn, so that it never holds more than p − r microbatches'
activations, whatever m. A stage holds a microbatch from its forward until its
backward, and not a moment longer: keep nothing after the step.

Grade it with `mt.grade("ex11")` in a notebook or `python -m minitp.course.grade ex11`:
four real processes run your function at m = 5 and m = 2 in float64; a deadlock
is reported as the ranks that never met.
"""

import torch

import minitp as mt


def one_f_one_b_step(stage, m: int) -> None:
    """Run the forwards and backwards of microbatches 0 … m−1 on this stage, in 1F1B order."""
    # hint: Start with the last stage, which can run each backward right after its
    # hint: forward. How many forwards must stage r run before microbatch 0's gradient
    # hint: can come back to it? Write one function for a forward (receive, compute, send,
    # hint: keep) and one for a backward (take back what you kept, receive, compute, send),
    # hint: then call them in 1F1B's order.
    raise NotImplementedError(
        'Start with the last stage, which can run each backward right after its forward. How '
        "many forwards must stage r run before microbatch 0's gradient can come back to it? "
        'Write one function for a forward (receive, compute, send, keep) and one for a '
        "backward (take back what you kept, receive, compute, send), then call them in 1F1B's"
        ' order.'
    )
