"""`mt.parallelize`: a plain GPT made into this rank's part of it, axis by axis.

A short sequence, as torchtitan's `parallelize_llama`; each step lives in its
axis's module, and a new axis is one more step:

1. tensor (+ sequence) parallelism — `minitp.tensor_parallel`: swap the plain
   layers for sharded ones, by a plan table;
2. context parallelism (cp > 1) — `minitp.context_parallel`: ring attention (or, by
   ``cp_comm``, K/V all-gathered, Ulysses' all-to-all, or both all-to-all and ring),
   each rank's global positions, the loss over the cp group;
   then expert parallelism — `minitp.expert_parallel`: each MoE layer's experts
   shared out over ep (folded into dp×cp), tokens exchanged by all-to-all, the
   routing statistics reduced over the ranks that split a sequence;
3. activation recomputation — `minitp.recompute`;
4. trace labels — name the pieces ("embedding", "layer3", "head", "loss") so
   every collective says what it belongs to;
5. pipeline stages — `minitp.pipeline`: this rank's runs of layers;
6. data parallelism — `minitp.data_parallel` (the gradient all-reduce), or
   `minitp.data_parallel.zero` (ZeRO: gradients, and at stage 3 parameters, sharded over dp)
   — over dp×cp (`Mesh.dp_cp`) with context parallelism, whose ranks also hold
   partial gradients of the same replicated parameters.

The model's forward is the plain GPT's own (`minitp.model`); the shard takes
its weights from the plain model, so the two compute the same function — which
the tests check, loss and every gradient.
"""

from __future__ import annotations

import copy

from .context_parallel.plan import apply_context_parallel, attention_axes
from .data_parallel.zero import attach_data_parallel
from .expert_parallel.plan import apply_expert_parallel
from .fp8.apply import apply_fp8
from .fp8.gather import attach_fp8_gather
from .mixed_precision import MASTER_DTYPE, attach_main_grads, dtype_name
from .model import GPT
from .parallel_gpt import ParallelGPT
from .pipeline.stages import PipelineGPT, embedding_axis, split_into_stages
from .recompute import apply_recompute
from .rules import check_parallel_config, layer_label
from .rules.fp8_groups import check_fp8_config
from .runtime import trace
from .runtime.mesh import Mesh
from .tensor_parallel.plan import apply_tensor_parallel
from .tensor_parallel.vision import apply_vision_parallel


def label_pieces(model: GPT) -> None:
    """Trace labels for the model's pieces (forward hooks: the model has no tracing code)."""
    trace.label_module(model.wte, "embedding")
    if model.cfg.vision_patches:
        trace.label_module(model.vision, "vision")
    for index, block in enumerate(model.blocks):
        trace.label_module(block, layer_label(index))
    trace.label_module(model.head, "head")
    trace.label_module(model.loss, "loss")


def check_plain_gpt(ref, who: str) -> None:
    """`ref` is a plain minitp GPT, not a rank's part of one: else a TypeError in one line.
    A parallel model holds its process groups (which cannot be copied: the raw error was
    "cannot pickle 'ProcessGroup'") and only its shard of the weights, so it cannot be split
    again. Every parallel model here, minitp's or torch's, carries the `mesh` it runs on."""
    if isinstance(ref, (ParallelGPT, PipelineGPT)) or getattr(ref, "mesh", None) is not None:
        raise TypeError(f"{who} takes the plain GPT, and this {type(ref).__name__} is already "
                        "one rank's parallel part: pass the plain model it came from")
    if not isinstance(ref, GPT):
        raise TypeError(f"{who} expects a minitp GPT, got {type(ref).__name__}")


