"""Lesson 24's questions: the last rank's shard of a block-atomic ZeRO-3 split (the library's
`fp8.block_shards.shard_bounds`), the bytes of an MXFP8 or NVFP4 all-gather of an MLP weight
(`calc.fp8_all_gather_bytes`), and which axes a block-scaled cast reduces an amax over
(`fp8.amax_axes`: MXFP8 none, NVFP4 its tensor scale's)."""

from __future__ import annotations

from ...calc.footprint.fp8 import fp8_all_gather_bytes
from ...fp8.block_shards import shard_bounds
from ...rules import ceil_div
from ...rules.fp8_groups import BLOCK_SCALINGS, amax_axes
from .form import Question, Wrong
from .lesson23 import ring_gather_wrongs

MiB = 2**20
RECIPES = tuple(BLOCK_SCALINGS)  # "mxfp8" (blocks of 32), "nvfp4" (blocks of 16)


def _last(p, block=None):
    bounds = shard_bounds(p["rows"] * p["cols"], p["n"], block or BLOCK_SCALINGS[p["recipe"]])
    return bounds[-1][1] - bounds[-1][0]


def _shares(p):
    numel, n = p["rows"] * p["cols"], p["n"]
    return {"zero": numel - (n - 1) * ceil_div(numel, n),  # ZeRO's even split's last rank
            "slot": ceil_div(ceil_div(numel, n), BLOCK_SCALINGS[p["recipe"]])
            * BLOCK_SCALINGS[p["recipe"]], "mean": numel / n}


def _fair(p):
    """A draw whose right answer and usual mistakes are all apart, the last rank not empty."""
    values = [_last(p), *_shares(p).values()]
    return _last(p) > 0 and len({round(v, 6) for v in values}) == len(values)


DRAWS = [dict(rows=r, cols=c, n=n, recipe=k) for r in (96, 100, 200) for c in (64, 96, 160)
         for n in (3, 5, 6, 7) for k in RECIPES]
DRAWS = [p for p in DRAWS if _fair(p)]


def last_shard(seed=None) -> Question:
    return Question(
        key="24.last-shard", seed=seed, draw=lambda rng: dict(rng.choice(DRAWS)),
        text=lambda p: (f"ZeRO-3 keeps a weight of {p['rows']} × {p['cols']} values, flattened "
                        f"row by row, over N = {p['n']} ranks, and all-gathers it in "
                        f"{p['recipe'].upper()} (blocks of {BLOCK_SCALINGS[p['recipe']]} "
                        "values, counted from the first). The shards are block-atomic with "
                        "equal slots: each rank's share of ceil(numel/N) values rounded up to "
                        "whole blocks, rank r's slot starting at r × that, the last clipped "
                        "at the vector's end. How many values does the last rank hold?"),
        right=_last,
        wrong=[
            Wrong(lambda p: _shares(p)["zero"], "that is ZeRO's even split, ceil(numel/N) "
                                                "values a rank: its boundaries fall inside "
                                                "blocks; round each share up to whole blocks"),
            Wrong(lambda p: _shares(p)["slot"], "that is a whole slot: the earlier ranks' "
                                                "slots, rounded up, leave the last rank "
                                                "what remains"),
            Wrong(lambda p: _shares(p)["mean"], "that is numel/N, an even share: shards are "
                                                "whole values and whole blocks"),
        ],
        worked=lambda p: (f"numel = {p['rows'] * p['cols']:,}; ceil(numel/N) = "
                          f"{ceil_div(p['rows'] * p['cols'], p['n']):,} rounded up to blocks "
                          f"of {BLOCK_SCALINGS[p['recipe']]} is a slot of "
                          f"{_shares(p)['slot']:,}; the first {p['n'] - 1} ranks hold "
                          f"{(p['n'] - 1) * _shares(p)['slot']:,}, so the last holds "
                          f"{_last(p):,} (`mt.fp8.block_shards.shard_bounds`)."),
        rel_tol=1e-9,
    )


