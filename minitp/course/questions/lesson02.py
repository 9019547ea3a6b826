"""Lesson 02's questions: how to split an MLP, and what one rank of it holds."""

from __future__ import annotations

from .form import Question, Wrong


def mlp_split(seed=None) -> Question:
    def draw(rng):
        return {"t": rng.choice((2, 4, 8))}

    return Question(
        key="02.mlp-split", seed=seed, draw=draw, kind="choice",
        text=lambda p: (f"An MLP computes Z = GELU(XA)·B, with A of shape h × 4h and B of shape "
                        f"4h × h, and you split it over t = {p['t']} ranks so that each stores "
                        "1/t of A and of B. Which split needs the fewest collectives in the "
                        "forward pass, and gives every rank the whole Z? Answer 'a', 'b', 'c' "
                        "or 'd': (a) A by columns, B by rows; (b) A by rows, B by columns; "
                        "(c) A by columns, B by columns; (d) A by rows, B by rows."),
        right=lambda p: "a",
        wrong=[
            Wrong(lambda p: "b", "a row split of A leaves XA as a sum of partial products, "
                                 "and GELU of a sum is not the sum of the GELUs: an all-reduce "
                                 "before the GELU, and B's column split then needs an "
                                 "all-gather of Z"),
            Wrong(lambda p: "c", "a column split of B needs the whole GELU(XA) on every rank: "
                                 "an all-gather between the two layers, and another of Z"),
            Wrong(lambda p: "d", "a row split of A needs an all-reduce before the GELU, and "
                                 "B's row split a second one after it: two, where (a) needs one"),
        ],
        worked=lambda p: (
            "split A by columns: rank r computes whole columns XA_r, and GELU, element by "
            "element, gives exactly its columns of GELU(XA), with no communication. Those "
            "columns are what a row split of B takes: Z = Σ_r GELU(XA_r)·B_r, one all-reduce "
            "(g) forward. Backward, f (the copy of X) all-reduces once: one all-reduce each "
            f"way, whatever t is (here t = {p['t']})."),
    )


def mlp_params(seed=None) -> Question:
    def draw(rng):
        return {"h": rng.choice((1024, 2048, 4096, 5120)), "t": rng.choice((2, 4, 8))}

    def right(p):
        h, t = p["h"], p["t"]
        return 8 * h * h // t + 4 * h // t + h

    return Question(
        key="02.mlp-params", seed=seed, draw=draw, rel_tol=1e-9,
        text=lambda p: (f"An MLP of hidden size h = {p['h']:,} is nn.Linear(h, 4h) (fc), GELU, "
                        "nn.Linear(4h, h) (proj), both with biases. It is split over t = "
                        f"{p['t']} ranks with fc column-parallel and proj row-parallel, as "
                        "`mt.ColumnParallelLinear.from_dense` and `mt.RowParallelLinear."
                        "from_dense` split them. How many parameters (weights and biases) "
                        "does one rank hold? (A whole number, exactly.)"),
        right=right,
        wrong=[
            Wrong(lambda p: (8 * p["h"] ** 2 + 5 * p["h"]) // p["t"],
                  "that splits proj's bias too: a row-parallel layer keeps its whole bias, "
                  "added once after the all-reduce"),
            Wrong(lambda p: 8 * p["h"] ** 2 // p["t"],
                  "that counts the weights only: fc's bias slice (4h/t) and proj's whole bias "
                  "(h) are parameters too"),
            Wrong(lambda p: 8 * p["h"] ** 2 + 5 * p["h"],
                  "that is the whole MLP, every rank's parameters together"),
        ],
        worked=lambda p: (
            f"fc's weight is 4h × h = {4 * p['h'] ** 2:,} values and proj's h × 4h as many: "
            f"8h²/t = {8 * p['h'] ** 2 // p['t']:,} on each rank. fc is column-parallel, so "
            f"its bias is split too: 4h/t = {4 * p['h'] // p['t']:,}. proj is row-parallel: "
            f"its bias is whole on every rank, h = {p['h']:,}. In all 8h²/t + 4h/t + h = "
            f"{right(p):,}."),
    )


QUESTIONS = {"02.mlp-split": mlp_split, "02.mlp-params": mlp_params}
