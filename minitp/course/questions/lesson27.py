"""Lesson 27's questions: the latent cache one tensor-parallel rank holds in serving, the
expert rows today's layout computes twice, and the expert layout that neither repeats a
routed token nor copies an expert (torchtitan's EP ≥ TP)."""

from __future__ import annotations

from ...calc.inference.latent_cache import mla_cache_bytes_per_token
from .form import Question, Wrong

GB = 10**9
N_HEADS = 128  # DeepSeek-V3's heads (arXiv 2412.19437, §4.2)


def cache_per_rank(seed=None) -> Question:
    def draw(rng):
        return {"layers": rng.choice((27, 61)), "d_c": 512, "r": 64,
                "bytes": rng.choice((1, 2)), "B": rng.choice((16, 32, 64)),
                "T": rng.choice((8192, 32768, 131072)), "tp": rng.choice((4, 8, 16))}

    def gb(p, width=None, times=1):
        per_token = mla_cache_bytes_per_token(p["d_c"], p["r"], p["layers"], p["bytes"])
        if width is not None:
            per_token = per_token * width // (p["d_c"] + p["r"])
        return per_token * p["B"] * p["T"] * times / GB

    return Question(
        key="27.cache-per-rank", seed=seed, draw=draw,
        text=lambda p: (f"A model with DeepSeek-V3's latent attention ({p['layers']} layers, "
                        f"{N_HEADS} heads, a latent of d_c = {p['d_c']} values and a shared "
                        f"rotary key of {p['r']}) is served with tensor parallelism over "
                        f"tp = {p['tp']} GPUs, its cache in {p['bytes']} byte(s) a value. "
                        f"{p['B']} requests of {p['T']:,} tokens each are in the cache. How "
                        "many GB (10⁹ bytes) of latent cache does ONE of the tp GPUs hold?"),
        right=gb,
        wrong=[
            Wrong(lambda p: gb(p) / p["tp"],
                  "that divides the cache by tp; every head reads the whole latent, so "
                  "every tp rank holds all of it: tp does not divide it"),
            Wrong(lambda p: gb(p, width=p["d_c"]),
                  "that leaves out the rotary key: k^R, shared by every head, is cached too"),
            Wrong(lambda p: gb(p, times=2),
                  "that caches the latent twice, as K and V; it is the one source of both, "
                  "cached once"),
            Wrong(lambda p: gb(p, times=N_HEADS),
                  "that caches a latent per head; it is shared by every head"),
        ],
        worked=lambda p: (
            f"(d_c + d_r)·layers·bytes = ({p['d_c']} + {p['r']})·{p['layers']}·{p['bytes']} = "
            f"{mla_cache_bytes_per_token(p['d_c'], p['r'], p['layers'], p['bytes']):,} bytes "
            f"a token (`calc.mla_cache_bytes_per_token`, a MODEL), times {p['B']}·"
            f"{p['T']:,} tokens: {gb(p):,.2f} GB on EVERY one of the {p['tp']} GPUs. "
            f"Attention data parallelism over the same GPUs would give each its own "
            f"{p['B']}/{p['tp']} of the requests: {gb(p) / p['tp']:,.2f} GB."),
    )