def gather_bytes(seed=None) -> Question:
    def draw(rng):
        return {"h": rng.choice((2048, 4096, 8192)), "n": rng.choice((8, 16, 64)),
                "recipe": rng.choice(RECIPES)}

    def sent(p, key="fp8", share=None):
        got = fp8_all_gather_bytes(4 * p["h"], p["h"], p["n"], p["recipe"])
        if key == "no scales":
            return got["values"] / MiB
        full = got[key] / ((p["n"] - 1) / p["n"])
        return (got[key] if share is None else full * share) / MiB

    def per_value(p):
        return "(4 + 8/16)/8 bytes" if p["recipe"] == "nvfp4" else "(8 + 8/32)/8 bytes"

    return Question(
        key="24.gather-bytes", seed=seed, draw=draw,
        text=lambda p: (f"ZeRO-3 shards the MLP's first weight W (4h × h, h = {p['h']}) over "
                        f"N = {p['n']} GPUs in whole blocks and all-gathers it in "
                        f"{p['recipe'].upper()}, each shard's codes and block scales (one byte "
                        "each) sent together" + (", after a float32 all-reduce of the amax for "
                        "the tensor scale" if p["recipe"] == "nvfp4" else "") + ". How many "
                        "MiB does one GPU send for one gather (a ring)? (MiB; within 1%.)"),
        right=sent,
        wrong=ring_gather_wrongs(sent) + [
            Wrong(lambda p: sent(p, "no scales"), "the block scales travel too: one byte a "
                                                  "block")],
        worked=lambda p: (f"A value and its share of a block scale are {per_value(p)}: "
                          f"(N-1)/N × 4h·h values = {p['n'] - 1}/{p['n']} × "
                          f"{4 * p['h'] ** 2:,} × {per_value(p)}"
                          + (" + the amax all-reduce's 2(N-1)/N × 4 bytes" if p["recipe"] ==
                             "nvfp4" else "") + f" = {sent(p):.2f} MiB "
                          "(`calc.fp8_all_gather_bytes`, a MODEL), against bf16's "
                          f"{sent(p, 'bf16'):.2f} MiB."),
    )


LETTERS = {(): "a", ("dp",): "b", ("tp",): "c", ("dp", "tp"): "d"}
CASES = [(k, layer, role) for k in RECIPES for layer in ("column", "row")
         for role in ("input", "weight", "grad")]
WHAT = {"input": "input x", "weight": "weight W",
        "grad": "output gradient g (in the backward)"}


def which_reduce(seed=None) -> Question:
    def axes(p, recipe=None):
        return tuple(a for a in amax_axes(p["layer"], p["role"], recipe or p["recipe"])
                     if a != "cp")

    def worked(p):
        if p["recipe"] == "mxfp8":
            return ("MXFP8 has no scale but its blocks': each block's e8m0 scale comes from its "
                    "32 values, whole on one rank (the library refuses a split that cuts one), "
                    "so no amax is reduced at all: answer a.")
        return (f"NVFP4's block scales are measured in units of one float32 tensor scale, "
                f"amax/(448·6), and that amax is the whole {WHAT[p['role']].split(' (')[0]}'s: "
                f"it is reduced over every axis holding another piece of it "
                f"({', '.join(axes(p))}): answer {LETTERS[axes(p)]}.")

    question = Question(
        key="24.which-reduce", seed=seed, kind="choice",
        draw=lambda rng: dict(zip(("recipe", "layer", "role"), rng.choice(CASES), strict=True)),
        text=lambda p: (f"A tensor-parallel MLP trains in {p['recipe'].upper()} on a dp × tp "
                        "mesh (each dp rank its own rows of the batch; no sequence "
                        f"parallelism). Take the {p['layer']}-parallel layer's cast of its "
                        f"{WHAT[p['role']]}. Over which axes must an amax be MAX-reduced so "
                        "that every rank casts as one device would, and over no axis that "
                        "changes nothing? Answer 'a', 'b', 'c' or 'd': (a) none; (b) dp; "
                        "(c) tp; (d) dp and tp."),
        right=lambda p: LETTERS[axes(p)], wrong=[], worked=worked)
    question.wrong = _which_wrongs(question.params, axes(question.params, "tensorwise"))
    return question


def _which_wrongs(p, tensor_group) -> list[Wrong]:
    """The usual mistakes for this draw, each a letter of its own: MXFP8's answer is none,
    so every group is a mistake; NVFP4's is the tensorwise group (lesson 23's)."""
    if p["recipe"] == "mxfp8":
        others = [letter for letter in "bcd" if letter != LETTERS[tensor_group]]
        return [Wrong(lambda _: LETTERS[tensor_group], "that is a tensorwise scale's group "
                      "(lesson 23): MXFP8 has no tensor scale, each e8m0 scale is one "
                      "block's, from 32 values whole on one rank")] + [
            Wrong(lambda _, letter=letter: letter, "MXFP8 reduces no amax: every scale is "
                  "one block's, and no block is split over ranks") for letter in others]
    wrong = [Wrong(lambda _: "a", "that is MXFP8's answer: NVFP4's block scales are in units "
                   "of one float32 tensor scale, the whole tensor's amax/(448·6), which the "
                   "ranks holding its pieces must share")]
    says = {"tp": "tp: it counts where it splits the tensor (every weight; the row layer's "
                  "input and the column layer's gradient, features apart)",
            "dp": "dp: its ranks hold other rows of every activation and gradient, and "
                  "copies of W"}
    for axis, text in says.items():
        got = set(tensor_group) ^ {axis}
        letter = LETTERS[tuple(a for a in ("dp", "tp") if a in got)]
        if letter != "a":
            wrong.append(Wrong(lambda _, letter=letter: letter, text))
    return wrong


QUESTIONS = {"24.last-shard": last_shard, "24.gather-bytes": gather_bytes,
             "24.which-reduce": which_reduce}
