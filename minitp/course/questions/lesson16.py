"""Lesson 16's questions: weak-scaling efficiency from step times and FLOPs, and which change
lowers tensor parallelism's share of a step."""

from __future__ import annotations

from dataclasses import replace

from ...calc.counts.flops import flops_per_iteration
from ...calc.network.cluster import DGX2H_V100, H100_80GB
from ...calc.planning.timing import step_time
from ..labs.scaling import megatron_family, strong_efficiency, weak_efficiency
from .form import Question, Wrong

BATCH = 8  # global batch of the lesson's weak-scaling runs


def weak_eff(seed=None) -> Question:
    def draw(rng):
        # t = 2 is left out: there F_2 is within 1% of 2·F_1, so E and T1/T2 would coincide.
        t, t1 = rng.choice((4, 8)), rng.choice((200, 250, 300, 400))
        return {"t": t, "t1": t1, "tt": round(t1 * rng.choice((1.10, 1.20, 1.30, 1.45)))}

    def flops(t):
        return flops_per_iteration(megatron_family(t), BATCH)

    def right(p):
        return 100 * weak_efficiency(flops(1), p["t1"], flops(p["t"]), p["tt"], p["t"])

    return Question(
        key="16.weak-efficiency", seed=seed, draw=draw,
        text=lambda p: (f"A weak-scaling run of Megatron-LM's family (Shoeybi et al. 2019, Table "
                        f"1), global batch {BATCH}: the 1.2B model on one GPU does F_1 = "
                        f"{flops(1):.4e} FLOPs a step in T_1 = {p['t1']} ms; the t = {p['t']} "
                        f"model on {p['t']} GPUs does F_{p['t']} = {flops(p['t']):.4e} FLOPs a "
                        f"step in T_{p['t']} = {p['tt']} ms (timings made up for this "
                        "question, about an H100's). What is its weak-scaling efficiency E, "
                        "FLOP/s per GPU over one GPU's? (A percentage; within 1%.)"),
        right=right,
        wrong=[
            Wrong(lambda p: 100 * p["t1"] / p["tt"],
                  "that is the step-time ratio T_1/T_t: it equals E only when each GPU's share "
                  "F_t/t equals F_1, and in this family it is smaller"),
            Wrong(lambda p: 100 * strong_efficiency(p["t1"], p["tt"], p["t"]),
                  "that is the strong-scaling efficiency T_1/(t·T_t), for one model on more "
                  "GPUs; here the model grew with t, so its FLOPs count"),
            Wrong(lambda p: 100 * (flops(p["t"]) / p["tt"]) / (flops(1) / p["t1"]),
                  "that is the whole run's FLOP/s over one GPU's: divide by the t GPUs to get "
                  "the throughput per GPU"),
            Wrong(lambda p: 100 * (flops(1) / p["t1"]) / (flops(p["t"]) / (p["t"] * p["tt"])),
                  "that is the ratio upside down: one GPU's FLOP/s is the baseline, below"),
        ],
        worked=lambda p: (
            f"E = (F_t/(t·T_t)) / (F_1/T_1). Per GPU at t = {p['t']}: "
            f"{flops(p['t']):.4e}/({p['t']}·{p['tt'] / 1e3} s) = "
            f"{flops(p['t']) / p['t'] / (p['tt'] / 1e3) / 1e12:.1f} TFLOP/s; one GPU: "
            f"{flops(1):.4e}/{p['t1'] / 1e3} s = {flops(1) / (p['t1'] / 1e3) / 1e12:.1f} "
            f"TFLOP/s; E = {right(p):.1f}% (`scaling.weak_efficiency`). The plain ratio "
            f"T_1/T_t = {100 * p['t1'] / p['tt']:.1f}% flatters the larger run, whose GPUs each "
            f"did only {flops(p['t']) / p['t'] / flops(1):.2f} of one GPU's work."),
    )


CLUSTERS = {"v100": DGX2H_V100, "h100": H100_80GB}
SOURCES = {"v100": "a DGX-2H node of V100s (Shoeybi et al. 2019, §5: 130 TFLOP/s peak, "
                   "NVSwitch 150 GB/s each way)",
           "h100": "a DGX H100 node (NVIDIA's H100 datasheet, SXM: 989 TFLOP/s dense bf16, "
                   "NVLink 450 GB/s each way)"}


def _tp_share(cfg, cluster, t, batch):
    st = step_time(cfg, cluster, tp=t, micro_batch=batch, global_batch=batch, efficiency=0.4)
    return st.tp / st.total


def lower_comm_share(seed=None) -> Question:
    def draw(rng):
        return {"gpu": rng.choice(tuple(CLUSTERS)), "t": rng.choice((2, 4)),
                "batch": rng.choice((1, 8))}

    def shares(p):
        cfg, cluster, t, b = megatron_family(p["t"]), CLUSTERS[p["gpu"]], p["t"], p["batch"]
        wide = replace(cfg, d_model=2 * cfg.d_model, n_head=2 * cfg.n_head)
        fast = replace(cluster, peak_flops=2 * cluster.peak_flops)
        return {"now": _tp_share(cfg, cluster, t, b), "a": _tp_share(cfg, cluster, t, 2 * b),
                "b": _tp_share(cfg, fast, t, b), "c": _tp_share(wide, cluster, t, b),
                "d": _tp_share(cfg, cluster, 2 * t, b)}

    def text(p):
        cfg = megatron_family(p["t"])
        return (f"On {SOURCES[p['gpu']]}, Megatron-LM's t = {p['t']} model (h = {cfg.d_model}, "
                f"{cfg.n_layer} layers) trains with t = {p['t']} tensor-parallel GPUs, "
                f"{p['batch']} sequence{'s' if p['batch'] > 1 else ''} of {cfg.seq_len} tokens a "
                "step, at 40% of peak (this question's assumption): "
                f"`calc.step_time` puts its all-reduces at {shares(p)['now']:.1%} of the step (a "
                "MODEL). Which single change lowers that share the most, as this lesson's "
                "formula prices it? Answer 'a', 'b', 'c' or 'd': (a) twice the batch; (b) GPUs "
                "twice as fast, on the same links; (c) a model twice as wide (2h, twice the "
                f"heads), still on {p['t']} GPUs; (d) twice the GPUs, t = {2 * p['t']}.")

    return Question(
        key="16.lower-comm-share", seed=seed, draw=draw, kind="choice", text=text,
        right=lambda p: "c",
        wrong=[
            Wrong(lambda p: "a", "the batch appears only in the latency term: the bandwidth "
                                 "term, (2/9)·(t-1)/h·F/B, does not move, so the share barely "
                                 "falls"),
            Wrong(lambda p: "b", "a faster GPU raises F/B: the compute shrinks, the bytes do "
                                 "not, and communication's share grows"),
            Wrong(lambda p: "d", "more GPUs raise (t-1) in the bandwidth term and t(t-1) in the "
                                 "latency term: the share grows"),
        ],
        worked=lambda p: (
            "communication over compute is (2/9)·(t-1)/h·F/B + t(t-1)/9·αF/(bsh²): the width h "
            "divides both terms (h² the latency one). `calc.step_time`, a MODEL: now "
            f"{shares(p)['now']:.1%}; (a) {shares(p)['a']:.1%}, (b) {shares(p)['b']:.1%}, "
            f"(c) {shares(p)['c']:.1%}, (d) {shares(p)['d']:.1%}. Compute per token grows as "
            "h², tensor parallelism's bytes as h: wide layers are what keep it efficient."),
    )


QUESTIONS = {"16.weak-efficiency": weak_eff, "16.lower-comm-share": lower_comm_share}
