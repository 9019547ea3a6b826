"""A two-level network, a MODEL: NVLink inside a node, InfiniBand between nodes.

A `Cluster` already says what each level gives one GPU (``intra_*`` and ``inter_*``
α and β, per direction; DGX H100 and DGX B200 with their sources in `cluster`). Here
collectives learn which level their bytes travel on.

* **A flat ring over GPUs of several nodes** (as NCCL runs one): its data is split over
  g = ``gpus_per_node`` channels, each a ring in node order that leaves every node
  through a different GPU's NIC. So of the (n−1)/n·S a GPU sends in an all-gather or a
  reduce-scatter of S bytes, 1/g crosses the node boundary (over its own NIC) and the
  rest stays on NVLink; the whole cluster puts nodes·(n−1)/n·S across boundaries, the
  same as one ring in rank order would. Time: n−1 steps, each as slow as the slower of
  the NIC's share (S/(g·n) at β_inter) and NVLink's (S/n·(g−1)/g at β_intra).
* **A hierarchical all-reduce**: reduce-scatter inside each node (g GPUs), all-reduce
  of each GPU's S/g across the nodes (g independent rings, one per GPU position, each on
  its own NIC), all-gather inside. Across nodes a GPU sends 2(k−1)/k·S/g for k nodes.
* **FSDP against HSDP** (`dp_step`): FSDP (ZeRO-3) shards over all n GPUs: per
  microbatch two all-gathers of the parameters and one reduce-scatter of the gradients,
  every one a flat ring across nodes. HSDP shards over the g GPUs of a node and
  replicates across nodes: its gathers and reduce-scatters stay inside the node, and
  once per step (torch: `set_requires_all_reduce(False)` on every microbatch but the
  last) each GPU all-reduces its S/g gradient shard with its peers on the other nodes.
  The price: each GPU keeps 1/g of the model states, not 1/n.

Ranks are laid out as `minitp.Mesh` lays them out (tp fastest, then cp, ep, dp, pp),
so `axis_levels` can say, for every axis, whether its groups stay inside a node, cross
only between nodes (one GPU per node), or span both (a flat ring across nodes, or a
hierarchical collective).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cluster
from .comm import ring_wire_bytes

INSIDE, ACROSS, BOTH = "inside a node", "across nodes", "both levels"
STRATEGIES = ("ddp", "fsdp", "hsdp")
STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}


@dataclass(frozen=True)
class LevelCost:
    """One collective (or one level of a hierarchical one), a MODEL: the bytes each GPU
    sends inside its node and across the node boundary, and the seconds it takes."""

    op: str
    ranks: int
    level: str
    inside: float  # bytes each GPU sends over NVLink
    across: float  # bytes each GPU sends over its NIC
    seconds: float


def node_count(cluster: Cluster, n_gpus: int) -> int:
    """How many nodes ``n_gpus`` consecutive GPUs fill (whole nodes, or part of one)."""
    g = cluster.gpus_per_node
    if n_gpus < 1 or (n_gpus > g and n_gpus % g):
        raise ValueError(f"n_gpus={n_gpus} must fill whole nodes of {g} GPUs (or fit in one)")
    return max(1, n_gpus // g)


def _ring_seconds(steps: int, alpha: float, seconds_per_step: float) -> float:
    return steps * (alpha + seconds_per_step)


def collective(cluster: Cluster, op: str, nbytes: float, n_gpus: int,
               hierarchical: bool = False) -> tuple[LevelCost, ...]:
    """A ring ``op`` ("all_reduce", "all_gather", "reduce_scatter") on a tensor of
    ``nbytes`` over ``n_gpus`` consecutive GPUs: one `LevelCost` inside a node or for a
    flat ring across nodes, or each level of the hierarchical form (``hierarchical``)."""
    if op not in STEPS:
        raise ValueError(f"op must be one of {sorted(STEPS)}, got {op!r}")
    g, nodes = cluster.gpus_per_node, node_count(cluster, n_gpus)
    sent = float(ring_wire_bytes(op, nbytes, n_gpus))
    steps = STEPS[op] * (n_gpus - 1)
    if nodes == 1:
        return (LevelCost(op, n_gpus, INSIDE, sent, 0.0, _ring_seconds(
            steps, cluster.intra_latency, nbytes / n_gpus / cluster.intra_bandwidth)),)
    if not hierarchical:
        per_step = max(nbytes / (g * n_gpus) / cluster.inter_bandwidth,
                       nbytes / n_gpus * (g - 1) / g / cluster.intra_bandwidth)
        return (LevelCost(op, n_gpus, BOTH, sent * (g - 1) / g, sent / g,
                          _ring_seconds(steps, cluster.inter_latency, per_step)),)
    inner = {"all_reduce": ("reduce_scatter", "all_gather"),
             "all_gather": (None, "all_gather"), "reduce_scatter": ("reduce_scatter", None)}[op]
    first, last = (_inside(cluster, o, nbytes) if o else () for o in inner)
    across = float(ring_wire_bytes(op, nbytes / g, nodes))
    middle = LevelCost(op, nodes, ACROSS, 0.0, across, _ring_seconds(
        STEPS[op] * (nodes - 1), cluster.inter_latency,
        nbytes / g / nodes / cluster.inter_bandwidth))
    return (*first, middle, *last)


def _inside(cluster: Cluster, op: str, nbytes: float) -> tuple[LevelCost]:
    return collective(cluster, op, nbytes, cluster.gpus_per_node)


@dataclass(frozen=True)
class DPStep:
    """Data parallelism's collectives in one step on a two-level network (MODEL)."""

    strategy: str
    n_gpus: int
    nodes: int
    shards: int  # the model states are divided by this many GPUs
    parts: tuple[LevelCost, ...]

    @property
    def inside(self) -> float:
        """Bytes each GPU sends over NVLink per step."""
        return sum(p.inside for p in self.parts)

    @property
    def across(self) -> float:
        """Bytes each GPU sends over its NIC per step."""
        return sum(p.across for p in self.parts)

    @property
    def crossing(self) -> float:
        """Bytes that cross node boundaries per step, the whole cluster together."""
        return self.across * self.n_gpus

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)


