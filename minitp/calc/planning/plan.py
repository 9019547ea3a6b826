"""Plan a run: every (dp, pp, tp, sp, recompute, micro-batch, ZeRO stage) that fits,
fastest first.

`plan` enumerates the splits of ``n_gpus`` GPUs that `check_parallel_config`
accepts, keeps those whose busiest GPU fits in memory (`memory_per_gpu`), and
ranks them by `step_time`. Everything it knows is in those two functions: a
higher ZeRO stage fits more (model states / N_d) and costs more data-parallel
communication (stage 3: 1.5× per microbatch).

A mixture of experts (``cfg.n_experts`` > 0) adds expert parallelism to the search:
every ep that divides dp·cp and the experts (`minitp.rules.experts.check_expert_parallel`,
through `check_parallel_config`, decides), with the experts' memory divided by ep
(`memory_per_gpu`) and the all-to-alls' time (`minitp.calc.architectures.moe.moe_step_time`). A
dense config is searched and ranked exactly as before.

Pipeline schedules: 1F1B (interleaved where v > 1) unless ``schedules`` names more.
"zb-h1" and "zb-h2" are tried where pp > 1, v = 1 and their rules hold (ZeRO 0 to 2;
ZB-H2 m ≥ 2p − 1: `minitp.rules.check_zero_bubble`), with their bubble
(`minitp.calc.planning.timing.schedule_bubble`) and microbatches in flight
(`minitp.calc.microbatches_in_flight`: ZB-H1 p, ZB-H2 2p − 1).

Context parallelism (``cp`` > 1, fixed): each attention of `cp_variants` — ring,
all-gather, Ulysses, the hybrid at every all-to-all size — that the heads allow
(`minitp.rules.check_cp_comm`, through `check_parallel_config`), ranked by the same
`step_time`, which counts each one's messages and bytes. At cp = 1 nothing changes.

Uneven pipelines (``layouts=True``): a pp whose stages the layers do not divide is tried too
(v = 1, not in a V, at most one stage a layer), with the layout `minitp.calc.pipeline_layout`
chooses (`layout_for`; the candidate's ``layout``, what ``--pipeline-layout`` reads). It is
priced as the even pipeline of its longest stage, every stage holding that many layers: the
step waits for the slowest stage, and the busiest GPU holds at most that. A MODEL, and an
upper bound on both memory and time (a shorter stage's GPUs idle, priced as busy).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product

from ...rules import (
    CP_COMMS,
    ZERO_BUBBLE_SCHEDULES,
    check_parallel_config,
    interleaving_fits,
    placement_of,
)
from ..architectures.moe import moe_step_time
from ..counts.flops import bubble
from ..footprint.memory import memory_per_gpu
from ..network.cluster import Cluster, GiB
from ..network.hierarchy import axis_levels
from .pipeline_layout import pipeline_layout
from .timing import StepTime, schedule_bubble


@dataclass(frozen=True)
class Candidate:
    """One way to run: its sizes, the busiest GPU's memory (bytes) and the step time."""

    dp: int
    pp: int
    tp: int
    micro_batch: int
    microbatches: int
    sp: bool
    recompute: str | None
    virtual: int
    memory: dict = field(compare=False)
    time: StepTime = field(compare=False)
    zero_stage: int = 0
    cp: int = 1
    ep: int = 1
    schedule: str | None = None  # None: 1F1B, or the interleaved one where virtual > 1
    cp_comm: str = "ring"  # context parallelism's attention (cp > 1)
    cp_a2a_size: int | None = None  # "a2a+ring": its all-to-all's ranks
    layout: str | None = None  # an uneven pipeline's stages (`layout_for`); None: even

    def __str__(self) -> str:
        zero = f" zero={self.zero_stage}" if self.zero_stage else ""
        zero += f" schedule={self.schedule}" if self.schedule else ""
        zero += f" layout={self.layout}" if self.layout else ""
        hybrid = f" over {self.cp_a2a_size}" if self.cp_a2a_size else ""
        cp = f" cp={self.cp} ({self.cp_comm}{hybrid})" if self.cp > 1 else ""
        cp += f" ep={self.ep}" if self.ep > 1 else ""
        return (f"dp={self.dp} pp={self.pp}{cp} tp={self.tp} b={self.micro_batch} "
                f"m={self.microbatches} v={self.virtual} sp={self.sp} "
                f"recompute={self.recompute}{zero}: {self.memory['total'] / GiB:.1f} GiB, "
                f"{self.time.total:.3f} s")


