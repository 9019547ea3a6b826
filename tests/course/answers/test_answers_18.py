"""Lesson 18: serving a model across ranks. Every answer is recomputed from the sources'
own numbers written out here (Llama 3's Table 3, NVIDIA's datasheet figures as minitp's
cluster presets quote them) and first principles — the cache's K and V per layer per kept
head, 2 FLOPs per weight, a ring all-reduce's 2(t−1) hops of S/t bytes, vLLM's one-shot
all-reduce's one hop and t−1 peers' buffers read (csrc/custom_all_reduce.cuh,
cross_device_reduce_1stage) — never by the question's own formula nor `mt.calc`'s.

Not checked: none."""

from answers_common import asked, close

NOT_CHECKED: set[str] = set()

# (layers, d_model, query heads, K/V heads, FFN width, vocabulary): Dubey et al. 2024, Table 3
LLAMA3 = {"Llama 3 8B": (32, 4096, 32, 8, 14336, 128256),
          "Llama 3 70B": (80, 8192, 64, 8, 28672, 128256)}
# (bf16 FLOP/s, HBM bytes/s, NVLink bytes/s each way): the DGX presets' figures
GPUS = {"A100 80GB": (312e12, 2039e9, 300e9), "H100 80GB": (989e12, 3350e9, 450e9)}
HOP = 5e-6  # the presets' assumed latency of one hop inside a node


def _kept(kv, tp):
    return kv // tp if kv % tp == 0 else 1  # split, or the one head copied


def test_18_kv_bytes():
    for _, p, right in asked("18.kv-bytes"):
        layers, d, heads, kv, _, _ = LLAMA3[p["name"]]
        k_and_v = 2 * layers * _kept(kv, p["tp"]) * (d // heads) * p["w"]
        assert close(right, k_and_v / 1024), p


def test_18_compute_bound():
    for _, p, right in asked("18.compute-bound"):
        peak, hbm, _ = GPUS[p["gpu"]]
        # 2·B·n FLOPs at peak against n·w bytes at hbm, for a GPU's n weights
        assert close(right, peak * p["w"] / (2 * hbm)), p


def _all_reduce(algorithm, tp, nbytes):
    _, _, link = GPUS["H100 80GB"]
    if tp == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (tp - 1) * (HOP + nbytes / tp / link)
    return HOP + (tp - 1) * nbytes / link  # every peer's whole buffer, one synchronisation


def _step(name, batch, context, tp, algorithm):
    layers, d, heads, kv, ffn, vocab = LLAMA3[name]
    head = d // heads
    per_layer = (2 * d * d + 2 * kv * head * d + 3 * d * ffn) // tp + 2 * d  # norms whole
    weights = layers * per_layer + vocab * d // tp + d
    peak, hbm, _ = GPUS["H100 80GB"]
    cache = batch * context * 2 * layers * _kept(kv, tp) * head * 2
    matmuls = max(2 * batch * weights / peak, 2 * weights / hbm)
    return cache / hbm + matmuls + 2 * layers * _all_reduce(algorithm, tp, batch * d * 2)


def test_18_tp_buys():
    for _, p, right in asked("18.tp-buys"):
        before = _step(p["name"], p["batch"], p["context"], p["tp"], p["allreduce"])
        after = _step(p["name"], p["batch"], p["context"], 2 * p["tp"], p["allreduce"])
        want = "a" if after <= before / 2 else "b" if after < before else "c"
        assert right == want, p
        # the question is not one the lesson prints: its batch-8 table
        assert p["batch"] != 8, p
