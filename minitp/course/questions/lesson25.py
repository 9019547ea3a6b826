"""Lesson 25's questions: which rows FSDP2 over tensor parallelism leaves a rank (the
`_StridedShard` lesson 25 printed), FSDP's bytes across nodes against HSDP's when FSDP2
skips the gradient sync until the last microbatch (a MODEL), and the fewest nodes an HSDP
shard group needs for its model states to fit."""

from __future__ import annotations

from ...calc.footprint.memory import model_state_bytes
from ...calc.network.cluster import Cluster, GiB
from ...calc.network.hierarchy import dp_step
from .form import Question, Wrong


def _distinct(q: Question, wrongs) -> list[Wrong]:
    """The usual mistakes whose answer, at this question's numbers, exists and differs
    from the right one and from every mistake kept before it."""
    kept, seen = [], {None, q.right(q.params)}
    for w in wrongs:
        if w.value(q.params) not in seen:
            kept.append(w)
            seen.add(w.value(q.params))
    return kept


ROWS = (4096, 11008, 14336)  # Llama 2 7B's d_model and FFN width; Llama 3 8B's FFN width


def strided_rows(seed=None) -> Question:
    def draw(rng):
        while True:
            p = {"rows": rng.choice(ROWS), "dp": rng.choice((2, 4, 8)),
                 "tp": rng.choice((2, 4, 8))}
            p["i"], p["j"] = rng.randrange(p["dp"]), rng.randrange(p["tp"])
            if p["i"] * p["tp"] + p["j"] != p["j"] * p["dp"] + p["i"]:  # the orders differ
                return p

    block = lambda p: p["rows"] // (p["dp"] * p["tp"])  # noqa: E731
    start = lambda p: p["j"] * p["rows"] // p["tp"]  # noqa: E731  (tp's block)

    q = Question(
        key="25.strided-rows", seed=seed, draw=draw, rel_tol=1e-9,
        right=lambda p: start(p) + p["i"] * block(p),
        text=lambda p: (
            f"On a mesh (dp, tp) = ({p['dp']}, {p['tp']}), tp fastest, a model is given "
            "`parallelize_module` on tp and then FSDP2's `fully_shard` on dp. One of its "
            f"column-parallel Linears has a weight of {p['rows']:,} rows (out_features). "
            "FSDP2 shards each parameter's local tensor, what tensor parallelism left on "
            "the rank, along dim 0. Which global row (counting from 0) is the first that the "
            f"rank at dp = {p['i']}, tp = {p['j']} keeps?"),
        worked=lambda p: (
            f"tensor parallelism gives tp rank {p['j']} rows {p['j']} × {p['rows']:,}/"
            f"{p['tp']} = {start(p):,} onward, {p['rows'] // p['tp']:,} of them; FSDP2 cuts "
            f"that block into {p['dp']} and dp rank {p['i']} starts {p['i']} × {block(p):,} "
            f"rows into it: row {start(p) + p['i'] * block(p):,}. "
            "dp cuts inside tp's block, the reverse of DTensor's left-to-right order for "
            "(Shard(0), Shard(0)): that is why lesson 25 printed `_StridedShard(dim=0)` on dp."),
    )
    q.wrong = _distinct(q, (
        Wrong(lambda p: (p["i"] * p["tp"] + p["j"]) * block(p),
              "that is (Shard(0), Shard(0)) read in DTensor's order, dp cutting the whole "
              "weight first; FSDP2 came after tensor parallelism and cuts inside each tp "
              "rank's block (the `_StridedShard`)"),
        Wrong(lambda p: p["j"] * p["rows"] // p["tp"],
              "that is where tensor parallelism's block starts; FSDP2 then cuts it over dp"),
        Wrong(lambda p: p["i"] * p["rows"] // p["dp"],
              "that shards the whole weight over dp alone; tensor parallelism cut it first"),
    ))
    return q