def dp_step(cluster: Cluster, n_params: int, n_gpus: int, strategy: str,
            microbatches: int = 1, units: int = 1, bytes_per_value: int = 2,
            grad_bytes: int = 2) -> DPStep:
    """The data-parallel collectives of one step of ``strategy`` over ``n_gpus``:
    "ddp" (one all-reduce of the gradients, a flat ring), "fsdp" (per microbatch two
    all-gathers of the parameters and a reduce-scatter of the gradients, flat rings over
    every GPU) or "hsdp" (the same inside each node, then one all-reduce of each GPU's
    gradient shard across the nodes). ``units``: FSDP's wrapped modules (a layer each),
    every collective made once per unit on its 1/units of the model, so the latency
    terms count units times (ddp: one bucket). A MODEL: ring bytes, α–β time, nothing
    overlapped."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if microbatches < 1 or units < 1:
        raise ValueError(f"microbatches and units must be at least 1, got {microbatches}, "
                         f"{units}")
    nodes, g = node_count(cluster, n_gpus), min(cluster.gpus_per_node, n_gpus)
    params, grads = n_params * bytes_per_value / units, n_params * grad_bytes / units
    if strategy == "ddp":
        return DPStep(strategy, n_gpus, nodes, 1, _times(collective(
            cluster, "all_reduce", grads * units, n_gpus), 1))
    shard_over = n_gpus if strategy == "fsdp" else g
    one = (*collective(cluster, "all_gather", params, shard_over),
           *collective(cluster, "all_gather", params, shard_over),
           *collective(cluster, "reduce_scatter", grads, shard_over))
    parts = _times(one, microbatches * units)
    if strategy == "hsdp" and nodes > 1:
        across = collective(cluster, "all_reduce", grads, n_gpus, hierarchical=True)[1:2]
        parts += _times(across, units)
    return DPStep(strategy, n_gpus, nodes, shard_over, parts)


def _times(parts: tuple[LevelCost, ...], k: int) -> tuple[LevelCost, ...]:
    """``parts`` made ``k`` times: one LevelCost each, its bytes and seconds × k."""
    return tuple(LevelCost(p.op, p.ranks, p.level, p.inside * k, p.across * k,
                           p.seconds * k) for p in parts)


def crossing_ratio(n_gpus: int, gpus_per_node: int, microbatches: int = 1) -> float:
    """FSDP's bytes across node boundaries over HSDP's, parameters and gradients of one
    size (the MODEL of `dp_step`): 3m·k(n−1)/n against 2(k−1), for k nodes of g GPUs.
    At least 1.5m as k grows; 2.25 at two nodes of two."""
    nodes = n_gpus // gpus_per_node
    if nodes < 2 or n_gpus % gpus_per_node:
        raise ValueError(f"{n_gpus} GPUs in nodes of {gpus_per_node}: need two whole nodes or more")
    return 3 * microbatches * nodes * (n_gpus - 1) / n_gpus / (2 * (nodes - 1))


ORDER = ("tp", "cp", "ep", "dp", "pp")  # fastest first, as `minitp.Mesh` lays ranks out


def axis_levels(cluster: Cluster, **sizes: int) -> dict[str, str]:
    """Which level each axis of size > 1 uses: its groups are ``size`` ranks, ``stride``
    apart (the product of the faster axes'). INSIDE when a group fits in a node
    (stride·size ≤ g), ACROSS when each member is on its own node (stride a multiple of
    g), else BOTH (g/stride members per node: a flat ring across nodes, or hierarchical).
    ep is counted inside dp·cp (it divides it), so it takes no place of its own."""
    unknown = set(sizes) - set(ORDER)
    if unknown:
        raise ValueError(f"unknown axes {sorted(unknown)}; the axes are {ORDER}")
    g, stride, levels = cluster.gpus_per_node, 1, {}
    for axis in ORDER:
        size = sizes.get(axis, 1)
        if size > 1:
            if stride * size <= g:
                levels[axis] = INSIDE
            elif stride % g == 0:
                levels[axis] = ACROSS
            else:
                levels[axis] = BOTH
        if axis != "ep":
            stride *= size
    return levels
