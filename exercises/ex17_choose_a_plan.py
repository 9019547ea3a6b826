# Fill in the NotImplementedError lines, then grade: python -m minitp.course.grade ex17
# Made from solutions/ex17_choose_a_plan.py by `python -m minitp.course.make_exercises`.
"""Exercise 17: choose (dp, pp, tp, recompute, ZeRO stage) for a run, and say why.

Lesson 17's planner tried every configuration and kept the fastest that fits. Here you
reason to a plan instead, the way Narayanan et al. 2021 (§3.3) do, and check it with
the calculator a few times. Given a model ``cfg`` (a GPTConfig), the ``cluster`` it runs
on (a `mt.calc.Cluster`: its GPUs' speed and links, ``cluster.gpus_per_node``),
``n_gpus`` GPUs, a global batch of ``global_batch`` sequences and a memory cap of
``memory_cap`` bytes per GPU, return the plan and the numbers that justify it:

    {"dp": 2, "pp": 8, "tp": 4, "recompute": "selective", "zero_stage": 1,
     "why": {"memory_gib": 13.4,      # the plan's busiest GPU, GiB
             "shallower_gib": 16.9,   # the same plan one pipeline depth shallower, GiB
             "tp_stop": "cost",       # why tp is not twice as large
             "bubble": 0.0547}}       # (p - 1) / m

with dp · pp · tp = n_gpus, recompute one of None, "selective" or "full", and a ZeRO
stage from 0 to 3. ZeRO shards the 18 bytes per parameter over the dp ranks (lesson 13
ran stage 1; ahead: lesson 21 runs all four): stage 0 keeps all 18 on every rank,
stage 1 shards Adam's 12 (6 + 12/dp), stage 2 the fp32 gradients' 4 too (2 + 16/dp),
stage 3 the bf16 weights' 2 too (18/dp). In `calc.step_time` stage 1 costs what the
all-reduce did; stage 2 reduce-scatters the gradients after every microbatch (m times,
not once), stage 3 also all-gathers the weights before every microbatch's forward and
backward (2m times). The rest is fixed, as in lesson 17: micro-batch 1 (each replica runs
m = global_batch / dp microbatches), sequence parallelism wherever tp > 1, Megatron-LM's
18 bytes per parameter, the 1F1B schedule, 50% of peak. The justification:

* ``memory_gib``: the busiest GPU of your plan, in GiB (2**30 bytes);
* ``shallower_gib``: the busiest GPU of the same tp, recompute and ZeRO stage at the
  next shallower valid pipeline depth (the largest p' < pp in ``depths(...)``, dp
  growing to n_gpus / (tp · p')), in GiB; None when pp is the shallowest valid depth;
* ``tp_stop``: why tp is not 2·tp: ``"node"`` (2·tp GPUs would span two nodes),
  ``"heads"`` (2·tp does not divide the heads), or ``"cost"`` (2·tp was possible, and
  its all-reduces cost more than they would save);
* ``bubble``: the bubble fraction (p − 1)/m of your plan, m per replica.

The grader measures your plan with the calculator,

    sp, m = tp > 1, global_batch // dp
    calc.memory_per_gpu(cfg, 1, dp, pp, tp, sp, recompute, zero_stage, "megatron",
                        microbatches=m)["total"]                # at most memory_cap
    calc.step_time(cfg, cluster, dp, pp, tp, 1, global_batch, sp, recompute,
                   zero_stage=zero_stage).total                 # the model's seconds

and passes it when it fits and its step time is within 10% of the fastest plan that
`calc.plan` finds in the same space, for six runs from 1.7B to 175B parameters on A100s
and H100s, some with a tight cap. Each number of ``why`` must agree with the calculator
(memory within 2%, the bubble within 0.1%; ``tp_stop`` exactly). Reason, do not search:
your code may call `calc.memory_per_gpu` and `calc.step_time` at most 3 times in all per
run (the grader counts them, however you import them), and never `calc.plan`. The
arithmetic under them is yours to use freely: `calc.params_per_rank`,
`calc.activation_bytes_per_layer`, `calc.bubble`, `cluster.collective_seconds`.
Grade it with `mt.grade("ex17")` in a notebook or `python -m minitp.course.grade ex17`.
"""

from minitp import calc

GiB = 2**30
RECOMPUTE = (None, "selective", "full")  # the least recomputation first


def depths(cfg, n_gpus: int, tp: int, global_batch: int) -> list[int]:
    """The valid pipeline depths at this tp, shallowest first: p divides the layers,
    tp·p divides the GPUs, and dp = n_gpus / (tp·p) divides the global batch."""
    return [p for p in range(1, n_gpus // tp + 1)
            if cfg.n_layer % p == 0 and n_gpus % (tp * p) == 0
            and global_batch % (n_gpus // (tp * p)) == 0]


def choose_plan(cfg, cluster, n_gpus: int, global_batch: int, memory_cap: float) -> dict:
    """A plan for this run and why: {"dp", "pp", "tp", "recompute", "zero_stage", "why"}."""
    # hint: reason in steps, each checked at most once. Does the model fit on one GPU?
    # hint: If not: tensor parallelism up to a node, as the heads allow (Narayanan et al.
    # hint: 2021, §3.3), then the shallowest pipeline that fits: with 1F1B the
    # hint: activations are l layers' worth whatever p is, so p only divides the model
    # hint: states. What does ZeRO-1 cost in this model? Then ask once: do tp's
    # hint: all-reduces cost more than the bubble of a pipeline twice as deep?
    # hint: Last, the four numbers of "why".
    raise NotImplementedError(
        'reason in steps, each checked at most once. Does the model fit on one GPU? If not: '
        'tensor parallelism up to a node, as the heads allow (Narayanan et al. 2021, §3.3), '
        "then the shallowest pipeline that fits: with 1F1B the activations are l layers' "
        'worth whatever p is, so p only divides the model states. What does ZeRO-1 cost in '
        "this model? Then ask once: do tp's all-reduces cost more than the bubble of a "
        'pipeline twice as deep? Last, the four numbers of "why".'
    )
