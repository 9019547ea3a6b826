"""Exercise 12: choose (dp, pp, tp, recompute, ZeRO stage) for a run, under a memory cap.

Lesson 12's planner tried every configuration and kept the fastest that fits. Now you
choose: given a model ``cfg`` (a GPTConfig), the ``cluster`` it runs on (a
`mt.calc.Cluster`: its GPUs' speed and links), ``n_gpus`` GPUs, a global batch of
``global_batch`` sequences and a memory cap of ``memory_cap`` bytes per GPU, return

    {"dp": 8, "pp": 16, "tp": 8, "recompute": None, "zero_stage": 0}

with dp · pp · tp = n_gpus, recompute one of None, "selective" or "full", and a ZeRO
stage from 0 to 3. The rest is fixed, as in lesson 12: micro-batch 1 (each replica
runs m = global_batch / dp microbatches), sequence parallelism wherever tp > 1,
Megatron-LM's 18 bytes per parameter, the 1F1B schedule, 50% of peak. In the
calculator's terms, the grader measures your plan with

    sp, m = tp > 1, global_batch // dp
    calc.memory_per_gpu(cfg, 1, dp, pp, tp, sp, recompute, zero_stage, "megatron",
                        microbatches=m)["total"]                # at most memory_cap
    calc.step_time(cfg, cluster, dp, pp, tp, 1, global_batch, sp, recompute,
                   zero_stage=zero_stage).total                 # the model's seconds

and passes it when it fits and its step time is within 10% of the fastest plan that
`calc.plan` finds in the same space, for five runs from 1.7B to 175B parameters on
A100s and H100s, some with a tight cap. Choose with the two functions above (or your
own reasoning); a solution that calls `calc.plan` is told so.
Grade it with `mt.grade("ex12")` in a notebook or `python -m minitp.course.grade ex12`.
"""

from itertools import product

import minitp as mt
from minitp import calc


def choose_plan(cfg, cluster, n_gpus: int, global_batch: int, memory_cap: float) -> dict:
    """A plan for this run: {"dp", "pp", "tp", "recompute", "zero_stage"}."""
    # BEGIN SOLUTION
    # hint: which splits can this model take at all? `mt.check_parallel_config` says
    # hint: why one cannot, and the global batch must share out evenly too. For those
    # hint: that can, the calculator tells memory and seconds (the docstring's two
    # hint: calls). Recomputation and ZeRO buy memory: what does each cost (lesson 12)?
    sizes = [d for d in range(1, n_gpus + 1) if n_gpus % d == 0]
    best, best_seconds = None, float("inf")
    for tp, pp, recompute in product(sizes, sizes, (None, "selective", "full")):
        dp, left = divmod(n_gpus, tp * pp)
        if left or global_batch % dp:
            continue
        sp = tp > 1
        try:
            mt.check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, sequence_parallel=sp,
                                     recompute=recompute)
        except ValueError:  # tp must divide the heads, pp the layers, ...
            continue
        for zero in range(4) if dp > 1 else (0,):  # one replica has nothing to shard
            memory = calc.memory_per_gpu(cfg, 1, dp, pp, tp, sp, recompute, zero, "megatron",
                                         microbatches=global_batch // dp)
            if memory["total"] > memory_cap:
                continue
            seconds = calc.step_time(cfg, cluster, dp, pp, tp, 1, global_batch, sp,
                                     recompute, zero_stage=zero).total
            if seconds < best_seconds:
                best_seconds = seconds
                best = {"dp": dp, "pp": pp, "tp": tp, "recompute": recompute,
                        "zero_stage": zero}
    return best
    # END SOLUTION
