"""Predicted time of one training iteration: compute, each axis, and the bubble.

A roofline for compute and an α–β model for every collective, summed: nothing
overlaps (Megatron-LM's tensor-parallel all-reduces sit on the critical path;
overlapping the data-parallel reduction with backward would hide part of "dp").
Ranks are laid out as `minitp.Mesh` lays them out (tp fastest, then dp, then
pp), so an axis stays inside a node while its groups fit in one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...rules import ZERO_BUBBLE_SCHEDULES, check_parallel_config, check_zero_bubble
from ..counts.flops import bubble as bubble_fraction
from ..counts.flops import flops_per_iteration
from ..counts.params import params_per_rank
from ..network.cluster import Cluster
from ..network.comm import tp_collectives_per_layer
from ..network.cp_overlap import cp_exposed_seconds


@dataclass(frozen=True)
class StepTime:
    """Seconds per iteration, by where they go."""

    compute: float
    tp: float
    pp: float
    dp: float
    bubble: float

    @property
    def total(self) -> float:
        return sum(asdict(self).values())

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.as_dict().items())
        return f"StepTime(ms: {parts})"


@dataclass(frozen=True)
class ContextParallelStepTime(StepTime):
    """A `StepTime` with one more part: context parallelism's attention transfers (cp > 1)."""

    cp: float = 0.0


def microbatch_count(global_batch: int, dp: int, micro_batch: int) -> int:
    """m = B / (d·b): each data-parallel rank runs m microbatches of b sequences."""
    if global_batch % (dp * micro_batch):
        raise ValueError(f"global_batch={global_batch} is not divisible by "
                         f"dp*micro_batch={dp}*{micro_batch}")
    return global_batch // (dp * micro_batch)


def schedule_bubble(pp: int, microbatches: int, virtual: int = 1, schedule=None,
                    recompute=None) -> int | float:
    """The bubble fraction `step_time` charges: `bubble` with the costs of one microbatch
    through one stage in forwards' worth, a MODEL from the matrices' FLOPs — F = 1, and
    the input gradient B and weight gradient W each 1 (each is one 2mnk product, as the
    forward is); full recomputation redoes the forward inside B: B = 2. Attention's
    weightless products put their whole backward in B, and a schedule's order is not
    re-fitted to these costs: neither modelled. 1F1B, GPipe and interleaved:
    (p − 1)/(v·m) whatever the costs; ZB-H1 and ZB-H2 in one synchronous step
    (`pipeline_idle`): (p − 1)/(3m) for m ≥ p, (p − 1)/(4m) with full recomputation."""
    t_b = 2 if recompute == "full" else 1
    return bubble_fraction(pp, microbatches, virtual, schedule, t_f=1, t_b=t_b, t_w=1)


