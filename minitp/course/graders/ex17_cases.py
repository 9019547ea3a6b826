"""ex17's runs and its words: the six runs the learner plans, the tolerances, the
checks' names and the hints (see ex17.py for what each check asks)."""

from __future__ import annotations

from ... import calc
from ...model import GPTConfig

TOLERANCE = 0.10
MEMORY_TOLERANCE = 0.02  # relative: the calculator is exact; 2% lets a careful hand sum pass
BUBBLE_TOLERANCE = 1e-3  # relative: (p - 1)/m is exact arithmetic
CALLS_PER_RUN = 3
KEYS = ("dp", "pp", "tp", "recompute", "zero_stage")
WHY = ("memory_gib", "shallower_gib", "tp_stop", "bubble")
STOPS = {"node": "2·tp GPUs would span two nodes",
         "heads": "2·tp does not divide the heads",
         "cost": "2·tp was possible: it stopped for its cost, not a limit"}
NAMES = ["every plan is a valid split of the GPUs, the model and the batch",
         "every plan fits under its memory cap (calc.memory_per_gpu)",
         f"every plan's step time within {TOLERANCE:.0%} of the best calc.plan finds",
         f"why: the plan's memory and the shallower pipeline's, within {MEMORY_TOLERANCE:.0%}",
         "why: where tp stops (node, heads or cost) and the bubble (p - 1)/m",
         f"reasoned, not searched: no planner, at most {CALLS_PER_RUN} calculator calls a run"]
SHORTCUT = ("the point is to reason: the rules of lesson 17 give a plan, and a few calls of "
            "calc.memory_per_gpu and calc.step_time check it; the planner's answer is no reason")
SEARCH = ("a loop over the configurations that asks the calculator about each one is the "
          "planner again. Decide t, p, recompute and ZeRO with the rules (one GPU's worth "
          "first; tp up to a node; the shallowest pipeline that fits; ZeRO-1 is free; "
          "tp's all-reduces against the bubble), then check the plan")


def _gpt(h: int, a: int, layers: int) -> GPTConfig:
    return GPTConfig(vocab_size=51200, seq_len=2048, n_layer=layers, n_head=a, d_model=h)


GPT3 = _gpt(12288, 96, 96)
# (label, model, cluster, GPUs, global batch, memory cap in GiB)
CASES = (
    ("GPT-3 175B on 1024 A100s, batch 1536, 72 GiB", GPT3, calc.A100_80GB, 1024, 1536, 72),
    ("GPT-3 175B on 64 A100s, batch 64, 72 GiB", GPT3, calc.A100_80GB, 64, 64, 72),
    ("GPT 76B on 128 A100s, batch 512, 40 GiB", _gpt(10240, 80, 60), calc.A100_80GB, 128,
     512, 40),
    ("GPT 22B on 64 H100s, batch 256, 16 GiB", _gpt(6144, 64, 48), calc.H100_80GB, 64, 256,
     16),
    ("GPT 1.7B on 32 A100s, batch 512, 72 GiB", _gpt(2304, 24, 24), calc.A100_80GB, 32, 512,
     72),
    ("GPT 43B (60 heads) on 128 A100s, batch 512, 40 GiB", _gpt(7680, 60, 60), calc.A100_80GB,
     128, 512, 40),
)

PART_HINTS = {
    "compute": "recomputation repeats forward work: spend it only where memory demands it, "
               "and on the cheapest kind that fits.",
    "tp": "tensor parallelism all-reduces in every layer, and a GPU's share of them does not "
          "shrink as tp grows: is your tp larger than this model needs, or than a faster GPU "
          "can hide (halve tp, double pp, and weigh the bubble)?",
    "pp": "every pipeline boundary sends each microbatch's activations, both ways.",
    "dp": "the gradient reduction grows with the parameters a stage holds and with the links "
          "its group spans; ZeRO 2 and 3 repeat it every microbatch.",
    "bubble": "the bubble is (p - 1)/m of a stage's busy time: deep pipelines with few "
              "microbatches per replica idle.",
}
