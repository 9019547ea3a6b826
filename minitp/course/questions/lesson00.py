"""Lesson 00's questions: how many nodes one replica spans, and how many a tensor-parallel
group would span if tp were not the fastest index."""

from __future__ import annotations

from .form import Question, Wrong

GPUS_PER_NODE = 8  # a DGX node (DGX H100 and A100 datasheets: 8 GPUs)
PLACED = ("one GPU per rank, ranks in order node by node (ranks 0 to 7 on node 0, and so "
          "on)")


def replica_ranks(p) -> list[int]:
    """The ranks of the replica holding rank 0 (data-parallel index 0): stage s, tensor
    index t is rank (s·dp + 0)·tp + t (tp fastest, then dp, then pp)."""
    return [s * p["dp"] * p["tp"] + t for s in range(p["pp"]) for t in range(p["tp"])]


def replica_node_count(p) -> int:
    return len({rank // GPUS_PER_NODE for rank in replica_ranks(p)})


def _distinct(q: Question) -> Question:
    """Keep only the mistakes whose value differs from the right answer and from every
    mistake kept before it: in some meshes a usual reasoning happens to give the right
    number (a node per stage, when the stages are a node or more apart), and then it is
    no mistake."""
    kept = [q.right(q.params)]
    wrong = []
    for mistake in q.wrong:
        value = mistake.value(q.params)
        if value not in kept:
            wrong.append(mistake)
            kept.append(value)
    q.wrong = wrong
    return q


def replica_nodes(seed=None) -> Question:
    def draw(rng):
        tp, pp = rng.choice(((2, 4), (2, 8), (4, 4), (4, 8)))
        return {"tp": tp, "pp": pp, "dp": rng.choice((2, 3, 6, 12))}

    def worked(p):
        ranks, apart = replica_ranks(p), p["dp"] * p["tp"]
        nodes = sorted({rank // GPUS_PER_NODE for rank in ranks})
        how = (f"{apart} ≥ {GPUS_PER_NODE}: every stage lands on a node of its own"
               if apart >= GPUS_PER_NODE else
               f"{apart} < {GPUS_PER_NODE}: consecutive stages share nodes, with other "
               "replicas' ranks between them")
        return (
            f"stage s, tensor index t of the replica holding rank 0 is rank s·dp·tp + t "
            f"(tp fastest, then dp, then pp; ahead: lesson 13), so its {p['pp']} stages are "
            f"dp·tp = {p['dp']}·{p['tp']} = {apart} ranks apart, not side by side: ranks "
            f"{ranks}. Rank r sits on node r // {GPUS_PER_NODE}, so they are on nodes "
            f"{nodes}: {len(nodes)} node(s). Here {how}. The replica's "
            f"{p['pp'] * p['tp']} GPUs would fill {-(-p['pp'] * p['tp'] // GPUS_PER_NODE)} "
            "node(s) only if its ranks were one contiguous block; they interleave with the "
            "other replicas' along dp (`mt.layout(dp=..., pp=..., tp=...)['pp']` lists a "
            "replica's stages).")

    return _distinct(Question(
        key="00.replica-nodes", seed=seed, draw=draw,
        text=lambda p: (f"A run on nodes of {GPUS_PER_NODE} GPUs uses the mesh (dp, pp, tp) = "
                        f"({p['dp']}, {p['pp']}, {p['tp']}), {PLACED}, tp fastest, then dp, "
                        "then pp. How many nodes does one data-parallel replica (one whole "
                        "copy of the model: its pp stages of tp ranks; take the one holding "
                        "rank 0) span? (A whole number.)"),
        right=replica_node_count,
        wrong=[
            Wrong(lambda p: -(-p["tp"] * p["pp"] // GPUS_PER_NODE),
                  "that is the replica's pp·tp GPUs packed into whole nodes, as if its ranks "
                  "were one contiguous block; with tp fastest, then dp, its stages are dp·tp "
                  "ranks apart, interleaved with the other replicas'"),
            Wrong(lambda p: p["pp"], "that counts a node per stage: true only when the stages "
                                     "are a node or more apart (dp·tp ≥ 8); here dp·tp is "
                                     "less, and consecutive stages share a node"),
            Wrong(lambda p: p["dp"] * p["pp"] * p["tp"] // GPUS_PER_NODE,
                  "that is the whole job's nodes: every replica, not one"),
            Wrong(lambda p: p["tp"] * p["pp"], "that is the replica's GPUs, not its nodes"),
        ],
        worked=worked,
    ))


def dp_fastest_tp_group(p) -> list[int]:
    """The tensor-parallel group holding rank p["rank"] if dp were the fastest index:
    r = stage·dp·tp + t·dp + d, so the group's ranks are dp apart."""
    dp, tp, rank = p["dp"], p["tp"], p["rank"]
    stage, d = rank // (dp * tp), rank % dp
    return [stage * dp * tp + t * dp + d for t in range(tp)]


def tp_group_nodes(p) -> int:
    return len({rank // GPUS_PER_NODE for rank in dp_fastest_tp_group(p)})


# How a count of the nodes a dp-fastest tp group spans usually goes wrong, and why.
NODE_COUNT_SLIPS = (
    (lambda p: -(-((p["tp"] - 1) * p["dp"] + 1) // GPUS_PER_NODE),
     "the group's span, (tp-1)·dp + 1 ranks, packed into whole nodes from a node's first rank; "
     "the span starts where the group's first rank sits, and can straddle one boundary more"),
    (lambda p: p["tp"], "a node per rank, true only when the ranks are a node or more apart "
                        "(dp ≥ 8); here neighbours in the group can share a node"),
    (lambda p: -(-p["dp"] * p["tp"] // GPUS_PER_NODE),
     "the nodes of the whole stage's dp·tp ranks, not of one group's"),
)


def _slip(p):
    """The first usual miscount that differs from the right count and from 1."""
    return next(((f(p), says) for f, says in NODE_COUNT_SLIPS
                 if f(p) not in (1, tp_group_nodes(p))), None)


def why_tp_fastest(seed=None) -> Question:
    def draw(rng):
        while True:  # a group that leaves its node, and a miscount to set beside the count
            p = {"tp": rng.choice((2, 4, 8)), "dp": rng.choice((3, 4, 6, 12)),
                 "pp": rng.choice((2, 4))}
            p["rank"] = rng.randrange(p["dp"] * p["pp"] * p["tp"])
            order = list(range(4))
            rng.shuffle(order)  # where each kind of answer sits among (a)-(d)
            p["order"] = order
            if tp_group_nodes(p) > 1 and _slip(p):
                return p

    def options(p):
        tp_first = (f"tp fastest: the tensor-parallel group holding rank {p['rank']} sits on 1 "
                    "node, where dp fastest would spread it over {} nodes, and tensor "
                    "parallelism's collectives run in every layer")
        return [tp_first.format(tp_group_nodes(p)), tp_first.format(_slip(p)[0]),
                "dp fastest: it keeps each data-parallel group on adjacent ranks, and the "
                "gradients' all-reduce is the largest message",
                f"either: the tensor-parallel group holding rank {p['rank']} spans as many "
                "nodes under both orders"]

    def letter(p, kind):
        return "abcd"[p["order"].index(kind)]

    def worked(p):
        group, dp, tp = dp_fastest_tp_group(p), p["dp"], p["tp"]
        nodes = sorted({rank // GPUS_PER_NODE for rank in group})
        stage, d = p["rank"] // (dp * tp), p["rank"] % dp
        t = (p["rank"] // dp) % tp
        megatron = [(stage * dp + d) * tp + k for k in range(tp)]
        return (
            f"({letter(p, 0)}). Dp fastest: rank {p['rank']} is d = {p['rank']} mod {dp} = {d}, "
            f"t = ({p['rank']} // {dp}) mod {tp} = {t}, stage {p['rank']} // (dp·tp) = {stage}. "
            f"Its tensor-parallel group keeps the stage and d and runs t over 0..{tp - 1}: ranks "
            f"{stage}·{dp * tp} + t·{dp} + {d} = {group}, {dp} apart, on nodes {nodes} "
            f"(rank // {GPUS_PER_NODE}): {len(nodes)} nodes. With tp fastest the same group "
            f"is ranks {megatron}, adjacent, on one node. Tensor parallelism sums an activation "
            "in every layer, forward and backward (twice each way; ahead: lesson 03); data "
            "parallelism once a step, the pipeline one activation per microbatch between "
            "neighbours. So "
            "the order that keeps tp's group inside a node (NVLink) is the one that makes the "
            "least traffic cross the slower links between nodes (Narayanan et al. 2021, "
            "Takeaway 1: tensor parallelism within a node). `mt.layout(dp=tp, pp=pp, tp=dp)"
            "['dp']` lists these groups: the names swapped, tp becomes the middle index.")

    def text(p):
        return ("Megatron-LM numbers a (dp, pp, tp) mesh's ranks with the tensor-parallel "
                "index fastest (this lesson's rank formula); a launcher could put the "
                "data-parallel index fastest instead: r = stage·(dp·tp) + t·dp + d, for tensor "
                f"index t and data-parallel index d. The run has (dp, pp, tp) = ({p['dp']}, "
                f"{p['pp']}, {p['tp']}), {GPUS_PER_NODE} GPUs a node, {PLACED}. Which order "
                "should it use, and why? Work out where each order puts the tensor-parallel "
                f"group that holds rank {p['rank']}. "
                + "; ".join(f"({'abcd'[k]}) {options(p)[p['order'][k]]}" for k in range(4))
                + ".")

    q = Question(
        key="00.why-tp-fastest", seed=seed, draw=draw, text=text, kind="choice",
        right=lambda p: letter(p, 0),
        wrong=[
            Wrong(lambda p: letter(p, 2),
                  "data parallelism sums the gradients once a step, in buckets that overlap "
                  "backward; tensor parallelism sums activations in every layer, forward and "
                  "backward, and needs the fast links more"),
            Wrong(lambda p: letter(p, 3),
                  "tp fastest puts the group on adjacent ranks, one node; dp fastest puts its "
                  "ranks dp apart, across nodes"),
        ],
        worked=worked,
    )
    # the miscounted option's diagnosis depends on which slip it is, known once drawn
    q.wrong.insert(0, Wrong(lambda p: letter(p, 1), "the order is right, the count is not: "
                                                     f"{_slip(q.params)[1]}"))
    return q


QUESTIONS = {"00.replica-nodes": replica_nodes, "00.why-tp-fastest": why_tp_fastest}
