"""Lesson 22's questions: the bytes Muon's owner strategy sends per GPU under ZeRO-1, the
optimizer state a GPU keeps with Muon and AdamW under ZeRO-1, and which strategy sends the
fewest bytes for a setting (a design decision). Every answer is `mt.calc`'s model
(`muon_comm_bytes`, `muon_state_bytes`)."""

from __future__ import annotations

from ...calc.footprint.muon import muon_comm_bytes, muon_state_bytes
from .form import Question, Wrong

MiB, GiB = 2**20, 2**30


def _gpt(h: int, layers: int) -> list:
    """A GPT's Muon matrices, whole: per layer qkv, the projection and the MLP's two."""
    return [(3 * h, h, None), (h, h, None), (4 * h, h, None), (h, 4 * h, None)] * layers


def owner_bytes(seed=None) -> Question:
    def draw(rng):
        return {"h": rng.choice((2048, 4096, 8192)), "l": rng.choice((24, 32, 48)),
                "n": rng.choice((4, 8, 16))}

    def sent(p, strategy="owner"):
        return muon_comm_bytes(_gpt(p["h"], p["l"]), strategy, dp=p["n"], zero_stage=1,
                               bytes_per=2)["total"] / MiB

    def values(p):  # 12h² values a layer
        return 12 * p["h"] ** 2 * p["l"]

    return Question(
        key="22.owner-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A GPT of l = {p['l']} layers, width h = {p['h']} (its Muon matrices: "
                        "qkv 3h×h, the projection h×h, the MLP's 4h×h and h×4h, 12h² values a "
                        f"layer) trains under ZeRO-1 over N = {p['n']} GPUs, each holding 1/N "
                        "of every matrix's summed momentum in bf16 (2 bytes). With the owner "
                        "strategy, how many MiB does a GPU send per step for Muon, on average "
                        "over the GPUs? (MiB; within 1%.)"),
        right=sent,
        wrong=[
            Wrong(lambda p: sent(p, "gather"), "that is gather's: every GPU all-gathers every "
                                               "matrix, (N-1)/N of them"),
            Wrong(lambda p: sent(p) / 2, "that is only the way in: each home sends every "
                                         "other GPU its rows of the result back, as many bytes"),
            Wrong(lambda p: 2 * values(p) * 2 / p["n"] / MiB,
                  "a GPU's run of a matrix homed on itself stays there: of its 1/N of the "
                  "matrices, (N-1)/N travel, each way"),
        ],
        worked=lambda p: (f"The matrices hold M = 12h²l = {values(p):,} values. A GPU holds "
                          "1/N of each; the runs of a matrix not homed on it go home, and "
                          "come back orthogonalised: 2·(N-1)/N·M/N values a GPU on average, "
                          f"2·{p['n'] - 1}/{p['n']}²·{values(p):,}·2 bytes = {sent(p):,.1f} "
                          f"MiB (`calc.muon_comm_bytes`, a MODEL), against gather's "
                          f"{sent(p, 'gather'):,.1f}: 2/N of it."),
    )


def state_bytes(seed=None) -> Question:
    def draw(rng):
        return {"h": rng.choice((2048, 4096, 5120)), "l": rng.choice((24, 32, 40)),
                "v": rng.choice((32000, 50257, 128000)), "n": rng.choice((8, 16, 64))}

    def counts(p):  # the matrices' values, the rest (the tied embedding; norms, biases left out)
        return 12 * p["l"] * p["h"] ** 2, p["v"] * p["h"]

    def state(p, key="optimizer", zero=1, optimizer="muon-fp32"):
        return muon_state_bytes(*counts(p), dp=p["n"], zero_stage=zero,
                                optimizer=optimizer)[key] / GiB

    return Question(
        key="22.state-bytes", seed=seed, draw=draw,
        text=lambda p: (f"A GPT of l = {p['l']} layers, width h = {p['h']} and a tied "
                        f"embedding of V = {p['v']:,} tokens (count only 12h² matrix values a "
                        "layer and the V×h embedding) trains in float32: Muon steps the "
                        "matrices, AdamW the embedding. Under ZeRO-1 over N = "
                        f"{p['n']} GPUs, how many GiB of optimizer state does one GPU keep? "
                        "(GiB; within 1%.)"),
        right=state,
        wrong=[
            Wrong(lambda p: sum(counts(p)) * 8 / p["n"] / GiB,
                  "that is AdamW's for every value (two moments); Muon keeps one momentum a "
                  "matrix value"),
            Wrong(lambda p: state(p, zero=0), "that is without ZeRO: stage 1 shards the "
                                              "optimizer state over the N GPUs"),
            Wrong(lambda p: state(p, key="total"), "that adds the parameters and gradients, "
                                                   "which stage 1 keeps whole"),
        ],
        worked=lambda p: (f"Matrices {counts(p)[0]:,} values × 4 bytes (one momentum) + "
                          f"embedding {counts(p)[1]:,} × 8 (AdamW's two moments), over N = "
                          f"{p['n']}: {state(p):.2f} GiB (`calc.muon_state_bytes`, a MODEL), "
                          f"where AdamW for everything would keep "
                          f"{sum(counts(p)) * 8 / p['n'] / GiB:.2f}."),
    )


