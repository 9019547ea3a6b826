"""The museum's entries: sixteen bugs met in the anchors' trackers (one in the Ultra-Scale
Playbook), each cited, each run at world 4 on a tiny float64 model by one setting of
minitp, and each fixed by one.

`Bug.run(fixed)` runs on every rank: a step bug (`Step`) through
`minitp.debug.divergence.compare_on_rank` (the mesh's step beside one device's, the first
module that departs), any other through its probe (`minitp.debug.museum.probes`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

from ...data import packing
from ...model import GPTConfig
from ..divergence import compare_on_rank
from . import probes, spoils

LLAMA = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32, norm="rmsnorm",
             positions="rope", mlp="swiglu", bias=False, n_kv_head=2)
GPT2 = dict(vocab_size=61, seq_len=16, n_layer=2, n_head=4, d_model=32)
MOE = dict(GPT2, n_experts=4, top_k=2, balance="aux", aux_loss_coef=0.1)
TOLERANCE = 1e-12  # a departure: beyond it (every fix lands within 1e-13 of one device)
VLM = dict(vocab_size=256, seq_len=16, n_layer=2, n_head=4, d_model=32, n_kv_head=2,
           vision_layers=1, vision_width=32, vision_heads=4)


def _packed(lengths):
    """A packed batch of the corpus's first documents cut to `lengths` (read when run)."""
    return lambda: packing.pack([d[:n] for d, n in zip(packing.corpus_documents(), lengths,
                                                        strict=False)], seq_len=16)


@dataclass(frozen=True)
class Step:
    """One training step on `mesh` beside one device's: `cfg()` the model, `spoil(model)`
    and/or `patch()` the bug, `options` mt.parallelize's, `fixed` the options that
    replace them in the fix (the spoil and the patch are left out there)."""

    cfg: Callable
    mesh: dict
    spoil: Callable | None = None
    patch: Callable | None = None
    options: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    batch: Callable | None = None
    microbatches: int = 1

    def __call__(self, fixed: bool) -> dict:
        options = {**self.options, **(self.fixed if fixed else {})}
        with nullcontext() if fixed or self.patch is None else self.patch():
            out = compare_on_rank(self.cfg(), self.mesh, self.batch() if self.batch else None,
                                  tolerance=TOLERANCE, microbatches=self.microbatches,
                                  spoil=None if fixed else self.spoil, **options)
        first = out["first"]
        return {**out, "departure": first[2].difference if first else 0.0}

    def context(self) -> str:
        """What the run's owner knows of it: the model, the mesh, the options, the batch
        (the spoil or patch, the bug, is not said)."""
        cfg = self.cfg()
        kind = ("a vision-language GPT" if cfg.vision_patches else
                f"a mixture-of-experts GPT ({cfg.n_experts} experts, top-{cfg.top_k}, "
                "aux loss)" if cfg.n_experts else
                f"a Llama-style GPT ({cfg.n_head} heads, {cfg.n_kv_head} K/V heads, RoPE)"
                if cfg.positions == "rope" else "a GPT-2-style GPT")
        mesh = " x ".join(f"{axis}={n}" for axis, n in self.mesh.items())
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items()) or "none"
        batch = "a packed batch (documents)" if self.batch else "random tokens"
        return (f"{kind} of {cfg.n_layer} layers on {mesh}; mt.parallelize's options: "
                f"{options}; {batch}; one step at learning rate 0")


@dataclass(frozen=True)
class Bug:
    """A museum entry. `looks`: "drift" (it departs from one device and raises nothing)
    or "hang" (a collective never completes: `CollectiveTimeout`)."""

    key: str
    citation: str
    symptom: str
    looks: str
    setting: str
    fix: str
    run: Callable[[bool], dict]
    about: str = ""  # a probe's context (a step bug's is its Step's)

    def context(self) -> str:
        """What the run's owner knows of it, its bug not said."""
        return self.about or self.run.context()


def _cfg(**kw):
    return lambda: GPTConfig(**kw)


