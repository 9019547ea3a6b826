"""Lesson 07's questions: a layer's bytes with selective recomputation, the HFU a run with
full recomputation reports, and which recomputation to choose when memory is short."""

from __future__ import annotations

from types import SimpleNamespace

from ...calc.counts.flops import flops_per_iteration, model_flops
from ...calc.counts.params import params_per_rank
from ...calc.footprint.memory import activation_bytes, activation_bytes_per_layer, model_state_bytes
from ...calc.network.cluster import GB, H100_80GB
from .form import Question, Wrong

# (layers l, hidden h, heads a) of published models, sequence length 2048 and a vocabulary of
# 51,200 (GPT-3: Brown et al. 2020, Table 2.1; 22B: Korthikanti et al. 2022, Table 3).
MODELS = {"GPT-3 6.7B": (32, 4096, 32), "the 22B model": (48, 6144, 64),
          "GPT-3 175B": (96, 12288, 96)}
SOURCES = {"GPT-3 6.7B": "Brown et al. 2020, Table 2.1", "GPT-3 175B": "Brown et al. 2020, "
           "Table 2.1", "the 22B model": "Korthikanti et al. 2022, Table 3"}


def _cfg(name, s=2048):
    layers, h, a = MODELS[name]
    return SimpleNamespace(n_layer=layers, d_model=h, n_head=a, seq_len=s, vocab_size=51200,
                           bias=True)


def selective_bytes(seed=None) -> Question:
    def draw(rng):
        return {"model": rng.choice(tuple(MODELS)), "s": rng.choice((2048, 4096)),
                "b": rng.choice((1, 2, 4)), "t": rng.choice((2, 4, 8))}

    def per_layer(p, sp=False, recompute="selective"):
        return activation_bytes_per_layer(_cfg(p["model"], p["s"]), p["b"], tp=p["t"], sp=sp,
                                          recompute=recompute)

    def sbh(p):
        return p["s"] * p["b"] * MODELS[p["model"]][1]

    return Question(
        key="07.selective-bytes", seed=seed, draw=draw,
        text=lambda p: (f"One transformer layer of {p['model']} (h = {MODELS[p['model']][1]}, "
                        f"a = {MODELS[p['model']][2]} heads: {SOURCES[p['model']]}) runs with "
                        f"tensor parallelism at t = {p['t']}, no sequence parallelism, and "
                        f"selective recomputation; s = {p['s']}, micro-batch b = {p['b']}. How "
                        "many bytes of activations does it keep for backward on one rank, by "
                        "Korthikanti et al.'s Table 2? (A number of bytes; within 1%.)"),
        right=per_layer,
        wrong=[
            Wrong(lambda p: per_layer(p, recompute=None),
                  "that keeps the attention core's 5as²b/t: selective recomputation drops the "
                  "softmax output, its dropout mask and output, and redoes them in backward"),
            Wrong(lambda p: per_layer(p, sp=True),
                  "that is 34sbh/t, with sequence parallelism: without it the 10sbh of "
                  "LayerNorm inputs, qkv and fc inputs and dropout masks is whole on every rank"),
            Wrong(lambda p: 2 * sbh(p),
                  "that is full recomputation's 2sbh, the layer's input alone"),
            Wrong(lambda p: 34 * sbh(p),
                  "that is 34sbh, the layer on one device: tensor parallelism splits 24sbh of "
                  "it by t"),
        ],
        worked=lambda p: (
            f"sbh = {p['s']}·{p['b']}·{MODELS[p['model']][1]} = {sbh(p):,}. Selective "
            "recomputation removes the 5as²b/t term; without sequence parallelism 10sbh stays "
            f"whole and 24sbh is split: sbh(10 + 24/t) = {sbh(p):,}·{10 + 24 / p['t']:g} = "
            f"{per_layer(p):,.0f} bytes, a MODEL (`minitp.calc.activation_bytes_per_layer`). "
            f"With sequence parallelism too it would be 34sbh/t = "
            f"{per_layer(p, sp=True):,.0f}."),
    )


