# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex12
# Made from solutions/ex12_zb_h1_order.py by `python -m minitp.course.make_exercises`.
"""Exercise 12: write ZB-H1's order for one pipeline stage.

A pipeline of p stages trains on m microbatches; this function is stage r's
schedule (r = 0 is the first stage). It returns the order in which stage r runs
its units, each a tuple (kind, chunk, microbatch), chunk always 0 (one chunk per
stage), in the custom-schedule form `mt.train_step(schedule=...)` accepts:

    ("F", 0, i)   the forward of microbatch i
    ("B", 0, i)   its backward's first half: the input gradient, which the previous
                  stage waits for (and the biases', LayerNorms' and embeddings' gradients)
    ("W", 0, i)   its second half: the linear layers' weight gradients, which no one
                  waits for (`minitp.tensor_parallel.weight_grad`)

The idea (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ZB-H1): keep 1F1B's
order of forwards and backwards (lesson 11; you may call
`minitp.pipeline.schedules.one_f_one_b(p, r, m)` for it, or write it again) and split
each backward into B and W. Only B is on the path between the stages; a W is work stage
r owes no one, so it can run wherever stage r would otherwise wait. Where does it
wait in 1F1B? And what does putting a W off cost: until its W runs, a microbatch's
activations are still held. 1F1B's first stage holds p microbatches at its peak; how
many does stage r hold, and so how many W's may it owe without holding more?

What the grader requires (any order with these properties passes, not only this one):

* every F, B and W of microbatches 0 … m−1 exactly once; each B after its own F, each
  W after its own B; the last B or W of the stage is microbatch m−1's (the
  data-parallel gradient sync starts with it);
* the pipeline runs to its end: no stage waits for a message that a neighbour only
  sends after a unit that itself waits for this stage (a deadlock);
* at most p microbatches in flight on every stage (forwarded, W not yet run): 1F1B's
  peak on the first stage;
* with unit costs F = B = W = 1 tick, every rank idles exactly p − 1 ticks, the
  paper's (p−1)(F+B−W), for p = 2, 3, 4 and m = p, 2p, 2p+1 (1F1B idles 3(p−1));
* `mt.train_step` with your order on 4 real ranks (pp = 4, and pp = 2 × dp = 2)
  trains exactly as one device, in float64;
* your own order: no call to `minitp.pipeline.schedules.zb_h1`.

Check yourself on paper first: ``simulate(lambda p, r, m, v: zb_h1_order(p, r, m), 4, 8,
costs=dict(F=1, B=1, W=1))`` from `minitp.pipeline.schedules` gives the ticks, each
rank's idle and each stage's peak. Grade it with `mt.grade("ex12")` in a notebook or
`python -m minitp.course.grade ex12`.
"""


def zb_h1_order(p: int, r: int, m: int) -> list[tuple[str, int, int]]:
    """Stage r's ZB-H1 order of ("F", 0, i), ("B", 0, i) and ("W", 0, i), i = 0 … m−1."""
    # hint: Which of 1F1B's units must stay where they are, and which can move? Where
    # hint: does stage r sit idle in 1F1B, and which units could fill that time? How many
    # hint: W's may stage r owe at once before it holds more than p microbatches?
    raise NotImplementedError(
        "Which of 1F1B's units must stay where they are, and which can move? Where does stage"
        " r sit idle in 1F1B, and which units could fill that time? How many W's may stage r "
        'owe at once before it holds more than p microbatches?'
    )
