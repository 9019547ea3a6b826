"""A mixture of experts in the model: total and active parameters, FLOPs from the active
ones, published configurations, what expert parallelism costs against tensor
parallelism, and the planner's step time with ep.

Every number here is a MODEL. A token uses the dense parameters and k of the E experts
of every MoE layer: its *active* parameters set the FLOPs (≈ 6 per active parameter
per token for training, Kaplan et al. 2020 §2.1), while *all* of them set the memory.
The all-to-all bytes are in `minitp.calc.network.comm` (`moe_all_to_all_bytes`); the cross-node
share of them under node-limited routing is `node_limited_bytes` here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import comb

from ...rules import check_expert_parallel
from ..counts.flops import layer_matrix_flops
from ..counts.params import (
    exact_param_count,
    expert_mlp_params,
    expert_params_per_stage,
    params_per_stage,
)
from ..network.cluster import Cluster
from ..network.comm import moe_all_to_all_bytes, ring_wire_bytes
from ..planning.timing import ContextParallelStepTime, microbatch_count, schedule_bubble, step_time


@dataclass(frozen=True)
class MoEShape:
    """A published mixture of experts, as far as parameters and FLOPs need it.
    ``attention_params`` and ``norm_params``: per layer; ``qk_width``/``v_width``: heads ×
    head size of QKᵀ and of ·V (the attention FLOPs); ``seq_len``: the training context."""

    name: str
    n_layer: int
    d_model: int
    vocab: int
    n_experts: int
    top_k: int
    expert_hidden: int
    shared_experts: int
    dense_layers: int  # the first layers, with a dense MLP of dense_hidden
    dense_hidden: int
    attention_params: int
    norm_params: int
    seq_len: int
    qk_width: int
    v_width: int
    published_total: float
    published_active: float
    source: str
    glu: bool = True  # 3 matrices per MLP (SwiGLU), else 2
    tied_embedding: bool = False


MIXTRAL_8X7B = MoEShape(
    "Mixtral 8x7B", n_layer=32, d_model=4096, vocab=32000, n_experts=8, top_k=2,
    expert_hidden=14336, shared_experts=0, dense_layers=0, dense_hidden=0,
    attention_params=2 * 4096 * 4096 + 2 * 4096 * 8 * 128,  # wq, wo; wk, wv: 8 KV heads of 128
    norm_params=2 * 4096, seq_len=32768, qk_width=32 * 128, v_width=32 * 128,
    published_total=47e9, published_active=13e9,
    source="Jiang et al. 2024, 'Mixtral of Experts' (arXiv 2401.04088): Table 1 (dim 4096, "
           "n_layers 32, head_dim 128, hidden_dim 14336, n_heads 32, n_kv_heads 8, "
           "context_len 32768, vocab_size 32000, num_experts 8, top_k_experts 2); §2: 'each "
           "token has access to 47B parameters, but only uses 13B active parameters'. "
           "Mistral AI's announcement (11 Dec 2023) states 46.7B and 12.9B: not verified "
           "here, not used. RMSNorm weights, no biases; output layer untied.")

_MLA = (1536 * 7168 + 128 * 128 * 1536 + 128 * 64 * 1536  # W^DQ, W^UQ, W^QR
        + 512 * 7168 + 2 * 128 * 128 * 512 + 64 * 7168  # W^DKV, W^UK, W^UV, W^KR
        + 7168 * 128 * 128 + 1536 + 512)  # W^O; RMSNorms of the two latents

DEEPSEEK_V3 = MoEShape(
    "DeepSeek-V3", n_layer=61, d_model=7168, vocab=129280, n_experts=256, top_k=8,
    expert_hidden=2048, shared_experts=1, dense_layers=3, dense_hidden=18432,
    attention_params=_MLA, norm_params=2 * 7168, seq_len=4096,
    qk_width=128 * (128 + 64), v_width=128 * 128, published_total=671e9, published_active=37e9,
    source="DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437): §4.2 "
           "(61 layers, hidden 7168; MLA with 128 heads of 128, d_c 512, d_c' 1536, "
           "d_h^R 64, equations of §2.1.1; every FFN but the first 3 layers MoE, 1 shared + "
           "256 routed experts of intermediate 2048, 8 activated; 671B total, 37B "
           "activated; 4K sequence in pre-training). Vocabulary 129280 and the dense "
           "layers' intermediate 18432: deepseek-ai/DeepSeek-V3 inference/configs/"
           "config_671B.json, read in public copies of it (the report says '128K'). The "
           "671B leaves out the 14B multi-token-prediction module (the repository's README); "
           "its README_WEIGHTS.md gives 36.6B activated, counting the output head but not "
           "the input embedding. The router's balancing bias (256 per layer) is left out.")

PRESETS = {"mixtral-8x7b": MIXTRAL_8X7B, "deepseek-v3": DEEPSEEK_V3}


def _mlp(shape: MoEShape, hidden: int) -> int:
    return (3 if shape.glu else 2) * shape.d_model * hidden


def moe_params_of(shape: MoEShape) -> dict:
    """Parameters of a published shape: ``{"total", "active", "experts", "dense"}``.
    A MoE layer: attention, norms, router d·E, shared experts and E routed experts; a
    dense layer: attention, norms and one MLP of ``dense_hidden``; plus the embedding
    (twice when untied) and the final norm (d). Active: dense + k experts per MoE layer."""
    d, moe_layers = shape.d_model, shape.n_layer - shape.dense_layers
    expert = _mlp(shape, shape.expert_hidden)
    per_layer = shape.attention_params + shape.norm_params
    dense = (shape.n_layer * per_layer + shape.dense_layers * _mlp(shape, shape.dense_hidden)
             + moe_layers * (d * shape.n_experts + shape.shared_experts * expert)
             + shape.vocab * d * (1 if shape.tied_embedding else 2) + d)
    experts = moe_layers * shape.n_experts * expert
    return {"total": dense + experts, "active": dense + moe_layers * shape.top_k * expert,
            "experts": experts, "dense": dense}


def moe_params(cfg) -> dict:
    """minitp's `GPT(cfg)` with ``cfg.n_experts`` > 0: ``{"total", "active", "experts",
    "dense"}``. "experts": every routed expert (E h→4h→h MLPs per MoE layer); "dense":
    the rest (attention, LayerNorms, embeddings — the output layer tied, counted once —,
    routers, shared experts); "active": what one token uses, dense + k experts per MoE
    layer."""
    if not getattr(cfg, "n_experts", 0):
        raise ValueError("moe_params needs a mixture of experts (n_experts > 0)")
    total = exact_param_count(cfg)
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layer))
    experts = expert_params_per_stage(cfg)[0]
    dense = total - experts
    return {"total": total, "active": dense + moe_layers * cfg.top_k * expert_mlp_params(cfg),
            "experts": experts, "dense": dense}


def moe_flops_per_token(cfg_or_shape) -> int:
    """Training FLOPs per token (forward + backward): 6·N_active (Kaplan et al. 2020's
    C ≈ 6N, with the active parameters) plus attention's 6·l·s·(QKᵀ width + ·V width) —
    Korthikanti et al. 2022 Eq. 7's 12·l·s·h per token for a GPT (the whole s², no
    causal saving). Unlike `model_flops` it counts embeddings, biases and norms as if
    they were matrices (6 per parameter): a few per cent more at these sizes."""
    if isinstance(cfg_or_shape, MoEShape):
        s = cfg_or_shape
        attention = 6 * s.n_layer * s.seq_len * (s.qk_width + s.v_width)
        return 6 * moe_params_of(s)["active"] + attention
    cfg = cfg_or_shape
    return 6 * moe_params(cfg)["active"] + 12 * cfg.n_layer * cfg.seq_len * cfg.d_model


def ep_vs_tp(shape: MoEShape, tokens: int, n: int, cluster: Cluster,
             bytes_per_element: int = 2) -> dict:
    """MODEL: one MoE layer's experts shared by n ranks, per training step per rank.

    * ``"ep"``: expert parallelism, E/n whole experts per rank. Each rank routes its own
      ``tokens`` tokens; dispatch and combine all-to-alls forward, the same two backward,
      and the counts (`moe_all_to_all_bytes`). Time: an all-to-all of S bytes over n as
      n−1 pairwise steps of α + S/(nβ) (the α–β of a ring all-gather of S).
    * ``"tp"``: every expert split over the n ranks as Megatron-LM splits an MLP (fc by
      columns, proj by rows). The n ranks hold the same tokens, all n·tokens of them
      (the same batch as under ep), and the layer's output is all-reduced forward, its
      gradient backward: 2 all-reduces of n·tokens·d values (ring: 2(n−1)/n each).
    Both hold the same expert weights per rank (1/n of them). Assumed: uniform routing,
    nothing dropped, no overlap with compute, the n ranks inside one node when n fits.
    ``"ratio"``: tp bytes / ep bytes (n/k for large token counts: ep wins when k < n)."""
    d, k, E = shape.d_model, shape.top_k, shape.n_experts
    ep = moe_all_to_all_bytes(tokens, k, d, n, bytes_per_element, E)
    a2a = cluster.collective_seconds("all_gather", tokens * k * d * bytes_per_element, n, n)
    table = cluster.collective_seconds("all_gather", E * 8, n, n)
    activation = n * tokens * d * bytes_per_element
    tp_bytes = 2 * ring_wire_bytes("all_reduce", activation, n)
    tp_time = 2 * cluster.collective_seconds("all_reduce", activation, n, n)
    return {"ep": {"bytes": ep["per_layer_step"], "seconds": 4 * a2a + table},
            "tp": {"bytes": tp_bytes, "seconds": tp_time},
            "ratio": tp_bytes / ep["per_layer_step"] if ep["per_layer_step"] else float("inf")}


def node_limited_bytes(tokens: int, top_k: int, d: int, n_experts: int, nodes: int,
                       max_nodes: int | None = None, per_node: bool = True,
                       bytes_per_element: int = 2) -> dict:
    """MODEL: the bytes one rank sends *across nodes* (InfiniBand) for one MoE layer per
    training step (dispatch and combine, forward and backward: 4 all-to-alls), with the
    ``n_experts`` experts spread evenly over ``nodes`` nodes and each of the rank's
    ``tokens`` tokens routed to ``top_k`` of them.

    ``max_nodes`` = M: DeepSeek-V3's node-limited routing (arXiv 2412.19437 §2.1.2: a
    token's experts lie on at most M nodes, those whose best experts score highest; M = 4
    of the 8 nodes its 64-way EP spans, §3.2.2). None: unrestricted top-k.
    ``per_node``: how a token crosses. False: one row per remote expert, as a plain
    all-to-all (and minitp) sends it. True: one copy per remote node, fanned out to the
    experts there over NVLink (§3.2.2: by IB to the GPU of the same in-node index, then
    NVLink); only then does M bound the cross-node bytes, to M copies of a token whatever k.

    Assumed (uniform routing): the M nodes are any M of the N alike, the token's own
    included, and its k experts any k of those nodes' experts alike. Expected nodes used:
    m·(1 − C((m−1)e, k)/C(me, k)) with m = M (or N) and e = E/N experts a node; a used
    node is the token's own with chance 1/N. Returns ``{"rows"``: expected cross-node
    copies of a token, ``"at_most"``: the most one token can need, ``"bytes"``: the
    expected bytes of the 4 all-to-alls``}``."""
    m = nodes if max_nodes is None else max_nodes
    if n_experts % nodes or not 1 <= m <= nodes:
        raise ValueError(f"need E ({n_experts}) divisible by nodes ({nodes}) and "
                         f"1 <= max_nodes ({max_nodes}) <= nodes")
    e = n_experts // nodes
    if top_k > m * e:
        raise ValueError(f"top_k ({top_k}) is more than the {m * e} experts on {m} nodes")
    remote = (nodes - 1) / nodes
    if per_node:
        used = m * (1 - comb((m - 1) * e, top_k) / comb(m * e, top_k))
        rows, at_most = used * remote, min(top_k, m, nodes - 1)
    else:
        rows, at_most = top_k * remote, min(top_k, (nodes - 1) * e)
    return {"rows": rows, "at_most": at_most,
            "bytes": 4 * tokens * rows * d * bytes_per_element}


@dataclass(frozen=True)
class MoEStepTime(ContextParallelStepTime):
    """A `StepTime` with expert parallelism's all-to-alls ("ep"; "cp" 0 without cp)."""

    ep: float = 0.0


