"""Lesson 22's questions: a tensor's DTensor placement in a tensor-parallel MLP, and HSDP
against FSDP across nodes: the bytes that cross node boundaries (a MODEL) and the model
states each GPU keeps."""

from __future__ import annotations

from ...calc.cluster import Cluster, GiB
from ...calc.hierarchy import dp_step
from ...calc.memory import model_state_bytes
from .form import Question, Wrong

OPTIONS = ("Shard(0)", "Shard(1)", "Replicate()", "Partial()")  # a, b, c, d
LETTERS = "abcd"
# (tensor, sp) -> the placement: 2-D activations (tokens, features), nn.Linear's weight
# (out_features, in_features); fc1 column-parallel, fc2 row-parallel (lessons 02, 05).
PLACEMENTS = {
    ("fc1.weight", False): "Shard(0)", ("fc2.weight", False): "Shard(1)",
    ("fc1.bias", False): "Shard(0)", ("fc2.bias", False): "Replicate()",
    ("h, fc1's output", False): "Shard(1)",
    ("h @ fc2.weight.T, before any communication", False): "Partial()",
    ("x, the MLP's input as a rank holds it", False): "Replicate()",
    ("x, the MLP's input as a rank holds it", True): "Shard(0)",
    ("y, the MLP's output after fc2's communication", False): "Replicate()",
    ("y, the MLP's output after fc2's communication", True): "Shard(0)",
}
# the slip each wrong option is, per right answer
SLIPS = {
    "Shard(0)": "that cuts dim 0: for a Linear's weight, its out_features (fc1's column "
                "split); for an activation, its token rows (SP's split)",
    "Shard(1)": "that cuts dim 1: for a Linear's weight, its in_features (fc2's row split); "
                "for an activation, its features",
    "Replicate()": "that says every rank holds the whole tensor",
    "Partial()": "that says every rank holds a full-shaped term and the value is their sum",
}


def placement(seed=None) -> Question:
    def draw(rng):
        tensor, sp = rng.choice(sorted(PLACEMENTS))
        return {"tensor": tensor, "sp": sp}

    def right(p):
        return LETTERS[OPTIONS.index(PLACEMENTS[(p["tensor"], p["sp"])])]

    def wrong(option):
        return Wrong(lambda p: LETTERS[OPTIONS.index(option)], SLIPS[option])

    q = Question(
        key="22.placement", seed=seed, draw=draw, kind="choice",
        text=lambda p: (
            "A tensor-parallel MLP on tp ranks, "
            f"{'with' if p['sp'] else 'without'} sequence parallelism: fc1 = nn.Linear(d, f) "
            "column-parallel, GELU, fc2 = nn.Linear(f, d) row-parallel; activations are "
            "(tokens, features). What is the DTensor placement of "
            f"{p['tensor']}, on the tp mesh dimension? Answer 'a', 'b', 'c' or 'd': "
            + "; ".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(OPTIONS)) + "."),
        right=right,
        worked=lambda p: (
            f"{PLACEMENTS[(p['tensor'], p['sp'])]}. nn.Linear keeps (out_features, "
            "in_features): fc1 splits its outputs (weight and bias Shard(0), h Shard(1)), "
            "fc2 its inputs (weight Shard(1)); fc2's product on a rank is one term of the "
            "output (Partial()), and its bias is added once after the sum (Replicate()). "
            "Outside the MLP every rank holds the whole activation (Replicate()) without SP, "
            "its token rows (Shard(0)) with it. Exercise 22 checks every one in DTensor."),
    )
    q.wrong = [wrong(o) for o in OPTIONS if o != PLACEMENTS[(q.params["tensor"], q.params["sp"])]]
    return q


def _cluster(g):
    return Cluster("question", g, 1e15, 80 * GiB, 450e9, 50e9)