BUGS = [
    Bug("kv_replicas_not_summed", "huggingface/transformers PR #47811 (issue #48307)",
        "tp exceeds the K/V heads: the copies of one K/V head never sum their gradients",
        "drift", "tp=4, n_kv_head=2, spoil: the K/V weights left out of the tp sum",
        "sum the K/V copies' gradients over the ranks that hold them",
        Step(_cfg(**LLAMA), dict(tp=4), spoils.kv_replicas_not_summed)),
    Bug("rope_local_positions", "NVIDIA/Megatron-LM issue #560",
        "under CP each rank rotates its chunks from position 0", "drift",
        "cp=4, spoil: RoPE at 0, 1, 2, ... on every rank",
        "rotate each token at its global position (the rank's chunks' positions)",
        Step(_cfg(**LLAMA), dict(cp=4), spoils.rope_at_local_positions)),
    Bug("fp8_local_scales", "pytorch/torchtitan issue #3109",
        "each rank scales its piece of a split tensor by its own amax", "drift",
        "dp=2 x tp=2, fp8='tensorwise', fp8_local_scales=True",
        "fp8_local_scales=False: the amax MAX-reduced over the axes that split the tensor",
        Step(_cfg(**GPT2), dict(dp=2, tp=2), options=dict(fp8="tensorwise",
                                                          fp8_local_scales=True),
             fixed=dict(fp8_local_scales=False))),
    Bug("amax_group_without_tp", "NVIDIA/Megatron-LM PR #442",
        "the amax reduced over the wrong group: dp but not tp", "drift",
        "dp=2 x tp=2, fp8='tensorwise', spoil: tp dropped from every amax group",
        "reduce each amax over the axes that split its tensor (minitp.rules.fp8_groups)",
        Step(_cfg(**GPT2), dict(dp=2, tp=2), spoils.amax_without_tp,
             options=dict(fp8="tensorwise"))),
    Bug("sp_input_amax_local", "NVIDIA/TransformerEngine issue #656",
        "under SP a column layer's input amax is this rank's part of the sequence", "drift",
        "dp=2 x tp=2, SP, fp8='tensorwise', spoil: tp dropped from the column inputs' amax",
        "under SP reduce the column layers' input amax over tp too",
        Step(_cfg(**GPT2), dict(dp=2, tp=2), spoils.sp_input_amax_local,
             options=dict(fp8="tensorwise", sequence_parallel=True))),
    Bug("aux_statistics_local", "pytorch/torchtitan PR #3000",
        "the MoE aux loss's per-sequence counts from this rank's tokens alone", "drift",
        "cp=2 x tp=2, SP, spoil: the sequence statistics not summed",
        "sum the sequence-wise counts over cp and tp (SP) before the aux loss",
        Step(_cfg(**MOE), dict(cp=2, tp=2), spoils.aux_statistics_local,
             options=dict(sequence_parallel=True))),
    Bug("packed_rope_under_cp", "NVIDIA/Megatron-LM PR #5243",
        "under CP a packed row's documents are turned by another row's positions", "drift",
        "cp=4, a packed batch, spoil: every row rotated by the first row's positions",
        "rotate each row by its own positions (restarting at its documents), each cp rank's "
        "chunks of them",
        Step(_cfg(**{**LLAMA, "vocab_size": 256}), dict(cp=4),
             spoils.packed_positions_of_the_first_row, batch=_packed((7, 11, 5, 9, 13, 6, 8, 10)))),
    Bug("encoder_not_summed", "NVIDIA/Megatron-LM issue #1446",
        "under SP the replicated vision encoder's gradients stay each rank's part", "drift",
        "tp=4, SP, a VLM, spoil: the encoder left out of the tp sum",
        "sum the encoder's gradients over tp (it saw every rank's image tokens)",
        Step(lambda: GPTConfig.vlm(**VLM), dict(tp=4), spoils.encoder_not_summed,
             options=dict(sequence_parallel=True))),
    Bug("sp_norm_grads_not_summed", "NVIDIA/Megatron-LM issue #1446",
        "under SP the norms' gradients stay each rank's part of the sequence", "drift",
        "tp=4, SP, spoil: the norm weights left out of the tp sum",
        "all-reduce the norms' (replicated) gradients over tp",
        Step(_cfg(**GPT2), dict(tp=4), spoils.norms_not_summed,
             options=dict(sequence_parallel=True))),
    Bug("token_mean_of_means", "pytorch/torchtitan PR #2206",
        "each dp rank divides by its own token count: a padded rank weighs as a full one",
        "drift", "dp=4, a packed batch with a padded row, patch: each rank's mean averaged",
        "weight each rank's loss by its share of the global batch's target tokens",
        Step(_cfg(**{**LLAMA, "vocab_size": 256}), dict(dp=4), patch=spoils.mean_of_means,
             batch=_packed((7, 11, 5, 9, 13, 6, 9)))),
    Bug("pipeline_drops_a_layer", "ml-explore/mlx-lm #1688",
        "an uneven pipeline layout places fewer layers than the model has", "drift",
        "pp=2 x tp=2, n_layer=3, pipeline_layout=[1, 1], its check switched off",
        "a layout that places every layer once ([2, 1]); minitp refuses [1, 1]",
        Step(_cfg(**{**GPT2, "n_layer": 3}), dict(pp=2, tp=2), patch=spoils.layout_unchecked,
             options=dict(pipeline_layout=[1, 1]), fixed=dict(pipeline_layout=[2, 1]))),
    Bug("muon_partial_gradient", "deepspeedai/DeepSpeed PR #8090 (issue #7807)",
        "Muon orthogonalises a gradient summed on this rank's ZeRO slice only", "drift",
        "dp=4, ZeRO's reduce-scatter, Newton-Schulz of what the rank holds",
        "all-gather the reduced slices first (the 'gather' strategy)",
        probes.muon_partial_gradient,
        "Muon's update of one (8, 12) weight after ZeRO's reduce-scatter of its gradient over "
        "dp=4, against one device's update"),
    Bug("muon_row_shard", "NVIDIA/Megatron-LM issue #5961",
        "Newton-Schulz run on each tensor-parallel row shard alone", "drift",
        "tp=4, each rank orthogonalises its row block",
        "sum the Gram matrix over tp (newton_schulz_tp, the 'tp' strategy)",
        probes.muon_row_shard,
        "Muon's update of one (16, 8) weight split by rows over tp=4, against one device's"),
    Bug("mxfp8_block_boundary", "NVIDIA/Megatron-LM issue #5615 (PR #7114)",
        "ZeRO-3's even split cuts MXFP8 blocks: each side scales its half", "drift",
        "dp=4, a (5, 64) weight cast by shard before an 8-bit all-gather",
        "shard block-atomically: every boundary rounded up to 32 values",
        probes.mxfp8_block_boundary,
        "ZeRO-3's 8-bit all-gather of one MXFP8 (5, 64) weight over dp=4, against one "
        "device's cast"),
    Bug("dropout_seed_per_rank", "the Ultra-Scale Playbook (huggingface/nanotron), TP section",
        "replicated activations dropped by masks that differ across tp ranks", "drift",
        "tp=4, dropout=0.25, the generator seeded by tp rank",
        "one seed on every tp rank; only sharded activations offset it by rank",
        probes.dropout_seed_per_rank,
        "a GPT-2-style GPT at tp=4 with dropout 0.25, one step; compared: the replicated "
        "parameters' gradients, which one device holds once"),
    Bug("uneven_steps_hang", "pytorch/pytorch issue #38174",
        "one dp rank's data runs out a step early: the others wait in its all-reduce",
        "hang", "dp=4, rank 3 runs 1 step, the others 2",
        "every rank the same number of steps (the remainder dropped)",
        probes.uneven_steps,
        "a GPT-2-style GPT at dp=4 over a dataset split between the ranks, two steps"),
]

MUSEUM = {bug.key: bug for bug in BUGS}