def moe_step_time(cfg, cluster: Cluster, dp: int = 1, pp: int = 1, tp: int = 1,
                  micro_batch: int = 1, global_batch: int | None = None, sp: bool = False,
                  recompute=None, virtual: int = 1, efficiency: float = 0.5,
                  bytes_per_value: int = 2, grad_bytes: int = 2, zero_stage: int = 0,
                  cp: int = 1, ep: int = 1, schedule=None, cp_comm: str = "ring",
                  cp_a2a_size: int | None = None):
    """`step_time` with a mixture of experts: for a dense config exactly `step_time`
    (context parallelism's attention, `cp_comm`, priced there).
    For an MoE config, on top of it (MODEL, nothing overlapped):

    * compute: without sequence parallelism the tp ranks hold the same tokens and each
      runs the same experts on them (minitp does not split experts over tp), so the
      routed experts' FLOPs are (tp − 1) times more than `step_time` shares out;
    * dp: the dense gradients all-reduced over dp·cp, the E/ep experts' over the
      dp·cp/ep ranks holding the same ones (with ZeRO, each layer's experts a unit over
      those ranks, as minitp shards them);
    * ep: per microbatch and MoE layer of the busiest stage, 4 all-to-alls of the
      rank's b·s/cp (/tp under sp) tokens·k rows (6 with full recomputation) and one
      counts exchange (2), each n−1 steps of α + S/(ep·β) over a group of tp·cp·ep
      consecutive ranks' span; and the bubble grows with the busy time.
    """
    args = (cfg, cluster, dp, pp, tp, micro_batch, global_batch, sp, recompute, virtual,
            efficiency, bytes_per_value, grad_bytes, zero_stage, cp, schedule)
    base = step_time(*args, cp_comm=cp_comm, cp_a2a_size=cp_a2a_size)
    if not getattr(cfg, "n_experts", 0):
        return base
    check_expert_parallel(cfg, ep, dp, cp)
    m = microbatch_count(global_batch or dp * micro_batch, dp, micro_batch)
    n_gpus, speed = dp * pp * cp * tp, cluster.peak_flops * efficiency
    passes = 4 if recompute == "full" else 3
    extra = 0.0
    if tp > 1 and not sp:
        batch = global_batch or dp * micro_batch
        expert_flops = passes * batch * cfg.seq_len * layer_matrix_flops(cfg, experts_only=True)
        extra = (tp - 1) * expert_flops / n_gpus / speed
    held = params_per_stage(cfg, tp, pp, ep)
    stage = held.index(max(held))
    experts = expert_params_per_stage(cfg, pp, ep)[stage]
    span = tp * cp * dp
    dp_time = base.dp
    if ep > 1:
        dp_time = (cluster.collective_seconds("all_reduce", (held[stage] - experts) * grad_bytes,
                                              dp * cp, span)
                   + cluster.collective_seconds("all_reduce", experts * grad_bytes,
                                                dp * cp // ep, span))
    ep_time = 0.0
    if ep > 1:
        per = cfg.n_layer // pp
        layers = max(sum(cfg.is_moe_layer(i) for i in range(k * per, (k + 1) * per))
                     for k in range(pp))
        tokens = micro_batch * (cfg.seq_len // cp) // (tp if sp else 1)
        rows = tokens * cfg.top_k * cfg.d_model * bytes_per_value
        a2a = cluster.collective_seconds("all_gather", rows, ep, tp * cp * ep)
        table = cluster.collective_seconds("all_gather", cfg.n_experts * 8, ep, tp * cp * ep)
        repeat = 2 if recompute == "full" else 1
        ep_time = m * layers * ((4 + 2 * (repeat - 1)) * a2a + repeat * table)
    parts = {f.name: getattr(base, f.name) for f in fields(base)}
    busy = parts["compute"] + parts["tp"] + parts["pp"] + parts.get("cp", 0.0)
    fraction = schedule_bubble(pp, m, virtual, schedule, recompute)
    parts.update(compute=parts["compute"] + extra, dp=dp_time, ep=ep_time,
                 bubble=(busy + extra + ep_time) * fraction)
    return MoEStepTime(**parts)