LETTERS = {"gather": "a", "owner": "b", "tp": "c"}
NO_TP = " With tp = 1 there is nothing for the tp strategy to do."
# (ZeRO stage, dp, tp, s/u): the cases whose fewest-bytes strategy is strict (ZeRO-0 with
# tp > 1 and short matrices ties gather with owner: left out)
CASES = [(0, dp, 1, k) for dp in (4, 8) for k in (4, 32)] + \
        [(0, dp, tp, 32) for dp in (4, 8) for tp in (2, 4)] + \
        [(1, dp, tp, k) for dp in (4, 8) for tp in (1, 2, 4) for k in (4, 32)]


def strategy_bytes(p) -> dict:
    """MODEL bytes per GPU per step of each strategy possible here (tp needs tp > 1)."""
    u = 1024
    matrices = [(u, p["k"] * u, 1)] * 8  # split along its long side, the columns
    return {s: muon_comm_bytes(matrices, s, dp=p["dp"], tp=p["tp"], zero_stage=p["zero"],
                               bytes_per=2)["total"]
            for s in LETTERS if s != "tp" or p["tp"] > 1}


def ranked(p) -> list[str]:
    """The letters from the fewest bytes to the most; "c" last where tp = 1 rules it out."""
    sent = strategy_bytes(p)
    return [LETTERS[s] for s in sorted(sent, key=sent.get)] + (["c"] if p["tp"] == 1 else [])


def which_strategy(seed=None) -> Question:
    def right(p):
        return ranked(p)[0]

    def worked(p):
        sent = strategy_bytes(p)
        best = min(sent, key=sent.get)
        listed = ", ".join(f"{s} {b / MiB:,.1f} MiB" for s, b in sent.items())
        return (f"`calc.muon_comm_bytes` (a MODEL) per GPU per step: {listed}: {best} sends "
                f"the fewest, answer {LETTERS[best]}. ZeRO-0 keeps every matrix whole on every "
                "dp rank, so gather sends nothing over dp; from ZeRO-1 on owner's two "
                "all-to-alls carry 2/dp of gather's all-gather; tp's Gram all-reduces (5 "
                "iterations of u² each) beat gathering a u×s matrix only when s > 10u.")

    return Question(
        key="22.which-strategy", seed=seed, kind="choice",
        draw=lambda rng: dict(zip(("zero", "dp", "tp", "k"), rng.choice(CASES), strict=True)),
        text=lambda p: (f"Muon over dp = {p['dp']} × tp = {p['tp']} at ZeRO-{p['zero']}. The "
                        "hidden matrices are 8 matrices of u × s with u = 1024 and s = "
                        f"{p['k']}u; tensor parallelism splits each along s (its columns)."
                        f"{NO_TP if p['tp'] == 1 else ''}"
                        " Which strategy sends the fewest bytes per GPU per step? Answer 'a', "
                        "'b' or 'c': (a) gather; (b) owner; (c) tp."),
        right=right,
        wrong=[
            Wrong(lambda p: ranked(p)[1], "that one comes second here: at ZeRO-0 gather "
                                          "sends nothing over dp (every rank holds every "
                                          "matrix) and owner must send its results out; "
                                          "from ZeRO-1 on owner's two all-to-alls carry 2/dp "
                                          "of gather's all-gather; tp's Gram all-reduces "
                                          "beat gathering the tp blocks only when s > 10u"),
            Wrong(lambda p: ranked(p)[2], "that one sends the most here, or (with tp = 1) "
                                          "does not exist: count each strategy's bytes as "
                                          "the worked answer does"),
        ],
        worked=worked,
    )


QUESTIONS = {"22.owner-bytes": owner_bytes, "22.state-bytes": state_bytes,
             "22.which-strategy": which_strategy}
