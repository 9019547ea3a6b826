"""Lessons 14 to 18: scaling, planning, the claims, ZeRO, experts.

Not checked (a reasoning, not a number the library computes): 14.lower-comm-share,
15.make-it-fit, 16.sixteen-bytes, 18.stats-group."""

import math

from answers_common import GiB, asked, close
from test_answers_00_09 import korthikanti

import minitp as mt

NOT_CHECKED = {"14.lower-comm-share", "15.make-it-fit", "16.sixteen-bytes", "18.stats-group"}


# Shoeybi et al. 2019, Table 1: t -> (hidden size, heads, layers); sequence 1024. Written out
# here, not imported from the lab (importing a lab marks a test `ranks`).
MEGATRON_FAMILY = {1: (1536, 16, 40), 2: (1920, 20, 54), 4: (2304, 24, 64), 8: (3072, 32, 72)}


def megatron(t):
    h, heads, layers = MEGATRON_FAMILY[t]
    return mt.GPTConfig(vocab_size=51200, seq_len=1024, n_layer=layers, n_head=heads, d_model=h)


def test_14_weak_efficiency():
    for _, p, right in asked("14.weak-efficiency"):
        f1 = mt.calc.flops_per_iteration(megatron(1), 8)
        ft = mt.calc.flops_per_iteration(megatron(p["t"]), 8)
        assert close(right, 100 * (ft / (p["t"] * p["tt"])) / (f1 / p["t1"]))


def test_15_first_stage_activations():
    from minitp.course.questions import lesson15
    for _, p, right in asked("15.first-stage-activations"):
        cfg = lesson15.MODELS[p["model"]]
        layer = korthikanti(cfg.seq_len, 1, cfg.d_model, cfg.n_head, p["tp"], True, False)
        held = min(p["pp"], p["m"]) * cfg.n_layer // p["pp"] * layer  # 1F1B: p in flight
        assert close(right, held / GiB, rel=0.01), p  # the calc adds the embedding's extras


def test_16_states_and_days():
    bytes_a_parameter = {"adam-mixed": 16, "megatron": 18}
    for _, p, right in asked("16.state-gb"):
        per_gpu = p["billions"] * 10**9 // p["gpus"]
        assert close(right, bytes_a_parameter[p["layout"]] * per_gpu / 10**9)
    peaks = {"A100": 312e12, "H100": 989e12}
    for _, p, right in asked("16.training-days"):
        flops = (8 if p["full"] else 6) * p["tokens"] * 1e9 * p["billions"] * 1e9
        seconds = flops / (p["gpus"] * peaks[p["gpu"]] * p["eff"])
        assert close(right, seconds / 86400, rel=0.01), p


def test_17_zero_stage_and_break_even():
    from minitp.course.questions import lesson17
    for _, p, right in asked("17.which-stage"):
        psi, n = p["billions"] * 10**9, p["n"]
        stages = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n]
        lowest = next(s for s, b in enumerate(stages) if b / GiB <= p["budget"])
        assert right == "abcd"[lowest], p
    for _, p, right in asked("17.break-even"):
        cfg = lesson17.MODELS[p["model"]]
        h, layers, t, n = cfg.d_model, cfg.n_layer, p["t"], p["n"]
        psi = 12 * layers * h * h
        zero3 = 3 * (n - 1) / n * 2 * psi  # gather forward, gather backward, reduce-scatter
        tp_token = 4 * 2 * (t - 1) / t * h * 2 * layers  # 4 all-reduces of h bf16 a token
        assert close(right, zero3 / (t * tp_token)), p


def test_18_experts():
    for _, p, right in asked("18.capacity"):
        assert right == math.ceil(p["f"] * p["T"] * p["k"] / p["E"])  # GShard's capacity
    for _, p, right in asked("18.a2a-bytes"):
        rows = p["tokens"] * p["k"]  # dispatch and combine, forward and backward: 4 all-to-alls
        assert close(right, 4 * rows * p["d"] * 2 * (p["ep"] - 1) / p["ep"] / 1e6)