def full_hfu(seed=None) -> Question:
    def draw(rng):
        return {"model": rng.choice(tuple(MODELS)), "mfu": rng.choice((30, 35, 40, 45))}

    def ratio(p):  # FLOPs executed with full recomputation over the model's FLOPs
        cfg = _cfg(p["model"])
        return flops_per_iteration(cfg, 1, recompute="full") / model_flops(cfg, 1)

    return Question(
        key="07.full-hfu", seed=seed, draw=draw,
        text=lambda p: (f"A run of {p['model']} ({SOURCES[p['model']]}: "
                        f"{MODELS[p['model']][0]} layers, h = {MODELS[p['model']][1]}; s = 2048, "
                        "vocabulary 51,200) with full recomputation reaches a model FLOPs "
                        f"utilisation of MFU = {p['mfu']}%. What hardware FLOPs utilisation (HFU) "
                        "does it report, counting the recomputed forward as Narayanan et al. "
                        "2021's Eq. 3 does (every layer's forward twice, the output layer once)? "
                        "(In percent; within 1%.)"),
        right=lambda p: p["mfu"] * ratio(p),
        wrong=[
            Wrong(lambda p: p["mfu"], "that is the MFU again: HFU counts the FLOPs the "
                                      "hardware executed, the recomputed forward included"),
            Wrong(lambda p: p["mfu"] * 3 / 4, "that divides by 4/3 where it should multiply: "
                                              "HFU is never below MFU"),
            Wrong(lambda p: p["mfu"] * 2, "that counts the recomputation as a second forward "
                                          "and backward; it is one forward more, a third of a "
                                          "step's FLOPs"),
        ],
        worked=lambda p: (
            "the model needs 72Bslh²(1 + s/6h + V/12lh) FLOPs a step (Korthikanti Eq. 7); with "
            "full recomputation the hardware executes 96Bslh²(1 + s/6h + V/16lh) (Narayanan "
            f"Eq. 3): {ratio(p):.4f} times as many, a shade under 4/3 because the output layer "
            f"is not recomputed. The same step time: HFU = {p['mfu']}% · {ratio(p):.4f} = "
            f"{p['mfu'] * ratio(p):.1f}% (`minitp.calc.flops_per_iteration`). The higher "
            "number does not mean faster training: MFU is the one to compare runs by."),
    )


def which_recompute(seed=None) -> Question:
    def draw(rng):  # b ≥ 4: TP + SP does not fit, selective does (checked in the tests)
        return {"b": rng.choice((4, 6, 8))}

    cfg = _cfg("the 22B model")
    states = model_state_bytes(params_per_rank(cfg, tp=8), optimizer="megatron")["total"]

    def acts(p, recompute):
        return activation_bytes(cfg, p["b"], tp=8, sp=True, recompute=recompute)

    def left():
        return H100_80GB.memory - states

    return Question(
        key="07.which-recompute", seed=seed, draw=draw, kind="choice",
        text=lambda p: ("The 22B model of Korthikanti et al. 2022 (Table 3: 48 layers, h = "
                        "6144, a = 64, s = 2048) trains on one node of 8 H100 80GB GPUs "
                        "(NVIDIA's datasheet; minitp.calc.H100_80GB counts 80 GiB) with tensor "
                        f"and sequence parallelism at t = 8 and micro-batch b = {p['b']}. Its "
                        f"model states take {states / GB:.1f} GB per GPU (18 bytes a parameter, "
                        "Megatron-LM's count). Counting only model states and activations (a "
                        "MODEL), which setting trains fastest among those that fit? Answer 'a', "
                        "'b', 'c' or 'd': (a) no recomputation; (b) selective recomputation; "
                        "(c) full recomputation; (d) none fits: raise t."),
        right=lambda p: "b",
        wrong=[
            Wrong(lambda p: "a", "without recomputation the activations alone, sbh/t·(34 + "
                                 "5as/h) a layer over 48 layers, take more than the memory "
                                 "the model states leave: it does not fit"),
            Wrong(lambda p: "c", "full recomputation fits too, but runs every layer's forward "
                                 "twice, a third more FLOPs (Korthikanti et al. Table 4: 27.2 "
                                 "against 20.3 ms a layer); selective fits for a few percent"),
            Wrong(lambda p: "d", "selective recomputation already fits: 34sbh/t a layer is "
                                 "about a quarter of what no recomputation keeps here"),
        ],
        worked=lambda p: (
            f"80 GiB = {H100_80GB.memory / GB:.1f} GB, less {states / GB:.1f} GB of model "
            f"states, leaves {left() / GB:.1f} GB. Activations, 48 layers at b = {p['b']} "
            f"(Table 2, `minitp.calc.activation_bytes`): no recomputation "
            f"{acts(p, None) / GB:.1f} GB (does not fit), selective "
            f"{acts(p, 'selective') / GB:.1f} GB, full {acts(p, 'full') / GB:.2f} GB. Both "
            "recomputations fit; selective costs a few percent of compute (the attention "
            "core's forward again), full a third more (a whole forward again). Choose "
            "selective; keep full for when nothing else fits. All of it a MODEL."),
    )


QUESTIONS = {"07.selective-bytes": selective_bytes, "07.full-hfu": full_hfu,
             "07.which-recompute": which_recompute}