@dataclass(frozen=True)
class Plan:
    """Candidates that fit, fastest first, and how many were tried."""

    cluster: Cluster
    candidates: list[Candidate]
    tried: int

    @property
    def best(self) -> Candidate:
        if not self.candidates:
            raise ValueError(f"none of the {self.tried} configurations fits in "
                             f"{self.cluster.memory / GiB:.0f} GiB per GPU")
        return self.candidates[0]

    def explain(self) -> str:
        """The winner: its memory by kind, its time by part, which links each axis uses."""
        c, g = self.best, self.cluster.gpus_per_node
        spans = {"tp": c.tp, **({"cp": c.tp * c.cp} if c.cp > 1 else {}),
                 **({"ep": c.tp * c.cp * c.ep} if c.ep > 1 else {}),
                 "dp": c.tp * c.cp * c.dp, "pp": c.tp * c.cp * c.dp * c.pp}
        lines = [f"best of {len(self.candidates)} that fit ({self.tried} tried): {c}",
                 "memory on the busiest GPU (GiB): " + ", ".join(
                     f"{k} {v / GiB:.1f}" for k, v in c.memory.items()),
                 "time per iteration (s): " + ", ".join(
                     f"{k} {v:.3f}" for k, v in c.time.as_dict().items()),
                 _bubble_line(c)]
        for axis, span in spans.items():
            where = "inside a node" if span <= g else "across nodes"
            lines.append(f"{axis} groups span {span} consecutive GPUs: {where} ({g} per node)")
        return "\n".join(lines)

    def levels(self) -> dict[str, str]:
        """The network level each axis of the winner uses, inside a node, across nodes or
        both (`minitp.calc.network.hierarchy.axis_levels`, the Mesh's layout: tp fastest)."""
        c = self.best
        return axis_levels(self.cluster, tp=c.tp, cp=c.cp, ep=c.ep, dp=c.dp, pp=c.pp)

    def __str__(self) -> str:
        return self.explain()


def _bubble_line(c: Candidate) -> str:
    if c.schedule is None:
        return f"bubble fraction (p-1)/(v*m) = {bubble(c.pp, c.microbatches, c.virtual):.3f}"
    fraction = schedule_bubble(c.pp, c.microbatches, c.virtual, c.schedule, c.recompute)
    return f"bubble fraction ({c.schedule}, F = B = W, a MODEL) = {fraction:.3f}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_parallel_sizes(cfg, dp: int, cp: int = 1) -> list[int]:
    """The ep sizes to try: (1,) for a dense config; else the divisors of dp·cp that
    divide the experts (what `check_parallel_config` then admits is tried)."""
    experts = getattr(cfg, "n_experts", 0)
    return [e for e in _divisors(dp * cp) if experts % e == 0] if experts else [1]


def cp_variants(cp: int, cp_comms=CP_COMMS) -> list[tuple[str, int | None]]:
    """(cp_comm, cp_a2a_size) to try at context parallelism ``cp``: the ring alone at
    cp = 1; else each of ``cp_comms``, "a2a+ring" with every all-to-all size U, 1 < U < cp,
    that divides cp (at U = 1 it is the ring, at U = cp "a2a"). Whether the heads allow
    one is `check_parallel_config`'s to say."""
    if cp == 1:
        return [("ring", None)]
    sizes = [u for u in _divisors(cp) if 1 < u < cp]
    return [(name, u) for name in cp_comms for u in (sizes if name == "a2a+ring" else [None])]


def layout_for(cfg, pp: int, chunks: int = 1, placement: str = "loop"):
    """(layout, the config it is priced as) for pp·chunks stages: (None, cfg) where the
    layers divide; where they do not, `pipeline_layout`'s layout and cfg with every stage as
    long as its longest (n_layer = pp·that); (None, None) where no layout is tried (virtual
    stages, a V, more stages than layers)."""
    if cfg.n_layer % (pp * chunks) == 0:
        return None, cfg
    if chunks > 1 or placement == "v" or pp > cfg.n_layer:
        return None, None
    choice = pipeline_layout(cfg, pp)
    return choice.layout, replace(cfg, n_layer=pp * max(len(r) for r in choice.stages))


