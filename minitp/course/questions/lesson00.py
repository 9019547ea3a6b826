"""Lesson 00's questions: how many nodes one replica spans, and why tp is the fastest index."""

from __future__ import annotations

from .form import Question, Wrong

GPUS_PER_NODE = 8  # a DGX node (DGX H100 and A100 datasheets: 8 GPUs)


def replica_nodes(seed=None) -> Question:
    def draw(rng):
        tp, pp = rng.choice(((2, 4), (2, 8), (4, 4), (4, 8)))
        return {"tp": tp, "pp": pp, "dp": rng.choice((3, 6, 12))}  # no two answers coincide

    return Question(
        key="00.replica-nodes", seed=seed, draw=draw,
        text=lambda p: (f"A run on nodes of {GPUS_PER_NODE} GPUs uses the mesh (dp, pp, tp) = "
                        f"({p['dp']}, {p['pp']}, {p['tp']}), one GPU per rank, ranks in order "
                        "node by node, tp fastest. How many nodes does one data-parallel "
                        "replica (one whole copy of the model: its pp stages of tp ranks) span? "
                        "(A whole number.)"),
        right=lambda p: p["tp"] * p["pp"] // GPUS_PER_NODE,
        wrong=[
            Wrong(lambda p: p["dp"] * p["pp"] * p["tp"] // GPUS_PER_NODE,
                  "that is the whole job's nodes: every replica, not one"),
            Wrong(lambda p: p["pp"], "that counts a node per stage, true only when tp fills a "
                                     "node; here a node holds several stages' ranks"),
            Wrong(lambda p: p["tp"] * p["pp"], "that is the replica's GPUs, not its nodes"),
        ],
        worked=lambda p: (
            f"one replica is pp·tp = {p['pp']}·{p['tp']} = {p['pp'] * p['tp']} ranks, and with "
            "tp fastest, then dp, then pp (lesson 12), its tp groups are adjacent ranks; "
            f"{p['pp'] * p['tp']} GPUs at {GPUS_PER_NODE} a node is "
            f"{p['tp'] * p['pp'] // GPUS_PER_NODE} node(s) of GPUs (their ranks interleave "
            "with other replicas' along dp, but the count is the same)."),
    )


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
