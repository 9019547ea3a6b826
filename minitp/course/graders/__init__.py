"""The registry of exercises: which file each one is, and the checks that grade it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import (
    ex00,
    ex01,
    ex02,
    ex03,
    ex04,
    ex05,
    ex06,
    ex07,
    ex08,
    ex09,
    ex10,
    ex11,
    ex12,
    ex13,
    ex14,
    ex15,
    ex16,
    ex17,
    ex18,
    ex19,
    ex20,
    ex21,
    ex22,
    ex23,
    ex24,
    ex25,
    ex26,
    ex27,
    ex28,
)


@dataclass(frozen=True)
class Exercise:
    filename: str  # the same name in exercises/ and solutions/
    title: str
    run: Callable  # run(module) -> list[Check]


EXERCISES = {
    "ex00": Exercise("ex00_mesh_coordinates.py", "a rank's place in the (dp, pp, tp) mesh",
                     ex00.run),
    "ex01": Exercise("ex01_ring_allreduce.py", "ring all-reduce from send/recv", ex01.run),
    "ex02": Exercise("ex02_column_row_parallel.py", "f, g and the column- and row-parallel "
                     "layers", ex02.run),
    "ex03": Exercise("ex03_tensor_parallel_block.py", "a tensor-parallel transformer block",
                     ex03.run),
    "ex04": Exercise("ex04_vocab_parallel_loss.py", "the vocab-parallel cross-entropy",
                     ex04.run),
    "ex05": Exercise("ex05_sequence_parallel.py",
                     "sequence parallelism: the all-gather / reduce-scatter pair", ex05.run),
    "ex06": Exercise("ex06_summa_backward.py", "SUMMA's backward: the gradients of a 2D "
                     "tensor-parallel linear layer", ex06.run),
    "ex07": Exercise("ex07_selective_recompute.py",
                     "selective recomputation of the attention core", ex07.run),
    "ex08": Exercise("ex08_online_softmax.py", "the online-softmax merge, the load-balanced "
                     "split and the ring step that uses it", ex08.run),
    "ex09": Exercise("ex09_kv_heads_and_positions.py", "a tensor-parallel rank's K/V heads, "
                     "who shares them, and a context-parallel rank's positions", ex09.run),
    "ex10": Exercise("ex10_ulysses_all_to_all.py", "Ulysses' two all-to-alls (heads for "
                     "positions and back) and grouped-query K/V before them", ex10.run),
    "ex11": Exercise("ex11_one_f_one_b.py", "a 1F1B pipeline stage's executor", ex11.run),
    "ex12": Exercise("ex12_zb_h1_order.py", "ZB-H1's order for one pipeline stage, through "
                     "the custom-schedule API", ex12.run),
    "ex13": Exercise("ex13_bucketed_sync.py", "bucketed gradient sync, overlapped with backward",
                     ex13.run),
    "ex14": Exercise("ex14_sharded_checkpoint.py", "what each rank writes and reads when a "
                     "ZeRO-1, tp = 2 checkpoint is loaded at tp = 1, dp = 4", ex14.run),
    "ex15": Exercise("ex15_image_tokens.py", "a vision-language model's image tokens on a "
                     "sequence-parallel rank, and whose gradient the encoder sums", ex15.run),
    "ex16": Exercise("ex16_tp_step_time.py", "a tensor-parallel step's compute and "
                     "communication, predicted", ex16.run),
    "ex17": Exercise("ex17_choose_a_plan.py", "choose (dp, pp, tp, recompute, ZeRO) under a "
                     "memory cap, and say why", ex17.run),
    "ex18": Exercise("ex18_tp_decode_step.py", "a tensor-parallel decode step: which rank "
                     "keeps which heads' KV cache, and where the one all-reduce goes", ex18.run),
    "ex19": Exercise("ex19_refit_plan.py", "the refit plan of one weight: which rank sends "
                     "which slice to which, from (pp 2, tp 2) to tp 4", ex19.run),
    "ex20": Exercise("ex20_bytes_and_days.py", "two claims checked by hand: model-state GB "
                     "and training days", ex20.run),
    "ex21": Exercise("ex21_zero3_unit.py", "a ZeRO-3 unit's memory: free the gathered "
                     "storage, refill it in place for backward, free it again", ex21.run),
    "ex22": Exercise("ex22_owner_assignment.py", "Muon's owner strategy: each matrix's home "
                     "by longest processing time first, one all-to-all there and one back",
                     ex22.run),
    "ex23": Exercise("ex23_amax_groups.py", "FP8's amax groups: which ranks share each scale "
                     "of a tensor-parallel MLP, with and without SP", ex23.run),
    "ex24": Exercise("ex24_block_atomic_shards.py", "block-atomic shards: where ZeRO-3 may cut "
                     "a weight that travels in MXFP8 or NVFP4", ex24.run),
    "ex25": Exercise("ex25_dtensor_placements.py", "what each rank keeps of a Llama block "
                     "under PyTorch's TP plan and FSDP2: placements, local shapes, bytes",
                     ex25.run),
    "ex26": Exercise("ex26_moe_dispatch.py", "expert parallelism's dispatch and combine",
                     ex26.run),
    "ex27": Exercise("ex27_mla_tp_plan.py", "latent attention's tensor-parallel plan: which "
                     "projections are split or replicated, and whose gradients are summed",
                     ex27.run),
    "ex28": Exercise("ex28_find_the_bug.py", "find the bug in a broken run drawn from the "
                     "museum, and fix it", ex28.run),
}
