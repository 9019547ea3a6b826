"""Lesson 19: every answer recomputed from Llama 3's Table 3 (Dubey et al. 2024) and the DGX
H100 preset's per-GPU InfiniBand, written out here, and from torchtitan's parity rule
(`experiments/rl/docs/bitwise_parity.md`: bitwise only at the same tensor parallelism
degree, with batch-invariant kernels) — never by the question's own formula nor
`mt.calc.refit_cost`.

Not checked: none."""

from answers_common import asked, close

NOT_CHECKED: set[str] = set()

# (layers, d_model, K/V heads, head dim, FFN width, vocabulary): Table 3
LLAMA3 = {"Llama 3 8B": (32, 4096, 8, 128, 14336, 128256),
          "Llama 3 70B": (80, 8192, 8, 128, 28672, 128256)}


def _params(name):
    layers, h, kv, d, f, vocab = LLAMA3[name]
    # q and o (h·h), k and v (K·d·h), SwiGLU's three h·f, two RMSNorm scales; the tied
    # embedding and the final norm, as minitp counts a Llama-style GPT
    return layers * (2 * h * h + 2 * kv * d * h + 3 * h * f + 2 * h) + vocab * h + h


def test_19_refit_bytes():
    for _, p, right in asked("19.refit-bytes"):
        slice_bytes = 2 * _params(p["name"]) / 8  # bf16, a tp-8 GPU's slice of every layer
        kept = slice_bytes / p["pp"] if p["serving"] == "collocated" else 0
        assert close(right, (slice_bytes - kept) / 1e9), p
        assert (p["name"], p["pp"]) != ("Llama 3 70B", 4), p  # not the lesson's printed case


def test_19_what_stays_equal():
    seen = set()
    for _, p, right in asked("19.what-stays-equal"):
        bitwise = p["invariant"] and p["trainer"] == p["generator"]
        assert right == ("a" if bitwise else "b"), p
        seen.add(right)
    assert seen == {"a", "b"}  # the seeds draw both answers