def duplicated_rows(seed=None) -> Question:
    def draw(rng):
        dp, tp = rng.choice(((2, 2), (2, 4), (4, 2), (4, 4), (8, 2)))
        # k = 2 is left out: forgetting k would then read as forgetting tp = 2
        return {"dp": dp, "tp": tp, "ep": rng.choice([e for e in (2, 4) if e <= dp]),
                "tokens": rng.choice((4096, 8192)), "k": rng.choice((6, 8))}

    def rows(p, tp=True, k=True, ep=False):
        return (p["dp"] * p["tokens"] * (p["k"] if k else 1) * (p["tp"] if tp else 1)
                * (p["ep"] if ep else 1))

    return Question(
        key="27.duplicated-rows", seed=seed, draw=draw, rel_tol=1e-9,
        text=lambda p: (f"minitp's `Mesh(dp={p['dp']}, tp={p['tp']}, ep={p['ep']})` trains a "
                        f"mixture of experts, top-{p['k']}, WITHOUT sequence parallelism, and "
                        f"experts laid out as today (ep folded into dp, every expert whole "
                        f"over tp). Each dp rank's batch holds {p['tokens']:,} tokens. How "
                        "many expert rows (a token's input through one of its experts) do "
                        "all the ranks together compute in one MoE layer's forward, nothing "
                        "dropped?"),
        right=rows,
        wrong=[
            Wrong(lambda p: rows(p, tp=False),
                  "that is what one device computes; without SP the tp ranks hold the same "
                  "tokens, and each runs them through its (whole) experts: tp times over"),
            Wrong(lambda p: rows(p, k=False),
                  "a token goes through k experts: k rows, not one"),
            Wrong(lambda p: rows(p, ep=True),
                  "ep does not multiply the work: each row goes to the one rank of the ep "
                  "group that holds its expert"),
        ],
        worked=lambda p: (
            f"one device: dp·tokens·k = {p['dp']}·{p['tokens']:,}·{p['k']} = "
            f"{rows(p, tp=False):,} rows. Each of the {p['tp']} tp ranks of a dp rank holds "
            f"the same tokens (no SP) and the same whole experts, so each computes them: "
            f"{rows(p):,} rows, {p['tp'] - 1} of every {p['tp']} a duplicate. Under SP each "
            "tp rank routes its own slice (no duplicate); folding ep over tp too splits the "
            "experts' weights as well (minitp/expert_parallel/plan.py)."),
    )


LAYOUTS = {
    "right": "ep = {n}: the experts shared out over all {n} ranks, whole, each tp rank "
             "dispatching its own slice of the sequence (sequence-parallel tokens)",
    "today": "ep = {dp}, every expert whole over tp, no sequence parallelism",
    "etp": "ep = {dp} and etp = {tp}: each expert's matrices split over the tp ranks",
    "sp": "ep = {dp}, every expert whole over tp, with sequence parallelism",
}
WHY = {
    "today": "the tp ranks hold the same tokens and each computes them: every routed token "
             "is computed tp times",
    "etp": "every expert is cut into tp thin slices (small GEMMs), and the tp ranks of an ep "
           "rank all send the same all-to-all (torchtitan PR #3167 removed etp for both)",
    "sp": "no token is computed twice, but every tp rank holds its ep rank's whole experts: "
          "tp copies of each expert",
}


def ep_layout(seed=None) -> Question:
    def draw(rng):
        dp, tp = rng.choice(((2, 2), (2, 4), (4, 2), (4, 4), (8, 2)))
        order = list(LAYOUTS)
        rng.shuffle(order)
        return {"dp": dp, "tp": tp, "order": order}

    def letter(p, role):
        return "abcd"[p["order"].index(role)]

    def text(p):
        n = p["dp"] * p["tp"]
        options = "; ".join(f"({letter(p, r)}) " + LAYOUTS[r].format(n=n, dp=p["dp"], tp=p["tp"])
                            for r in sorted(p["order"], key=lambda r: letter(p, r)))
        return (f"A mixture of experts trains on dp = {p['dp']} × tp = {p['tp']} = {n} ranks "
                "(attention and the dense layers tensor-parallel over tp). Which layout of the "
                "routed experts computes no routed token twice AND keeps no two copies of an "
                f"expert? {options}. Answer the letter.")

    return Question(
        key="27.ep-layout", seed=seed, draw=draw, kind="choice", text=text,
        right=lambda p: letter(p, "right"),
        wrong=[Wrong(lambda p, role=role: letter(p, role), WHY[role]) for role in WHY],
        worked=lambda p: (
            f"({letter(p, 'right')}): ep spans tp as well as dp ('parallel folding', "
            "Megatron-LM's MoE README, arXiv 2504.14960). Each tp rank routes only its "
            "sequence-parallel slice, so nothing is computed twice, and the experts are "
            f"shared out {p['dp'] * p['tp']} ways, whole, so none is copied. That is why "
            "torchtitan requires EP ≥ TP (PR #4794), having removed etp (PR #3167)."),
    )


QUESTIONS = {"27.cache-per-rank": cache_per_rank, "27.duplicated-rows": duplicated_rows,
             "27.ep-layout": ep_layout}