def _cluster(g):
    return Cluster("question", g, 1e15, 80 * GiB, 450e9, 50e9)


def crossing(seed=None) -> Question:
    def draw(rng):
        return {"g": rng.choice((4, 8)), "nodes": rng.choice((2, 4, 16)),
                "m": rng.choice((2, 6, 12))}  # m > 1: the sync flag matters

    def ratio(p, gathers=None, scatters=1, whole=False):
        n, m = p["g"] * p["nodes"], p["m"]
        c = _cluster(p["g"])
        one = dp_step(c, 10**9, n, "fsdp", 1).crossing / 3  # one flat collective's bytes
        fsdp = one * ((2 * m if gathers is None else gathers) + scatters)
        hsdp = dp_step(c, 10**9, n, "hsdp", m).crossing * (p["g"] if whole else 1)
        return fsdp / hsdp

    return Question(
        key="25.crossing", seed=seed, draw=draw, right=lambda p: ratio(p),
        text=lambda p: (
            f"{p['nodes']} nodes of {p['g']} GPUs train one model by sharded data parallelism, "
            f"{p['m']} microbatches a step. FSDP shards over all {p['g'] * p['nodes']} GPUs "
            "(each collective a ring across every GPU, in node order); HSDP shards over the "
            "GPUs of a node and replicates across nodes. Both accumulate gradients the cheap "
            "way: FSDP2's `set_requires_gradient_sync(False)` on every microbatch but the "
            "last for FSDP, `set_requires_all_reduce(False)` likewise for HSDP, whose "
            "across-node all-reduce of each GPU's gradient shard then runs once a step. "
            "Parameters are re-gathered for each microbatch's forward and backward "
            "(`reshard_after_forward=True`, the default). Parameters and gradients have the "
            "same bytes. By what factor are FSDP's bytes across node boundaries per step "
            "more than HSDP's (ring model, within 1%)?"),
        wrong=[
            Wrong(lambda p: ratio(p, scatters=p["m"]),
                  "that is FSDP at its worst, a reduce-scatter every microbatch: with the "
                  "sync off it reduce-scatters on the last microbatch only"),
            Wrong(lambda p: ratio(p, scatters=0),
                  "the last microbatch still reduce-scatters the accumulated gradients, "
                  "across the nodes"),
            Wrong(lambda p: ratio(p, gathers=2),
                  "the sync flag skips gradient communication only: each microbatch's "
                  "forward and backward still gather the parameters, across the nodes"),
            Wrong(lambda p: ratio(p, whole=True),
                  "that has HSDP all-reduce the whole gradient across nodes; each GPU "
                  "all-reduces only its 1/g shard, g rings in parallel"),
        ],
        worked=lambda p: (
            "a ring over n = g·k GPUs in node order crosses the k node boundaries, each link "
            "carrying (n−1)/n·S per gather or reduce-scatter. FSDP now makes 2m all-gathers "
            "and one reduce-scatter a step: (2m+1)·k(n−1)/n·S across. HSDP's rings (one per "
            "GPU position) carry S/g each, all of their k links across: 2(k−1)·S. The factor "
            f"(2m+1)·k(n−1)/n / (2(k−1)) = {ratio(p):.3f} (a MODEL), against "
            f"{ratio(p, scatters=p['m']):.3f} at FSDP's worst: skipping the sync saves "
            "under a third, since the gathers remain; FSDP2 pays for it in memory, each "
            "unit's whole gradient kept until the last microbatch."),
    )


def _states(p, s, per_param=16, unit=GiB):
    """GiB of model states a GPU keeps in a shard group of s nodes (16 bytes a parameter)."""
    total = model_state_bytes(p["billions"] * 10**9, s * p["g"], 3)["total"]
    return total * per_param / 16 / unit


def _fewest(p, must_divide=True, **kw):
    """The fewest nodes a shard group can have (None: none fits)."""
    return next((s for s in range(1, p["nodes"] + 1)
                 if (p["nodes"] % s == 0 or not must_divide) and _states(p, s, **kw)
                 <= p["budget"]), None)


