"""Lesson 28's questions: the bytes that the walked bug's fix adds to sequence parallelism's
all-reduce, one device's loss where the dp ranks hold different numbers of real tokens, and
what to do first when a hang's report shows a rank that never called a collective. None
names a learner's own bug: the walked bug is left out of the draw, and the other two are
read from a drawn case, not from the learner's run."""

from __future__ import annotations

from .form import Question, Wrong

WIDTHS = (768, 1024, 2048, 4096, 5120, 8192)
LAYERS = (12, 24, 32, 40, 48, 80)


def norm_bytes(seed=None) -> Question:
    def draw(rng):
        return {"L": rng.choice(LAYERS), "d": rng.choice(WIDTHS), "bytes": 4}

    def size(p, norms=None, per_norm=2, item=None):
        norms = 2 * p["L"] + 1 if norms is None else norms
        return norms * per_norm * p["d"] * (item or p["bytes"])

    dtype = {4: "float32"}
    return Question(
        key="28.norm-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A GPT of {p['L']} layers and width d = {p['d']} has two LayerNorms a "
                        "layer and a final one, each a weight and a bias of d values. Trained "
                        "with sequence parallelism, each tp rank must all-reduce its norms' "
                        "gradients (Megatron-LM issue #1446's fix). How many bytes of norm "
                        "gradients does one rank put into that all-reduce per step, in "
                        f"{dtype[p['bytes']]}, minitp's main_grad? (Bytes; within 0.1%.)"),
        right=size,
        wrong=[
            Wrong(lambda p: size(p, norms=2 * p["L"]), "that leaves out the final norm "
                                                       "(ln_f): 2L + 1 norms, not 2L"),
            Wrong(lambda p: size(p, per_norm=1), "that counts the weights alone: a LayerNorm "
                                                 "has a bias too"),
            Wrong(lambda p: size(p, norms=p["L"] + 1), "that counts one norm a layer: a "
                                                       "block normalises before attention and "
                                                       "before the MLP"),
        ],
        worked=lambda p: (f"(2·{p['L']} + 1) norms × 2 vectors × {p['d']} values × "
                          f"{p['bytes']} bytes = {size(p):,} bytes. Small beside the model, "
                          "which is why forgetting it costs nothing visible but a drift."),
        rel_tol=0.001,
    )


def token_mean(seed=None) -> Question:
    def draw(rng):
        n0, n1 = rng.sample((96, 128, 200, 256, 320, 512), 2)
        l0, l1 = rng.sample((2.1, 2.6, 3.0, 3.4, 3.9, 4.5), 2)
        return {"n0": n0, "n1": n1, "l0": l0, "l1": l1}

    def mean(p):
        return (p["n0"] * p["l0"] + p["n1"] * p["l1"]) / (p["n0"] + p["n1"])

    return Question(
        key="28.token-mean", seed=seed, draw=draw,
        text=lambda p: (f"Two dp ranks train on a packed batch. Rank 0's rows hold "
                        f"{p['n0']} real target tokens (the rest padding) and its mean loss "
                        f"over them is {p['l0']}; rank 1's hold {p['n1']}, mean "
                        f"{p['l1']}. What loss does one device compute on the whole batch, "
                        "the loss whose gradient the two ranks must reproduce? (Within 1%.)"),
        right=mean,
        wrong=[
            Wrong(lambda p: (p["l0"] + p["l1"]) / 2, "that is the mean of the two means, each "
                  "rank dividing by its own count (pytorch/torchtitan pull request #2206's "
                  "bug): a rank with fewer real tokens weighs as much as a full one"),
            Wrong(lambda p: p["l0"] + p["l1"], "that is the two means summed: each is already "
                                               "a mean, so the sum counts the batch twice"),
            Wrong(lambda p: (p["n1"] * p["l0"] + p["n0"] * p["l1"]) / (p["n0"] + p["n1"]),
                  "the counts are swapped: each rank's mean weighs by its own count"),
        ],
        worked=lambda p: (f"One device averages every real token: ({p['n0']}·{p['l0']} + "
                          f"{p['n1']}·{p['l1']}) / ({p['n0']} + {p['n1']}) = {mean(p):.4f}. "
                          "So each rank weights its mean by its count over the global count "
                          "(minitp's train_step does), and the sum of their gradients is one "
                          "device's."),
    )


def _table(p) -> str:
    rows = []
    for rank in range(p["world"]):
        last = p["k"] - 1 if rank == p["left"] else p["k"]
        state = "done" if rank == p["left"] else "entered"
        rows.append(f"rank {rank}: #{last} {p['op']} on {p['axis']}, {state}")
    return "; ".join(rows)


def hang_rank(seed=None) -> Question:
    def draw(rng):
        world = rng.choice((4, 6, 8))
        order = ["left", "first", "last", "restart"]
        rng.shuffle(order)
        return {"world": world, "left": rng.randrange(1, world - 1), "k": rng.randrange(2, 9),
                "op": rng.choice(("all_reduce", "all_gather", "reduce_scatter")),
                "axis": rng.choice(("dp", "tp", "world")), "order": order}

    def letter(p, role):
        return "abcd"[p["order"].index(role)]

    def options(p):
        said = {"left": f"read rank {p['left']}'s code after its #{p['k'] - 1}",
                "first": "read rank 0's code: it is named first, waiting",
                "last": f"read rank {p['world'] - 1}'s code: the last rank, waiting",
                "restart": "raise the timeout and run again: a slow network, not a bug"}
        return "; ".join(f"({letter(p, role)}) {said[role]}"
                         for role in sorted(p["order"], key=lambda role: letter(p, role)))

    why = {"first": "rank 0 is only the first of those waiting: the waiting ranks did what "
                    "they should; look at the one that never called the collective they wait in",
           "last": "that rank is waiting too, in the collective every rank should call",
           "restart": "a slow network delays a collective every rank entered; here one rank "
                      "never entered it, and no timeout will bring it"}
    return Question(
        key="28.hang-rank", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"A run of {p['world']} ranks stops with a CollectiveTimeout. Each "
                        "rank's last collective on the group of all ranks, as the report's "
                        f"table lists it (#k: the k-th call on that axis): {_table(p)}. What "
                        f"do you do first? {options(p)}. Answer the letter."),
        right=lambda p: letter(p, "left"),
        wrong=[Wrong(lambda p, role=role: letter(p, role), why[role])
               for role in ("first", "last", "restart")],
        worked=lambda p: (f"Every rank but {p['left']} entered #{p['k']}; rank {p['left']} "
                          f"finished #{p['k'] - 1} and never called #{p['k']}: it skipped a "
                          "collective, or returned early (its data ran out, say). The others "
                          f"are waiting for it: ({letter(p, 'left')})."),
    )


QUESTIONS = {"28.norm-bytes": norm_bytes, "28.token-mean": token_mean,
             "28.hang-rank": hang_rank}
