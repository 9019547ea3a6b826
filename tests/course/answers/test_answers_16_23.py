"""Lessons 16, 17, 20, 21 and 26: scaling, planning (and a run's model TFLOP/s), the claims,
ZeRO, experts.

20.sixteen-bytes, a letter the same for every draw, is in test_answers_choices.py.
Not checked: none."""

import math
import re

from answers_common import GiB, asked, close
from test_answers_00_10 import korthikanti

import minitp as mt

NOT_CHECKED = set()


# Shoeybi et al. 2019, Table 1: t -> (hidden size, heads, layers); sequence 1024. Written out
# here, not imported from the lab (importing a lab marks a test `ranks`).
MEGATRON_FAMILY = {1: (1536, 16, 40), 2: (1920, 20, 54), 4: (2304, 24, 64), 8: (3072, 32, 72)}


def megatron(t):
    h, heads, layers = MEGATRON_FAMILY[t]
    return mt.GPTConfig(vocab_size=51200, seq_len=1024, n_layer=layers, n_head=heads, d_model=h)


def test_14_weak_efficiency():
    for _, p, right in asked("16.weak-efficiency"):
        f1 = mt.calc.flops_per_iteration(megatron(1), 8)
        ft = mt.calc.flops_per_iteration(megatron(p["t"]), 8)
        assert close(right, 100 * (ft / (p["t"] * p["tt"])) / (f1 / p["t1"]))


def comm_over_compute(h, layers, t, batch, flops, cluster, s=1024, vocab=51200):
    """Lesson 16's closed form for tensor parallelism's communication over compute: the
    bandwidth term (2/9)(t-1)/h·F/B plus the latency term t(t-1)/9·αF/(bsh²), over the extra
    compute 1 + s/(6h) + V/(12lh). F: the GPU's achieved FLOP/s."""
    bandwidth = 2 / 9 * (t - 1) / h * flops / cluster.intra_bandwidth
    latency = t * (t - 1) / 9 * cluster.intra_latency * flops / (batch * s * h * h)
    return (bandwidth + latency) / (1 + s / (6 * h) + vocab / (12 * layers * h))


def test_14_lower_comm_share():
    clusters = {"v100": mt.calc.DGX2H_V100, "h100": mt.calc.H100_80GB}
    for _, p, right in asked("16.lower-comm-share"):
        h, _, layers = MEGATRON_FAMILY[p["t"]]
        t, b, cluster = p["t"], p["batch"], clusters[p["gpu"]]
        flops = 0.4 * cluster.peak_flops  # the question's 40% of peak
        ratio = {"a": comm_over_compute(h, layers, t, 2 * b, flops, cluster),
                 "b": comm_over_compute(h, layers, t, b, 2 * flops, cluster),
                 "c": comm_over_compute(2 * h, layers, t, b, flops, cluster),
                 "d": comm_over_compute(h, layers, 2 * t, b, flops, cluster)}
        assert right == min(ratio, key=ratio.get), p  # the share r/(1+r) grows with r


def test_15_first_stage_activations():
    from minitp.course.questions import lesson17
    for _, p, right in asked("17.first-stage-activations"):
        cfg = lesson17.MODELS[p["model"]]
        layer = korthikanti(cfg.seq_len, 1, cfg.d_model, cfg.n_head, p["tp"], True, False)
        held = min(p["pp"], p["m"]) * cfg.n_layer // p["pp"] * layer  # 1F1B: p in flight
        assert close(right, held / GiB, rel=0.01), p  # the calc adds the embedding's extras