def plan(cfg, cluster: Cluster, global_batch: int, n_gpus: int, micro_batches=(1, 2, 4, 8),
         recompute=(None, "selective", "full"), virtual=(1,), optimizer: str = "megatron",
         zero_stage=0, usable: float = 0.9, efficiency: float = 0.5, cp: int = 1,
         schedules=(None,), cp_comms=CP_COMMS, layouts: bool = False) -> Plan:
    """Every split of ``n_gpus`` (dp·pp·tp) that fits in ``usable`` × the GPU's memory,
    ranked by predicted step time. Sequence parallelism is tried wherever tp > 1;
    the interleaved schedule (v > 1) needs m to be a multiple of p, as in Megatron-LM.
    zero_stage: one stage, or several to search, e.g. ``(0, 1, 2, 3)`` (a stage
    above 0 is tried only where dp > 1: with one replica there is nothing to shard).
    cp: context parallelism, fixed (not searched): the splits are of n_gpus/cp; where
    cp > 1 each of ``cp_comms`` (`cp_variants`) is tried that `check_parallel_config`
    accepts (Ulysses needs whole heads on each all-to-all rank), with its memory
    (`memory_per_gpu`: the all-gather keeps K and V whole) and its messages and bytes
    (`step_time`, and `moe_step_time` for a mixture of experts).
    A mixture of experts: each split is tried with every ep of `expert_parallel_sizes`.
    schedules: None (1F1B, or interleaved where v > 1) and any of "zb-h1", "zb-h2", each
    tried where pp > 1, v = 1 and `check_parallel_config` accepts it, and "zbv",
    "dualpipev", which bring their own two chunks per rank in a V (tried once, whatever
    ``virtual``) and are priced where their closed forms hold (F = B = W: not with full
    recomputation, `pipeline_idle`). layouts: also the pp whose stages the layers do not
    divide, each with `layout_for`'s layout and price (module docstring)."""
    stages = (zero_stage,) if isinstance(zero_stage, int) else tuple(zero_stage)
    if n_gpus % cp:
        raise ValueError(f"n_gpus={n_gpus} is not divisible by cp={cp}")
    fits, tried, priced = [], 0, {}
    for tp, pp, b, rc, v, sp, zero in product(_divisors(n_gpus), _divisors(n_gpus),
                                              micro_batches, recompute, virtual, (False, True),
                                              stages):
        dp = n_gpus // (tp * pp * cp)
        if n_gpus % (tp * pp * cp) or (sp and tp == 1) or global_batch % (dp * b):
            continue
        if zero and dp == 1 and len(stages) > 1:
            continue
        m = global_batch // (dp * b)
        for ep, schedule, (comm, u) in product(expert_parallel_sizes(cfg, dp, cp), schedules,
                                               cp_variants(cp, cp_comms)):
            zb, placement = schedule in ZERO_BUBBLE_SCHEDULES, placement_of(schedule)
            if placement == "v":  # its own two chunks: tried once, priced where F = B = W
                if v != virtual[0] or rc == "full":
                    continue
                chunks = 2
            elif zb and v > 1:
                continue
            else:
                chunks = v
            if (zb and pp == 1) or (not zb and v > 1 and (pp == 1
                                                          or not interleaving_fits(pp, m))):
                continue
            key = (pp, chunks, placement)
            if key not in priced:
                priced[key] = (layout_for(cfg, pp, chunks, placement) if layouts
                               else (None, cfg))
            layout, as_cfg = priced[key]
            try:
                check_parallel_config(cfg, dp=dp, pp=pp, tp=tp, cp=cp, sequence_parallel=sp,
                                      recompute=rc, virtual_stages=chunks, zero_stage=zero,
                                      ep=ep, schedule=schedule, placement=placement,
                                      microbatches=m if zb else None, cp_comm=comm,
                                      cp_a2a_size=u, pipeline_layout=layout)
            except ValueError:
                continue
            tried += 1
            memory = memory_per_gpu(as_cfg, b, dp, pp, tp, sp, rc, zero, optimizer, chunks, m,
                                    cp=cp, ep=ep, schedule=schedule, cp_comm=comm)
            if memory["total"] > usable * cluster.memory:
                continue
            time = moe_step_time(as_cfg, cluster, dp, pp, tp, b, global_batch, sp, rc, chunks,
                                 efficiency, zero_stage=zero, cp=cp, ep=ep, schedule=schedule,
                                 cp_comm=comm, cp_a2a_size=u)
            fits.append(Candidate(dp, pp, tp, b, m, sp, rc, chunks, memory, time, zero, cp, ep,
                                  schedule, comm, u, layout))
    fits.sort(key=lambda c: c.time.total)
    return Plan(cluster, fits, tried)
