"""Published training throughputs `minitp.calc.accuracy` sets mt.calc's model beside.

Copied by hand, never downloaded at run time; each row names its source (repository +
file + table, or paper + table). Megatron-Bridge's rows are the "25.11 NeMo Container"
tables of `NVIDIA-NeMo/Megatron-Bridge`, `docs/performance-summary.md` (as stored at commit
df0289c180dd20ff26933455c7a0a11084f6a36f, where the DGX-H100 Qwen3_235B row prints its
GBS; an older copy leaves that cell out). A result printed in parentheses (the FP8-MX
recipe beside FP8-CS) is a row of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MB_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md, "
             "25.11 NeMo Container, System: {}")
TITAN_SOURCE = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, "
                "Table {}")

LLAMA3_SOURCE = ("Dubey et al. 2024 ('The Llama 3 Herd of Models'), Table 3: layers, width, "
                 "FFN width, heads, 8 K/V heads; vocabulary 128,256, the released config.json")
GPT_SOURCE = ("Megatron-LM's GPTs: Shoeybi et al. 2019, Table 1; Korthikanti et al. 2022, "
              "Table 3; vocabulary 51,200")
LLAMA3 = {
    "LLAMA3_8B": dict(n_layer=32, d_model=4096, ffn_hidden=14336, n_head=32),
    "LLAMA3_70B": dict(n_layer=80, d_model=8192, ffn_hidden=28672, n_head=64),
    "LLAMA3.1_405B": dict(n_layer=126, d_model=16384, ffn_hidden=53248, n_head=128),
}
# Megatron-LM's GPTs (GPT_SOURCE): (layers, width, heads).
GPT = {
    "22B": (48, 6144, 64), "175B": (96, 12288, 96), "530B": (105, 20480, 128),
    "1T": (128, 25600, 160), "1.2B": (40, 1536, 16), "2.5B": (54, 1920, 20),
    "4.2B": (64, 2304, 24), "8.3B": (72, 3072, 32),
}
# What mt.calc's FLOPs cannot express of each MoE model (its experts are 4h wide, 16h²
# FLOPs a token each; its attention is h wide with q, k, v and o projections).
UNMODELLED = {
    "DeepSeekV3": "multi-head latent attention; experts 2048 wide on h = 7168",
    "GPT OSS 120B": "experts 2880 wide on h = 2880; 64 heads of 64 (4096 ≠ h); "
                    "sliding-window layers",
    "Qwen3_30B_a3B": "experts 768 wide on h = 2048; 32 heads of 128 (4096 ≠ h)",
    "Qwen3_235B_a22B": "experts 1536 wide on h = 4096; 64 heads of 128 (8192 ≠ h)",
}


@dataclass(frozen=True)
class Published:
    """One published run: its layout and what it printed (None: not printed)."""

    source: str
    system: str  # a `minitp.calc.CLUSTERS` key, or the system's name where there is none
    model: str
    gpus: int
    precision: str
    gbs: int  # sequences per step
    mbs: int
    seq: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    ep: int = 1
    zero: int = 0  # 3: FSDP (Megatron-Bridge's FSDP = 1, torchtitan's FSDP)
    tokens_per_gpu: float | None = None  # tokens / s / GPU
    tflops: float | None = None  # model TFLOP/s per GPU
    step_s: float | None = None  # seconds per step
    mfu: float | None = None  # model FLOPs utilisation
    recompute: str | None = None
    causal: bool = True  # the attention kernel, and the FLOPs convention of tflops/mfu
    notes: tuple = field(default_factory=tuple)  # what the row assumes, where not printed


def _mb(system, model, gpus, precision, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, tokens,
        tflops):
    """One printed row (its columns in the table's order, GA left out: GBS/(dp·MBS)); a
    pair (FP8-CS, FP8-MX) in precision, tokens and tflops is two rows."""
    pairs = (precision, tokens, tflops) if isinstance(tokens, tuple) else (
        (precision,), (tokens,), (tflops,))
    return [Published(MB_SOURCE.format(system), {"DGX-H100": "h100", "DGX-B200": "b200"}.get(
        system, system), model, gpus, p, gbs, mbs, seq, tp, pp, cp, vp, ep, 3 * fsdp, t, f,
        notes=("Megatron's sequence parallelism with tp > 1",))
        for p, t, f in zip(*pairs, strict=True)]


CS_MX = ("FP8-CS", "FP8-MX")
MEGATRON_BRIDGE = [r for rows in (
    _mb("DGX-GB300", "LLAMA3_8B", 8, CS_MX, 128, 2, 8192, 0, 1, 1, 1, 1, 1, (37556, 36108),
        (1933, 1858)),
    _mb("DGX-GB300", "LLAMA3_70B", 64, "FP8-CS", 256, 2, 8192, 1, 1, 1, 1, 1, 1, 4520, 2030),
    _mb("DGX-GB300", "LLAMA3.1_405B", 256, "FP8-CS", 1536, 1, 8192, 0, 2, 8, 2, 4, 1, 999,
        2522),
    _mb("DGX-GB300", "DeepSeekV3", 256, "BF16", 4096, 1, 4096, 0, 1, 2, 1, 4, 32, 3848, 961),
    _mb("DGX-GB300", "DeepSeekV3", 256, "FP8-MX", 4096, 1, 4096, 0, 1, 2, 1, 4, 32, 4357, 1088),
    _mb("DGX-GB300", "GPT OSS 120B", 64, "BF16", 1280, 2, 8192, 0, 1, 1, 1, 1, 64, 18347, 565),
    _mb("DGX-GB300", "Qwen3_30B_a3B", 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 28934, 666),
    _mb("DGX-GB300", "Qwen3_235B_a22B", 256, "BF16", 8192, 2, 4096, 0, 1, 4, 1, 12, 16, 6131,
        907),
    _mb("DGX-GB200", "LLAMA3_8B", 8, CS_MX, 128, 2, 8192, 0, 1, 1, 1, 1, 1, (31508, 29789),
        (1622, 1533)),
    _mb("DGX-GB200", "LLAMA3_70B", 64, "FP8-CS", 256, 2, 8192, 1, 1, 1, 1, 1, 1, 4312, 1937),
    _mb("DGX-GB200", "LLAMA3.1_405B", 256, "FP8-CS", 1536, 1, 8192, 0, 4, 16, 1, 4, 1, 813,
        2053),
    _mb("DGX-GB200", "DeepSeekV3", 256, "BF16", 4096, 1, 4096, 0, 1, 4, 1, 4, 64, 3139, 782),
    _mb("DGX-GB200", "DeepSeekV3", 256, "FP8-MX", 4096, 1, 4096, 0, 1, 8, 1, 4, 32, 4018, 1003),
    _mb("DGX-GB200", "GPT OSS 120B", 64, "BF16", 1280, 1, 8192, 0, 1, 1, 1, 1, 64, 15876, 488),
    _mb("DGX-GB200", "Qwen3_30B_a3B", 8, "FP8-MX", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 23766, 547),
    _mb("DGX-GB200", "Qwen3_235B_a22B", 256, "BF16", 8192, 1, 4096, 0, 1, 8, 1, 3, 32, 4916,
        728),
    _mb("DGX-B200", "LLAMA3_8B", 8, CS_MX, 128, 2, 8192, 0, 1, 1, 1, 1, 1, (30624, 29521),
        (1576, 1519)),
    _mb("DGX-B200", "LLAMA3.1_405B", 128, CS_MX, 64, 1, 8192, 0, 4, 8, 2, 8, 1, (661, 624),
        (1667, 1576)),
    _mb("DGX-B200", "DeepSeekV3", 256, "FP8-MX", 2048, 1, 4096, 0, 1, 16, 1, 1, 8, 2139, 557),
    _mb("DGX-B200", "GPT OSS 120B", 64, "BF16", 512, 4, 4096, 0, 1, 1, 1, 1, 8, 8213, 223),
    _mb("DGX-B200", "Qwen3_30B_a3B", 8, "FP8-MX", 512, 1, 4096, 0, 1, 1, 1, 1, 8, 9299, 214),
    _mb("DGX-B200", "Qwen3_235B_a22B", 64, "FP8-MX", 1024, 1, 4096, 0, 1, 8, 1, 2, 8, 3269, 484),
    _mb("DGX-H100", "LLAMA3_8B", 8, "FP8-CS", 128, 1, 8192, 1, 1, 1, 1, 1, 1, 14451, 744),
    _mb("DGX-H100", "LLAMA3_70B", 64, "FP8-CS", 128, 1, 8192, 0, 4, 8, 1, 5, 1, 1602, 719),
    _mb("DGX-H100", "LLAMA3.1_405B", 1024, "FP8-CS", 512, 1, 8192, 0, 8, 8, 2, 8, 1, 292, 737),
    _mb("DGX-H100", "GPT OSS 120B", 64, "BF16", 512, 4, 4096, 0, 1, 4, 1, 1, 8, 5630, 153),
    _mb("DGX-H100", "Qwen3_30B_a3B", 16, "FP8-CS", 512, 2, 4096, 0, 1, 2, 1, 24, 8, 5275, 121),
    _mb("DGX-H100", "Qwen3_235B_a22B", 256, "FP8-CS", 2048, 1, 4096, 0, 2, 8, 1, 4, 32, 1575,
        233),
) for r in rows]

_TITAN_NOTES = ("sequence length not printed: 8192 assumed (torchtitan's Llama 3 8B "
                "config)", "its H100s are 96 GB HBM2e at 500 W, below the SXM peak "
                "mt.calc uses (the file's footnote 2)")
TORCHTITAN = [
    Published(TITAN_SOURCE.format(n), "h100", "LLAMA3_8B", gpus, precision, 2 * gpus, 2, 8192,
              zero=3, tokens_per_gpu=tps, recompute="selective", notes=_TITAN_NOTES + (
                  "torchtitan's selective checkpointing as Korthikanti et al.'s",) + extra)
    for n, gpus in ((1, 8), (3, 128))
    for precision, tps, extra in (("BF16", {8: 5762, 128: 5605}[gpus], ()),
                                  ("BF16", {8: 6667, 128: 6514}[gpus],
                                   ("torch.compile: not modelled",)),
                                  ("Float8", {8: 8532, 128: 8380}[gpus], ()))
]

# Dubey et al. 2024, Table 4: Llama 3 405B in BF16 on H100s; TFLOP/s per GPU and MFU as
# printed, no step time (16M tokens a step); batch per data-parallel rank × dp sequences.
LLAMA3_PAPER = [
    Published("Dubey et al. 2024 (Llama 3), Table 4", "h100", "LLAMA3.1_405B", gpus, "BF16",
              per_dp * dp, 1, seq, tp=8, pp=16, cp=cp, tflops=tflops, mfu=mfu,
              notes=("micro-batch not printed: 1 assumed", "the FLOPs convention of its "
                     "TFLOP/s is not printed: causal attention assumed"))
    for gpus, cp, dp, seq, per_dp, tflops, mfu in (
        (8192, 1, 64, 8192, 32, 430, 0.43), (16384, 1, 128, 8192, 16, 400, 0.41),
        (16384, 16, 8, 131072, 16, 380, 0.38))
]

# Korthikanti et al. 2022, Table 5 (seconds per step and MFU, sequence parallelism with
# selective recomputation, A100s) on their Table 3's layouts (t = 8, dp = 1), as
# tests/calc/test_calc.py recalls them; their MFU counts full attention (Eq. 7).
KORTHIKANTI = [
    Published("Korthikanti et al. 2022, Tables 3 and 5", "a100", name, gpus, "BF16", gbs, 1,
              2048, tp=8, pp=gpus // 8, step_s=seconds, mfu=mfu, recompute="selective",
              causal=False, notes=("micro-batch 1 and no interleaving assumed",))
    for name, gpus, gbs, seconds, mfu in (("22B", 8, 4, 1.10, 0.415),
                                          ("175B", 64, 64, 13.75, 0.514),
                                          ("530B", 280, 280, 37.83, 0.560),
                                          ("1T", 512, 512, 71.49, 0.563))
]

# Shoeybi et al. 2019 (Megatron-LM) weak scaling on DGX-2H V100s, sequence 1024, 8
# sequences per model replica: the t-th model on t GPUs keeps 100/96/82/77% of one GPU's
# FLOP/s (Fig. 5), and 8.3B on 512 GPUs (t = 8, 64 replicas) 76% (§1, 15.1 PFLOP/s), as
# tests/calc/test_calc.py and lesson 16 cite them. (model, GPUs, tp, published efficiency)
WEAK_SCALING = [("1.2B", 1, 1, 1.00), ("2.5B", 2, 2, 0.96), ("4.2B", 4, 4, 0.82),
                ("8.3B", 8, 8, 0.77), ("8.3B", 512, 8, 0.76)]
WEAK_SOURCE = "Shoeybi et al. 2019 (Megatron-LM), Fig. 5 and §1"
