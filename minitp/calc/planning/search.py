"""Every configuration, by brute force: the check on `plan`'s search.

`plan` searches a space with shortcuts (ZeRO only where dp > 1, sequence
parallelism only where tp > 1, a few micro-batch sizes) and keeps what fits.
`every_configuration` takes none: it lists every (dp, pp, tp, ZeRO stage,
recompute) whose product is the GPU count and that `check_parallel_config`
accepts, fits or not, each with its MODELLED memory (`memory_per_gpu`) and step
time (`step_time`) — the same two functions `plan` ranks with, so the two must
agree on the best; where they do not, the difference is in the search. The rest
is fixed, as in exercise 17: micro-batch ``micro_batch``, sequence parallelism
wherever tp > 1, the 1F1B schedule without interleaving.

    every = every_configuration(cfg, calc.A100_80GB, 1024, 1536, memory_cap=72 * GiB)
    best = min((c for c in every if c.fits), key=lambda c: c.time.total)

A mixture of experts: every ep of `minitp.calc.planning.plan.expert_parallel_sizes` too (the key
gains ep where ep > 1), timed by `minitp.calc.architectures.moe.moe_step_time`. ``schedules`` adds
"zb-h1" and "zb-h2" where pp > 1 and their rules hold (the key gains the schedule).
``cp`` > 1: dp·pp·tp·cp = the GPU count, and every attention of
`minitp.calc.planning.plan.cp_variants` the heads allow (the key gains cp, cp_comm and the
all-to-all's size), ring only for a mixture of experts, as `plan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from ...rules import CP_COMMS, ZERO_BUBBLE_SCHEDULES, check_parallel_config, placement_of
from ..architectures.moe import moe_step_time
from ..footprint.memory import memory_per_gpu
from ..network.cluster import Cluster
from .plan import cp_variants, expert_parallel_sizes
from .timing import StepTime

RECOMPUTE = (None, "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class Configuration:
    """One way to run, with the model's memory (bytes, busiest GPU) and step time."""

    dp: int
    pp: int
    tp: int
    zero_stage: int
    recompute: str | None
    sp: bool
    microbatches: int
    memory: dict = field(compare=False)
    time: StepTime = field(compare=False)
    fits: bool = field(compare=False)
    ep: int = 1
    schedule: str | None = None  # None: 1F1B
    cp: int = 1
    cp_comm: str = "ring"
    cp_a2a_size: int | None = None  # "a2a+ring": its all-to-all's ranks

    def key(self) -> tuple:
        base = (self.dp, self.pp, self.tp, self.zero_stage, self.recompute)
        base = base if self.ep == 1 else (*base, self.ep)
        base = base if self.schedule is None else (*base, self.schedule)
        return base if self.cp == 1 else (*base, self.cp, self.cp_comm, self.cp_a2a_size)


def every_configuration(cfg, cluster: Cluster, n_gpus: int, global_batch: int,
                        memory_cap: float, micro_batch: int = 1, optimizer: str = "megatron",
                        efficiency: float = 0.5, schedules=(None,), cp: int = 1,
                        cp_comms=CP_COMMS) -> list[Configuration]:
    """Every valid (dp, pp, tp, ZeRO stage, recompute) for ``n_gpus``, fastest first
    (by the model), each marked ``fits`` when its busiest GPU holds at most
    ``memory_cap`` bytes. Valid: dp·pp·tp = n_gpus, `check_parallel_config` accepts
    it, and the global batch shares out into whole microbatches of ``micro_batch``.
    A ZeRO stage above 0 with dp = 1 is valid and changes nothing (one replica has
    nothing to shard): it is listed, and ties with stage 0. ``cp``: context parallelism,
    fixed; its attentions as the module says."""
    if n_gpus % cp:
        raise ValueError(f"n_gpus={n_gpus} is not divisible by cp={cp}")
    found = []
    for dp in range(1, n_gpus // cp + 1):
        for pp in range(1, n_gpus // (cp * dp) + 1):
            tp, left = divmod(n_gpus // cp, dp * pp)
            if left or global_batch % (dp * micro_batch):
                continue
            sp, m = tp > 1, global_batch // (dp * micro_batch)
            for zero, recompute, ep, schedule, (comm, u) in product(
                    ZERO_STAGES, RECOMPUTE, expert_parallel_sizes(cfg, dp, cp), schedules,
                    cp_variants(cp, cp_comms)):
                zb, placement = schedule in ZERO_BUBBLE_SCHEDULES, placement_of(schedule)
                chunks = 2 if placement == "v" else 1  # a V: two chunks per rank
                if (zb and pp == 1) or (placement == "v" and recompute == "full"):
                    continue  # (a V's closed forms hold for F = B = W: `pipeline_idle`)
                try:
                    check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, cp=cp, sequence_parallel=sp,
                                          recompute=recompute, zero_stage=zero, ep=ep,
                                          virtual_stages=chunks, placement=placement,
                                          schedule=schedule, microbatches=m if zb else None,
                                          cp_comm=comm, cp_a2a_size=u)
                except ValueError:
                    continue
                memory = memory_per_gpu(cfg, micro_batch, dp, pp, tp, sp, recompute, zero,
                                        optimizer, chunks, microbatches=m, cp=cp, ep=ep,
                                        schedule=schedule, cp_comm=comm)
                time = moe_step_time(cfg, cluster, dp, pp, tp, micro_batch, global_batch, sp,
                                     recompute, chunks, efficiency=efficiency, zero_stage=zero,
                                     cp=cp, ep=ep, schedule=schedule, cp_comm=comm,
                                     cp_a2a_size=u)
                found.append(Configuration(dp, pp, tp, zero, recompute, sp, m, memory, time,
                                           memory["total"] <= memory_cap, ep, schedule, cp,
                                           comm, u))
    found.sort(key=lambda c: c.time.total)
    return found