def test_15_make_it_fit():
    # GPT-3 175B, t = 8, sequence parallelism, 1F1B, micro-batch 1, 18 bytes a parameter. The
    # busiest GPU (first stage) by hand: its states (12lh²/p + Vh)/t parameters (biases and
    # norms left out: < 0.1%) and l layers' activations (1F1B with m >= p); the step by
    # `mt.calc.step_time` (the question's model). Right: the fastest per sequence that fits.
    h, a, layers, s, vocab = 12288, 96, 96, 2048, 51200
    act = {None: korthikanti(s, 1, h, a, 8, True, False),
           "selective": korthikanti(s, 1, h, a, 8, True, True), "full": 2 * s * h / 8}
    for _, p, right in asked("17.make-it-fit"):
        d = p["n"] // 64
        options = {"a": (d, 8, "full", p["batch"]), "b": (d, 8, "selective", p["batch"]),
                   "c": (d // 2, 16, None, p["batch"]), "d": (d, 8, None, p["batch"] // 2)}
        cost = {}
        for key, (dp, pp, recompute, batch) in options.items():
            assert batch // dp >= pp  # 1F1B holds p microbatches of l/p layers: l layers
            states = 18 * (12 * layers * h * h / pp + vocab * h) / 8
            if (states + layers * act[recompute]) / GiB <= 0.9 * 80:
                cfg = mt.GPTConfig(vocab_size=vocab, seq_len=s, n_layer=layers, n_head=a, d_model=h)
                st = mt.calc.step_time(cfg, mt.calc.A100_80GB, dp=dp, pp=pp, tp=8, micro_batch=1,
                                       global_batch=batch, sp=True, recompute=recompute)
                cost[key] = st.total / batch
        assert right == min(cost, key=cost.get), p


def test_17_identity_tflops():
    # Megatron-LM's FLOPs per token by hand, from Dubey et al. 2024, Table 3's shapes (and
    # the released vocabulary): 6 per weight of q, k, v, o, the SwiGLU MLP and the head,
    # plus 6·s·h a layer (causal attention); times the tokens per second
    shapes = {"Llama 3 8B": (32, 4096, 1024, 14336), "Llama 3 70B": (80, 8192, 1024, 28672)}
    for _, p, right in asked("17.identity-tflops"):
        layers, h, kv, ffn = shapes[p["model"]]
        weights = layers * (2 * h * h + 2 * h * kv + 3 * h * ffn) + 128256 * h
        assert close(right, p["tokens"] * (6 * weights + 6 * p["s"] * h * layers) / 1e12), p

def test_16_states_and_days():
    bytes_a_parameter = {"adam-mixed": 16, "megatron": 18}
    for _, p, right in asked("20.state-gb"):
        per_gpu = p["billions"] * 10**9 // p["gpus"]
        assert close(right, bytes_a_parameter[p["layout"]] * per_gpu / 10**9)
    peaks = {"A100": 312e12, "H100": 989e12}
    for _, p, right in asked("20.training-days"):
        flops = (8 if p["full"] else 6) * p["tokens"] * 1e9 * p["billions"] * 1e9
        seconds = flops / (p["gpus"] * peaks[p["gpu"]] * p["eff"])
        assert close(right, seconds / 86400, rel=0.01), p


def test_17_zero_stage_and_break_even():
    from minitp.course.questions import lesson21
    for _, p, right in asked("21.which-stage"):
        psi, n = p["billions"] * 10**9, p["n"]
        stages = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n]
        lowest = next(s for s, b in enumerate(stages) if b / GiB <= p["budget"])
        assert right == "abcd"[lowest], p
    for _, p, right in asked("21.break-even"):
        cfg = lesson21.MODELS[p["model"]]
        h, layers, t, n = cfg.d_model, cfg.n_layer, p["t"], p["n"]
        psi = 12 * layers * h * h
        zero3 = 3 * (n - 1) / n * 2 * psi  # gather forward, gather backward, reduce-scatter
        tp_token = 4 * 2 * (t - 1) / t * h * 2 * layers  # 4 all-reduces of h bf16 a token
        assert close(right, zero3 / (t * tp_token)), p


def test_18_experts():
    for _, p, right in asked("26.capacity"):
        assert right == math.ceil(p["f"] * p["T"] * p["k"] / p["E"])  # GShard's capacity
    for _, p, right in asked("26.a2a-bytes"):
        rows = p["tokens"] * p["k"]  # dispatch and combine, forward and backward: 4 all-to-alls
        assert close(right, 4 * rows * p["d"] * 2 * (p["ep"] - 1) / p["ep"] / 1e6)


def test_18_stats_group():
    # Rank r = (dp_i·cp + cp_i)·tp + tp_i (tp fastest, then cp, then dp). The aux loss's
    # statistics are per sequence: summed over the ranks holding r's sequences, the same dp_i
    # (and tp_i, unless sequence parallelism splits the sequence over tp too). The bias's load
    # is per step: every rank that saw other tokens, the same tp_i unless under sp.
    for q, p, right in asked("26.stats-group"):
        dp, cp, tp, r = p["dp"], p["cp"], p["tp"], p["rank"]
        coords = {x: (x // (cp * tp), x // tp % cp, x % tp) for x in range(dp * cp * tp)}
        d, _, t = coords[r]
        if p["stat"] == "aux":
            group = [x for x, (xd, _, xt) in coords.items() if xd == d and (p["sp"] or xt == t)]
        else:
            group = [x for x, (_, _, xt) in coords.items() if p["sp"] or xt == t]
        options = dict(re.findall(r"\(([a-e])\) \[([\d, ]+)\]", q.text(p)))
        assert options[right] == ", ".join(map(str, group)), p