def crossing(seed=None) -> Question:
    def draw(rng):
        return {"g": rng.choice((4, 8)), "nodes": rng.choice((2, 4, 16)),
                "m": rng.choice((2, 6, 12))}  # never g, nor 3

    def ratio(p, m=None, grads_only=False, whole=False):
        n = p["g"] * p["nodes"]
        m = p["m"] if m is None else m
        c = _cluster(p["g"])
        fsdp = dp_step(c, 10**9, n, "fsdp", m).crossing
        if grads_only:  # the reduce-scatter alone
            fsdp /= 3
        hsdp = dp_step(c, 10**9, n, "hsdp", m).crossing * (p["g"] if whole else 1)
        return fsdp / hsdp

    return Question(
        key="22.crossing", seed=seed, draw=draw, right=lambda p: ratio(p),
        text=lambda p: (
            f"{p['nodes']} nodes of {p['g']} GPUs train one model by sharded data parallelism, "
            f"{p['m']} microbatches a step. FSDP shards over all {p['g'] * p['nodes']} GPUs: "
            "per microbatch two all-gathers of the parameters and a reduce-scatter of the "
            "gradients, each a ring across every GPU, in node order. HSDP shards over the "
            "GPUs of a node and replicates across nodes: its gathers and reduce-scatters stay "
            "inside the node; once a step each GPU all-reduces its gradient shard with its "
            "peers on the other nodes (one ring per GPU position). Parameters and gradients "
            "have the same bytes. By what factor are FSDP's bytes across node boundaries "
            "per step more than HSDP's (ring model, within 1%)?"),
        wrong=[
            Wrong(lambda p: ratio(p, m=1),
                  "that is one microbatch's: FSDP gathers the parameters again every "
                  "microbatch, across the nodes; HSDP all-reduces across them once a step"),
            Wrong(lambda p: ratio(p, grads_only=True),
                  "that counts FSDP's reduce-scatter alone; its two all-gathers of the "
                  "parameters cross the nodes too"),
            Wrong(lambda p: ratio(p, whole=True),
                  "that has HSDP all-reduce the whole gradient across nodes; each GPU "
                  "all-reduces only its 1/g shard, g rings in parallel"),
        ],
        worked=lambda p: (
            "a ring over n = g·k GPUs in node order crosses the k node boundaries, each link "
            "carrying (n−1)/n·S per gather or reduce-scatter: FSDP puts 3m·k(n−1)/n·S across "
            "a step. HSDP's rings (one per GPU position) carry S/g each, all of their k links "
            "across: g·k·2(k−1)/k·S/g = 2(k−1)·S. The factor 3m·k(n−1)/n / (2(k−1)) = "
            f"{ratio(p):.3f} (`calc.hierarchy.dp_step`, a MODEL)."),
    )


def hsdp_memory(seed=None) -> Question:
    def draw(rng):
        return {"billions": rng.choice((7, 13, 34, 70)), "g": rng.choice((4, 8)),
                "nodes": rng.choice((16, 64))}

    def gib(p, shards):
        return model_state_bytes(p["billions"] * 10**9, shards, 3, "adam-mixed")["total"] / GiB

    n = lambda p: p["g"] * p["nodes"]  # noqa: E731
    return Question(
        key="22.hsdp-memory", seed=seed, draw=draw, right=lambda p: gib(p, p["g"]),
        text=lambda p: (
            f"A {p['billions']}B-parameter model trains with mixed-precision Adam (16 bytes "
            f"a parameter: Rajbhandari et al. 2020, §3.1) on {p['nodes']} nodes of {p['g']} "
            "GPUs, by HSDP: sharded inside each node, replicated across nodes. How many GiB "
            "of model states does each GPU keep? (Within 1%.)"),
        wrong=[
            Wrong(lambda p: gib(p, n(p)), "that is FSDP's, sharded over every GPU; HSDP "
                                          "shards over one node's g GPUs only"),
            Wrong(lambda p: gib(p, p["nodes"]), "HSDP shards over the GPUs of a node, not "
                                                "over the nodes (it replicates across those)"),
            Wrong(lambda p: gib(p, 1), "that is plain data parallelism's: HSDP still shards "
                                       "inside the node"),
        ],
        worked=lambda p: (
            f"16Ψ/g = 16 × {p['billions']}e9 / {p['g']} bytes = {gib(p, p['g']):.1f} GiB, "
            f"against FSDP's 16Ψ/n = {gib(p, n(p)):.2f} GiB over all {n(p)} GPUs: HSDP pays "
            f"{n(p) // p['g']}× FSDP's model-state memory for keeping its gathers inside "
            "the node."),
    )


QUESTIONS = {"22.placement": placement, "22.crossing": crossing,
             "22.hsdp-memory": hsdp_memory}
