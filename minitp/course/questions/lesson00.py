"""Lesson 00's questions: how many nodes one replica spans, and why tp is the fastest index."""

from __future__ import annotations

from .form import Question, Wrong

GPUS_PER_NODE = 8  # a DGX node (DGX H100 and A100 datasheets: 8 GPUs)


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
            f"(tp fastest, then dp, then pp: lesson 12), so its {p['pp']} stages are "
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
                        f"({p['dp']}, {p['pp']}, {p['tp']}), one GPU per rank, ranks in order "
                        "node by node (ranks 0 to 7 on node 0, and so on), tp fastest, then "
                        "dp, then pp. How many nodes does one data-parallel replica (one whole "
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


def why_tp_fastest(seed=None) -> Question:
    return Question(
        key="00.why-tp-fastest", seed=seed, draw=lambda rng: {}, kind="choice",
        text=lambda p: ("Megatron-LM numbers the ranks of a (dp, pp, tp) mesh with the "
                        "tensor-parallel index fastest, so a tensor-parallel group is a run of "
                        "adjacent ranks, on one node. Why that axis? (a) its collectives run "
                        "inside every layer, forward and backward, so they need the fastest "
                        "links; (b) the pipeline's messages are the largest; (c) the "
                        "data-parallel all-reduce runs after every layer; (d) the order makes "
                        "no difference to speed."),
        right=lambda p: "a",
        wrong=[
            Wrong(lambda p: "b", "the pipeline sends one activation per microbatch between "
                                 "neighbouring stages: the least traffic of the three axes"),
            Wrong(lambda p: "c", "the data-parallel gradients are summed once per step (in "
                                 "buckets that overlap backward), not after every layer"),
            Wrong(lambda p: "d", "it does: NVLink inside a node is an order of magnitude "
                                 "faster than the network between nodes"),
        ],
        worked=lambda p: (
            "tensor parallelism all-reduces (or all-gathers and reduce-scatters) an activation "
            "in every layer, twice forward and twice backward (lesson 03), on the critical "
            "path; the pipeline and data parallelism move far less, less often. So tp takes "
            "the fastest links: adjacent ranks, one node (Narayanan et al. 2021, Takeaway 1)."),
    )


QUESTIONS = {"00.replica-nodes": replica_nodes, "00.why-tp-fastest": why_tp_fastest}
