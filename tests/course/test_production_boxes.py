"""Where a lesson's choice differs from production (Megatron-LM, torchtitan, TransformerEngine,
PyTorch, NCCL, vLLM, Colossal-AI), it says so in a marked box: a quote that starts with the
header below and names the file that does it (a path such as `megatron/core/.../layers.py`)
or the repository (`owner/repo`). Which lessons carry boxes, and how many, is listed here, so a box
lost in an edit, or one added without a source, fails. Markdown only: no kernel runs."""

import json
import re
from pathlib import Path

HEADER = "> **Where minitp differs from production.**"
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"

# keyed by the name after the lesson's number, so a renumbering does not move a box
BOXES = {
    "collectives": 1,                # NCCL's algorithm choice against the ring
    "column_row_parallel": 1,        # Megatron-LM overlaps f's all-reduce with the wgrad GEMM
    "vocab_parallel": 1,             # Megatron-LM's fused loss: two all-reduces, not three
    "sequence_parallel": 1,          # Megatron-LM keeps the shard and gathers it again
    "two_d_tensor_parallel": 1,      # Colossal-AI's SUMMA: pipelined broadcasts, re-broadcast
    "activation_recomputation": 1,   # torchtitan's per-operator selective checkpointing
    "which_context_parallelism": 1,  # TransformerEngine's all-gather re-gathers K and V
    "pipeline_parallelism": 1,       # Megatron-LM frees a sent stage output's data
    "zero_bubble_pipelines": 1,      # PyTorch splits the whole stage graph into B and W
    "data_parallel_and_3d": 1,       # Megatron-LM's distributed optimizer overlaps its sums
    "when_a_rank_dies": 1,           # PyTorch DCP balances what the lowest holder writes
    "planning_a_run": 1,             # Megatron-LM's memory estimate adds embedding and loss
    "vision_language": 1,            # Megatron-LM sizes the first and last stages apart
    "serving_across_ranks": 2,       # vLLM's paged cache; its one-shot all-reduce
    "from_trainer_to_generator": 1,  # Megatron's metadata planner; TorchStore; SGLang's IPC
    "megatron_or_zero": 1,           # FSDP2 shards each parameter on its own
    "an_optimizer_that_needs_the_whole_matrix": 1,  # Megatron-LM's layer-wise layout: no exchange
    "eight_bits_across_ranks": 1,    # torchao's rowwise: e4m3 gradients, re-cast in backward
    "blocks_of_scales": 1,           # Megatron-FSDP gathers MXFP8 codes BlockAtomic(32)
    "mixture_of_experts": 1,         # Megatron-LM's capacity over the rank, by score
    "latent_attention_and_folded_experts": 1,  # attention-DP serving; torchtitan's EP >= TP
    "find_the_bug": 1,               # production diffs two runs (DebugMode, Flight Recorder)
}
# a file (a name with a source suffix) or a repository of production's (owner/name); not
# any a/b, which "$sbh/t$" would be
SOURCE = re.compile(r"\b[\w/-]+\.(?:py|cc|cu|cuh|h|md)\b"
                    r"|\b(?:NVIDIA|pytorch|vllm-project|deepspeedai|microsoft)/[\w.-]+")


def boxes(path):
    """Each box of a notebook: the run of quoted lines that starts with the header."""
    found = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        lines = "".join(cell["source"]).split("\n")
        for i, line in enumerate(lines):
            if line.startswith(HEADER):
                run = [line]
                for more in lines[i + 1:]:
                    if not more.startswith(">"):
                        break
                    run.append(more)
                found.append(" ".join(run))
    return found


def test_the_listed_lessons_carry_their_boxes_and_each_names_its_source():
    counts = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        found = boxes(path)
        if found:
            counts[path.stem[3:]] = len(found)
        for box in found:
            assert SOURCE.search(box[len(HEADER):]), (path.name, box)
    assert counts == BOXES