def _group_options(p, rng) -> list[int]:
    """The right group size and three wrong ones: one usual slip (not dividing the nodes,
    one too small, GiB read as 10⁹ bytes, the next that fits, the bf16 weights alone), then
    two drawn from the slips and the divisors near it, so that its letter varies."""
    right, divisors = _fewest(p), [s for s in range(1, p["nodes"] + 1) if p["nodes"] % s == 0]
    slips = [_fewest(p, must_divide=False), max((d for d in divisors if d < right), default=None),
             _fewest(p, unit=10**9), min((d for d in divisors if d > right), default=None),
             _fewest(p, per_param=2)]
    slips = list(dict.fromkeys(t for t in slips if t not in (None, right)))
    first = rng.choice(slips)
    near = [d for d in dict.fromkeys(slips + divisors) if d not in (right, first)
            and d <= 4 * right]
    return sorted([right, first, *rng.sample(near, 2)])


def hsdp_memory(seed=None) -> Question:
    def draw(rng):
        p = {"billions": rng.choice((70, 180, 405)), "g": 8, "nodes": rng.choice((48, 96)),
             "budget": rng.choice((20, 30, 40))}
        return {**p, "options": _group_options(p, rng)}

    def says(p, size):
        if p["nodes"] % size:
            return (f"{size} does not divide the {p['nodes']} nodes: the replicas must be "
                    "equal shard groups")
        if _states(p, size) > p["budget"]:
            return (f"a group of {size} node{'s' * (size > 1)} keeps {_states(p, size):.1f} "
                    f"GiB of model states a GPU, over the {p['budget']} GiB left (16 bytes "
                    "a parameter)")
        return (f"{size} nodes fit, but a smaller group that divides the {p['nodes']} nodes "
                "fits too, and its gathers cross fewer node boundaries")

    letter = lambda p, size: "abcd"[p["options"].index(size)]  # noqa: E731
    q = Question(
        key="25.hsdp-memory", seed=seed, draw=draw, kind="choice",
        right=lambda p: letter(p, _fewest(p)),
        text=lambda p: (
            f"A {p['billions']}B-parameter model trains with mixed-precision Adam (16 bytes "
            f"a parameter: Rajbhandari et al. 2020, §3.1) on {p['nodes']} nodes of {p['g']} "
            "GPUs by HSDP: each shard group is a whole number of nodes, the model states "
            "sharded over its GPUs, and the groups are equal replicas of one another. After "
            f"activations, each GPU has {p['budget']} GiB left for model states. Fewer nodes "
            "a group, the fewer node boundaries its gathers cross: how many nodes should a "
            "shard group have? Answer 'a', 'b', 'c' or 'd': "
            + "; ".join(f"({'abcd'[i]}) {o}" for i, o in enumerate(p["options"])) + "."),
        worked=lambda p: (
            f"a group of s nodes keeps 16Ψ/(s·g) per GPU: {_states(p, 1):.1f}/s GiB here, at "
            f"most {p['budget']} GiB when s ≥ {_states(p, 1) / p['budget']:.2f}; and s must "
            f"divide the {p['nodes']} nodes for equal replicas: s = {_fewest(p)}, "
            f"({letter(p, _fewest(p))}): {_states(p, _fewest(p)):.1f} GiB a GPU, "
            f"{p['nodes'] // _fewest(p)} replicas. FSDP over all {p['nodes']} nodes would keep "
            f"{_states(p, p['nodes']):.2f} GiB."),
    )
    q.wrong = [Wrong(lambda p, o=o: letter(p, o), says(q.params, o))
               for o in q.params["options"] if o != _fewest(q.params)]
    return q


QUESTIONS = {"25.strided-rows": strided_rows, "25.crossing": crossing,
             "25.hsdp-memory": hsdp_memory}