def step_time(cfg, cluster: Cluster, dp: int = 1, pp: int = 1, tp: int = 1,
              micro_batch: int = 1, global_batch: int | None = None, sp: bool = False,
              recompute=None, virtual: int = 1, efficiency: float = 0.5,
              bytes_per_value: int = 2, grad_bytes: int = 2, zero_stage: int = 0,
              cp: int = 1, schedule=None, cp_comm: str = "ring",
              cp_a2a_size: int | None = None, causal: bool = False) -> StepTime:
    """Predicted seconds per iteration on ``cluster`` for a (dp, pp, cp, tp) run.

    * compute: FLOPs executed (`flops_per_iteration`, recomputation included; full
      attention unless ``causal``, which counts the half a causal kernel computes),
      shared evenly by the dp·pp·tp GPUs, at ``efficiency`` × peak;
    * tp: per microbatch and layer of a stage, `tp_collectives_per_layer`
      all-reduces of bsh values (with sp, each is a reduce-scatter plus an
      all-gather: the same α–β time);
    * pp: per microbatch, one send of bsh values (bsh/t with sp) forward and
      one backward, v times with v virtual stages (Narayanan et al. 2021, §2.2.2);
    * dp: one all-reduce of the largest stage's gradients (ZeRO-1: the same time,
      as a reduce-scatter and an all-gather). Stages 2 and 3 reduce-scatter every
      microbatch's gradient (as minitp, DeepSpeed and FSDP do): m − 1 more;
      stage 3 also gathers the parameters before each microbatch's forward and
      backward: 2m gathers in all, where the all-reduce counted one — for m = 1,
      1.5× (Rajbhandari et al. 2020, §7); with a B/W-split schedule, m more
      reduce-scatters (each W reduces its unit again: `minitp.tensor_parallel.weight_grad`);
    * cp (cp > 1): per microbatch and layer, the attention ``cp_comm``'s messages and
      bytes (`minitp.calc.network.context_parallel.cp_layer_seconds`, the bytes
      `minitp.calc.cp_comm_bytes`'): the ring's 2(3c−2) sends of one rank's K or V
      (its K/V heads only, under GQA), the all-gather's 4(c−1) steps (6(c−1) gathering
      again), the all-to-all's
      8(U−1) messages a rank (inside tp·U ranks; "a2a+ring": then the ring over c/U);
      what the step waits for of them: the ring's hide behind (c−1)/c of attention's
      compute, the all-gathers' and all-to-alls' are exposed
      (`minitp.calc.network.cp_overlap.cp_exposed_seconds`, so a plan ranks the variants as
      lesson 10 does once communication hides);
      each rank then holds s/c tokens, so the tp and pp messages are 1/c the
      size and the gradients are all-reduced over dp·cp;
    * bubble: (p−1)/(v·m) × the stage's busy time per iteration (compute, tp, pp);
      ``schedule`` "zb-h1" or "zb-h2" (their rules hold: `check_zero_bubble`):
      `schedule_bubble`'s fraction in its place.
    ``global_batch`` defaults to one microbatch per data-parallel rank.
    """
    check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, cp=cp, sequence_parallel=sp,
                          recompute=recompute, virtual_stages=virtual, zero_stage=zero_stage,
                          cp_comm=cp_comm, cp_a2a_size=cp_a2a_size)
    global_batch = global_batch or dp * micro_batch
    m = microbatch_count(global_batch, dp, micro_batch)
    check_zero_bubble(schedule, pp, m, False)
    n_gpus = dp * pp * cp * tp
    compute = flops_per_iteration(cfg, global_batch, recompute, causal=causal) / n_gpus
    compute /= cluster.peak_flops * efficiency
    activation = micro_batch * (cfg.seq_len // cp) * cfg.d_model * bytes_per_value
    per_layer = tp_collectives_per_layer(recompute) * cluster.collective_seconds(
        "all_reduce", activation, tp, span=tp)
    tp_time = m * (cfg.n_layer // pp) * per_layer
    pp_time = 0.0
    if pp > 1:
        send = cluster.collective_seconds("send", activation / (tp if sp else 1), 2,
                                          span=tp * cp * dp * pp)
        pp_time = 2 * m * virtual * send
    cp_time = m * (cfg.n_layer // pp) * cp_exposed_seconds(
        cluster, cp_comm, rows=micro_batch, seq_len=cfg.seq_len, heads=cfg.n_head,
        kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, cp=cp, tp=tp, cp_a2a_size=cp_a2a_size,
        bytes_per_value=bytes_per_value, efficiency=efficiency)["exposed"]
    grads = dp * cp  # the group the gradients are summed (and ZeRO shards) over
    gradients = params_per_rank(cfg, tp, pp) * grad_bytes
    dp_time = cluster.collective_seconds("all_reduce", gradients, grads, span=tp * cp * dp)
    if zero_stage >= 2:  # the all-reduce above counts one reduce-scatter and one gather
        params = params_per_rank(cfg, tp, pp) * bytes_per_value
        gather = cluster.collective_seconds("all_gather", params, grads, span=tp * cp * dp)
        scatter = cluster.collective_seconds("reduce_scatter", gradients, grads,
                                             span=tp * cp * dp)
        dp_time += (m - 1) * scatter + (2 * m - 1) * gather * (zero_stage == 3)
        if zero_stage == 3 and schedule in ZERO_BUBBLE_SCHEDULES:  # minitp's deferred W
            dp_time += m * scatter  # reduces its weights' slots in a second reduce-scatter
    busy = compute + tp_time + pp_time + cp_time
    bubble = busy * schedule_bubble(pp, m, virtual, schedule, recompute)
    parts = (compute, tp_time, pp_time, dp_time, bubble)
    return ContextParallelStepTime(*parts, cp_time) if cp > 1 else StepTime(*parts)