def parallelize(ref: GPT, mesh: Mesh, sequence_parallel: bool = False, recompute=None,
                virtual_stages: int = 1, bucket_bytes: int = 1 << 20, zero_stage: int = 0,
                tp_overlap: bool = False, param_dtype=None, placement: str = "loop",
                vision_layout: str = "replicated", cp_comm: str = "ring",
                cp_a2a_size: int | None = None, fp8: str | None = None,
                fp8_local_scales: bool = False, fp8_all_gather: bool = False,
                pipeline_layout=None, validated: bool = False) -> ParallelGPT | PipelineGPT:
    """This rank's part of `ref` (weights copied from it) for the whole mesh.

    tp: every layer is sharded by the plan table. pp: the layers are cut into
    pp·virtual_stages equal stages; this rank holds stages r, r+pp, r+2pp, … (Megatron's
    round-robin), or with ``virtual_stages=2, placement="v"`` stages r and 2pp−1−r (the V
    the "zbv" and "dualpipev" schedules run on) — a `PipelineGPT`; without a pipeline, the
    single stage is a `ParallelGPT`. cp: each rank runs two chunks of every sequence
    (`train_step` splits them), attention by a ring over cp. dp: every stage gets a bucketed
    gradient all-reduce (`minitp.data_parallel.GradSync`, buckets of `bucket_bytes`; over
    dp×cp with cp > 1) that `train_step` arms for the last microbatch.

    zero_stage (ZeRO, over dp): 0 none; 1 the optimizer state sharded (the
    optimizer reduce-scatters the gradients at its step); 2 also the gradients
    (reduce-scattered unit by unit during backward); 3 also the parameters
    (gathered around each unit's forward and backward): `minitp.data_parallel.zero`. Make the
    optimizer with ``mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=…)``,
    which steps what this rank owns at that stage.

    tp_overlap: each layer's GEMMs chunked along the sequence and overlapped with
    sequence parallelism's all-gathers / reduce-scatters (`minitp.tensor_parallel.overlap`);
    needs sequence_parallel=True and tp > 1.

    param_dtype: None keeps `ref`'s dtype; ``torch.bfloat16`` is mixed precision
    (`minitp.mixed_precision`): bf16 parameters and activations, a float32
    ``main_grad`` per parameter that accumulates its gradients, and float32
    master weights in the optimizer `mt.make_optimizer` gives (at ZeRO stages 2 and
    3 the float32 shards are the masters, and the gradients are widened to float32
    as they are reduce-scattered).

    cp_comm (cp > 1): how attention meets the other cp ranks' keys (`minitp.rules.cp_comm`):
    "ring" (the default), "allgather" (K/V gathered once), "a2a" (Ulysses: an all-to-all to
    whole sequences of 1/cp of the heads and back), "a2a+ring" (the all-to-all inside groups
    of ``cp_a2a_size`` consecutive cp ranks, the ring across them).

    fp8 (`minitp.fp8`): "tensorwise", "delayed", "rowwise", "mxfp8" or "nvfp4" (block
    scales, every block whole on one rank or refused): every block's linear layer
    computes its GEMMs from FP8 operands (emulated), each amax reduced over the axes that split
    its tensor (`minitp.rules.fp8_groups`), so the model equals `minitp.fp8.convert(ref, fp8)`
    run in one process; fp8_local_scales=True: each rank's own amax instead (the trap);
    fp8_all_gather=True (tensorwise, zero_stage=3): the weights gathered in 8 bits with
    their scale (`minitp.fp8.gather`).

    pipeline_layout: which layers each of the pp·virtual_stages stages holds, when not
    n_layer/(pp·virtual_stages) each: a string like Megatron-LM's, ``"Et*3|t*2L"``, a list of
    layer counts per stage, ``[3, 2]``, or of each stage's layers (`minitp.rules.layouts`,
    docs/pipeline-layouts.md); the embedding on the first stage, the head on the last.

    validated: the parent already ran `mt.check_parallel_config` with these sizes before
    any process started (the CLI, a checkpoint's load), so this rank trusts them; left
    False, this rank checks them here, once, before it builds anything.
    """
    check_plain_gpt(ref, "parallelize")
    if not validated:
        check_parallel_config(ref.cfg, mesh, sequence_parallel=sequence_parallel,
                              recompute=recompute, virtual_stages=virtual_stages,
                              zero_stage=zero_stage, param_dtype=dtype_name(param_dtype),
                              tp_overlap=tp_overlap, placement=placement,
                              vision_layout=vision_layout, cp_comm=cp_comm,
                              cp_a2a_size=cp_a2a_size, pipeline_layout=pipeline_layout)
    model = copy.deepcopy(ref)
    if param_dtype is not None:
        model.to(param_dtype)
    apply_tensor_parallel(model, mesh.tp, sequence_parallel, tp_overlap)
    if fp8 is not None or fp8_local_scales or fp8_all_gather:
        check_fp8_config(fp8, fp8_local_scales, param_dtype=dtype_name(param_dtype),
                         tp_overlap=tp_overlap, recompute=recompute,
                         all_gather=fp8_all_gather, zero_stage=zero_stage)
        apply_fp8(model, mesh, fp8, sequence_parallel, fp8_local_scales)
    apply_vision_parallel(model, mesh.tp, sequence_parallel, vision_layout)
    apply_context_parallel(model, mesh.cp, cp_comm, attention_axes(mesh, cp_comm, cp_a2a_size))
    apply_expert_parallel(model, mesh, sequence_parallel)
    apply_recompute(model, recompute)
    label_pieces(model)
    stages = split_into_stages(model, mesh, virtual_stages, sequence_parallel, placement,
                               pipeline_layout)
    for stage in stages:
        trace.forward_phase_module(stage)
        stage.tp_overlap = tp_overlap
    if param_dtype is not None:
        for stage in stages:
            stage.mixed_precision = True
        if zero_stage < 2:  # before the dp hooks: they read what these collect
            attach_main_grads(stages)  # (stages 2-3 keep float32 only in the shards)
    attach_data_parallel(stages, mesh.dp_cp, zero_stage, bucket_bytes,
                         master_dtype=MASTER_DTYPE if param_dtype is not None else None,
                         expert_dp=mesh.expert_dp)
    if fp8_all_gather:
        attach_fp8_gather(stages)
    if mesh.pp.size == 1:
        return stages[0]  # the whole model on every rank of the pipeline axis: no pipeline
    # the dense parameters as this model holds them: in param_dtype when it cast them (the
    # pipeline broadcasts each from its stage into buffers of this dtype on every rank)
    dense = {name: (tuple(p.shape), param_dtype or p.dtype) for name, p in ref.named_parameters()}
    return PipelineGPT(stages, mesh, embedding_axis(mesh, placement), dense, placement,
                       pipeline_layout)
