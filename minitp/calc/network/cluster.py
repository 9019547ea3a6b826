"""GPU clusters: what a node computes, holds and moves, for `step_time`.

Bandwidths are per GPU, per direction (what one rank of a ring sends per
second). Vendors quote NVLink bidirectionally: V100's "300 GB/s" is 150 GB/s
each way. Latencies are order-of-magnitude assumptions (a few µs for a hop
inside a node, ~10 µs across InfiniBand), not published figures.

``memory_bandwidth`` is the GPU's own HBM, through which decoding reads its weights and
KV cache (`minitp.calc.inference.serving`); peak ÷ it is the balance point. The V100's is left
unset: its figure is not verified here.
"""

from __future__ import annotations

from dataclasses import dataclass

GB, GiB = 10**9, 2**30


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    peak_flops: float  # dense 16-bit tensor-core FLOP/s per GPU
    memory: int  # bytes per GPU
    intra_bandwidth: float  # bytes/s per GPU each way inside a node (NVLink/NVSwitch)
    inter_bandwidth: float  # bytes/s per GPU each way between nodes (its share of the NICs)
    intra_latency: float = 5e-6  # seconds per message hop inside a node
    inter_latency: float = 10e-6  # seconds per message hop between nodes
    memory_bandwidth: float | None = None  # bytes/s per GPU from its HBM (None: not sourced)

    @property
    def balance_point(self) -> float:
        """FLOPs per byte read at which the GPU is as busy computing as reading memory:
        peak FLOP/s ÷ HBM bytes/s. A kernel with less arithmetic intensity waits on memory."""
        if self.memory_bandwidth is None:
            raise ValueError(f"{self.name}: no sourced HBM bandwidth, so no balance point")
        return self.peak_flops / self.memory_bandwidth

    def link(self, span: int) -> tuple[float, float]:
        """(latency, bandwidth) of a group of ranks ``span`` consecutive ranks wide:
        inside one node when it fits, else limited by the inter-node links."""
        if span <= self.gpus_per_node:
            return self.intra_latency, self.intra_bandwidth
        return self.inter_latency, self.inter_bandwidth

    def collective_seconds(self, op: str, nbytes: float, n: int, span: int) -> float:
        """α–β time of a ring collective on a tensor of ``nbytes`` over ``n`` ranks
        (all-reduce: 2(n−1) steps of S/n; all-gather, reduce-scatter: n−1), or of
        one point-to-point send (``op="send"``)."""
        alpha, beta = self.link(span)
        if op == "send":
            return alpha + nbytes / beta
        if n == 1:
            return 0.0
        steps = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[op] * (n - 1)
        return steps * (alpha + nbytes / n / beta)


# Shoeybi et al. 2019 (Megatron-LM), §5: DGX-2H servers of 16 V100 SXM3 32GB,
# NVSwitch "300 GB/sec" between GPUs in a server, "100 GB/sec" between servers
# (8 InfiniBand adapters): 6.25 GB/s per GPU. Peak 130 TFLOP/s: their 39 TFLOP/s
# baseline is "30% of peak" (DGX-2H: 2.1 PFLOP/s over 16 GPUs).
DGX2H_V100 = Cluster("DGX-2H, 16x V100 32GB", 16, 130e12, 32 * GiB, 150 * GB, 100 * GB / 16)

# DGX A100 80GB: 8 GPUs, 312 TFLOP/s dense bf16, NVLink 3 "600 GB/s" (300 each way),
# 8x 200 Gb/s HDR InfiniBand per node: one 25 GB/s NIC per GPU (Narayanan et al.
# 2021, §5 ran on such nodes, 80GB and 8 NICs per node).
# HBM: "2,039 GB/s" for the A100 80GB SXM (NVIDIA A100 datasheet,
# nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, as reproduced by two independent pages;
# the PDF itself not read here).
A100_80GB = Cluster("DGX A100, 8x A100 80GB", 8, 312e12, 80 * GiB, 300 * GB, 25 * GB,
                    memory_bandwidth=2039 * GB)

# DGX H100: 8 GPUs, ~989 TFLOP/s dense bf16 (SXM), NVLink 4 "900 GB/s" (450 each way),
# 8x 400 Gb/s NDR InfiniBand per node: 50 GB/s per GPU. Sources: NVIDIA Technical Blog,
# "Introducing NVIDIA HGX H100" ("the NVLink bidirectional speed of 900 gigabytes per
# second"); NVIDIA DGX BasePOD reference architecture, "Core Components"
# (docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai):
# "eight single-port NVIDIA ConnectX-7 VPI ... up to 400 Gb/s InfiniBand/Ethernet".
# HBM: "3.35 TB/s" for the H100 SXM (NVIDIA H100 datasheet's table, as reproduced by two
# independent pages; the PDF itself not read here).
H100_80GB = Cluster("DGX H100, 8x H100 80GB", 8, 989e12, 80 * GiB, 450 * GB, 50 * GB,
                    memory_bandwidth=3350 * GB)

# DGX B200 (NVIDIA DGX B200 User Guide, "Introduction to NVIDIA DGX B200 Systems",
# docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html): 8 B200 GPUs with
# "1,440 GB total GPU memory" (180 GB each); "2 x 5th generation NVLink switches that provide
# 14.4 TB/s aggregate bandwidth": 1.8 TB/s per GPU both ways, NVLink 5's 900 GB/s each way;
# "8 x NVIDIA ConnectX-7 Single Port Cards", InfiniBand "Up to 400Gbps" (NDR): 50 GB/s per
# GPU, as on DGX H100. Peak: NVIDIA's HGX B200 table gives FP16/BF16 tensor cores 4.5 PFLOPS
# per GPU, a figure NVIDIA quotes with 2:4 sparsity: 2.25e15 dense (NOT checked against
# NVIDIA's own page here, only a reproduction of its table).
B200_180GB = Cluster("DGX B200, 8x B200 180GB", 8, 2.25e15, 180 * GB, 900 * GB, 50 * GB)

# The same node with XDR InfiniBand: one ConnectX-8 per GPU at 800 Gb/s (NVIDIA DOCA 2.9.0
# for ConnectX-8, "Changes and New Features": "800Gb/s line rate"): 100 GB/s per GPU. A
# hypothetical node (B200's figures, the faster NIC), for the two-level model's what-if.
B200_XDR = Cluster("8x B200 180GB, XDR 800 Gb/s per GPU", 8, 2.25e15, 180 * GB, 900 * GB,
                   100 * GB)

CLUSTERS = {"v100": DGX2H_V100, "a100": A100_80GB, "h100": H100_80GB, "b200": B200_180GB,
            "b200-xdr": B200_XDR}
