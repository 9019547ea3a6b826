"""ZeRO stages 2 and 3 (Rajbhandari et al. 2020): gradients, then parameters, sharded
over the data-parallel axis. (Stage 1, sharded optimizer state only, is
`minitp.data_parallel.Zero1Optimizer`.)

Where each part lives: `zero_units` (units and shards), `zero_stage2`, `zero_stage3`
(beside this module in `minitp.data_parallel`); this module attaches them to a model and
steps the shards.

Everything is cut into *units*, one per piece of a stage: the token embedding
(always alone — the pipeline's two copies of the tied embedding must be laid out
alike, so their gradients can be summed elementwise), the positions, each
transformer layer, the final LayerNorm, and, under expert parallelism, each layer's
run of experts (sharded over `Mesh.expert_dp`, the ranks holding the same experts,
rather than dp). A unit's parameters are flattened into
one vector of Ψ_u values, padded to a multiple of N_d (the dp size), and dp rank
d owns the d-th slice: its *shard*, an ``nn.Parameter`` that the optimizer steps
(`Zero23Optimizer`). Adam is elementwise, so stepping shards equals stepping
the whole.

* Stage 2: the model keeps its whole parameters; each unit's gradient is
  reduce-scattered as soon as backward has produced it (hooks on the
  parameters, as the data-parallel all-reduce's buckets — here a bucket is a
  unit), and the parameters' whole-size gradients are dropped at once: only
  the shard's gradient survives (and the flat copy being sent, until it is
  sent). After the step, each unit's updated shards are
  all-gathered back into the parameters.
* Stage 3 (FSDP's design): the parameters are gone from the model; only the
  shards stay. Just before a unit's forward its parameters are all-gathered
  (`_GatherParams`, fwd: all-gather · bwd: reduce-scatter), the module runs on
  views of the gathered vector, and the vector's memory is freed right after.
  When backward reaches the unit (a hook on its output's gradient) the vector
  is gathered again, into the same storage, so the tensors autograd saved see
  their values; the gather's backward reduce-scatters the gradient and frees
  the vector. A unit under full recomputation needs no second gather: the
  recomputation runs the forward, and its gather, again.

Overlap: a unit's gradient reduce-scatter is *posted* (`minitp.runtime.comm`'s
``reduce_scatter_start``) and backward goes on with earlier units while gloo's
thread sends it; at most `IN_FLIGHT` of them are in flight at once (posting one
more first waits the oldest), so the whole-size gradients alive are bounded
by a few units', not the model's; `train_step` waits the rest before the
optimizer step. Stage 3 prefetches: each unit's forward posts the gather of the
next unit in forward order before it waits its own, and each unit's backward
(its refill, or its recomputation) posts the gather of the one before it, so a
unit's parameters travel while its neighbour computes (FSDP's forward and
backward prefetch). The price is two units' gathered parameters alive at once.

With context parallelism the axis every unit is sharded over is dp×cp
(`Mesh.dp_cp`, given by `minitp.parallelize`): the cp ranks hold the same
parameters and partial gradients of them, as the dp ranks do, so "N_d" is dp·cp.

Gradients are reduce-scattered for every microbatch (as DeepSpeed and FSDP do);
shards accumulate the microbatches. Sequence parallelism leaves some gradients
partial over tp: after the dp reduce-scatter those shard elements are summed
over tp (one all-reduce for the step, as `minitp.tensor_parallel.partial_grads` does for whole
gradients); the tied embedding's two pipeline copies sum their shards over the
embedding group.

"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from ..mixed_precision import MixedPrecisionOptimizer, is_mixed
from ..rules import check_zero_stage, model_chunks
from ..runtime import comm, trace
from ..runtime.mesh import Axis, Mesh
from .grad_sync import attach_grad_sync
from .zero_stage1 import Zero1Optimizer, ZeroOptimizerBase
from .zero_stage2 import ShardedGradSync
from .zero_stage3 import shard_parameters
from .zero_units import InFlight, Unit, make_units


# --------------------------------------------------------------------------- attaching
def attach_data_parallel(stages, dp: Axis, zero_stage: int = 0, bucket_bytes: int = 1 << 20,
                         master_dtype: torch.dtype | None = None,
                         expert_dp: Axis | None = None) -> None:
    """Step 5 of `minitp.parallelize`: what every stage does over the dp axis.

    0: a bucketed all-reduce of the gradients (`GradSync`); 1: nothing here (the
    ZeRO-1 optimizer reduce-scatters at its step); 2: units whose gradients are
    reduce-scattered during backward; 3: also the parameters sharded. master_dtype
    (mixed precision, stages 2-3): the shards' dtype, float32 under bf16 parameters.
    expert_dp: the group expert shards sum their gradients over (`Mesh.expert_dp`)."""
    check_zero_stage(zero_stage)
    if zero_stage == 0:
        attach_grad_sync(stages, dp, bucket_bytes, expert_dp)
        return
    inflight = InFlight()  # one bound for the rank, whichever stage's units post
    for stage in stages:
        stage.zero_stage, stage.grad_sync, stage.zero_units = zero_stage, None, []
        if zero_stage >= 2:
            stage.zero_units = make_units(stage, dp, inflight, master_dtype, expert_dp)
            stage.grad_sync = ShardedGradSync(stage.zero_units) if zero_stage == 2 else None
            if zero_stage == 3:
                shard_parameters(stage, stage.zero_units)


def zero_stage_of(model) -> int:
    return model_chunks(model)[0].zero_stage


def _units(model) -> list[Unit]:
    return [u for c in model_chunks(model) for u in c.zero_units]


def finish_sharded_grads(model, mesh: Mesh) -> None:
    """After the last backward of a ZeRO-2/3 step: every unit's reduced slices into its
    shard's gradient; the partial (sequence-parallel) elements summed over tp; the
    tied embedding's two pipeline copies summed over the embedding group."""
    chunks = model_chunks(model)
    units = _units(model)
    for unit in units:
        unit.finish_reduce()
    partial = [u for u in units if u.partial is not None]
    if partial and mesh.tp.size > 1:
        flat = torch.cat([u.shard.grad[u.partial] for u in partial])
        with trace.label("sequence-parallel grads"), trace.phase("bwd"):
            flat = comm.all_reduce(flat, mesh.tp)
        for u, part in zip(partial, flat.split([int(u.partial.sum()) for u in partial]),
                           strict=True):
            u.shard.grad[u.partial] = part
    embedding = getattr(model, "embedding", None)
    if embedding is not None:
        chunk = chunks[0] if chunks[0].first else chunks[-1]
        (tied,) = [u for u in chunk.zero_units if u.tied]
        with trace.label("embedding grads"), trace.phase("bwd"):
            tied.shard.grad = comm.all_reduce(tied.shard.grad, embedding)


@contextlib.contextmanager
def gathered(model):
    """Inside: a ZeRO-3 model's parameters are whole again, registered under their
    names (e.g. for ``model.full_state_dict()``); detached copies, untraced. Any
    other model is left as it is."""
    units = _units(model) if zero_stage_of(model) == 3 else []
    chunks = model_chunks(model)
    shards = [c._modules.pop("zero_shards") for c in chunks] if units else []
    with trace.paused():
        fulls = [u.gather() for u in units]
    try:
        for unit, full in zip(units, fulls, strict=True):
            for mod, attr, p, view in unit.views(full):
                p.data = view
                mod._parameters[attr] = p
        yield model
    finally:
        for unit in units:
            for mod, attr, p, _ in unit.layout:
                del mod._parameters[attr]
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        for chunk, shard_list in zip(chunks, shards, strict=False):
            chunk._modules["zero_shards"] = shard_list


# --------------------------------------------------------------------------- optimizer
class Zero23Optimizer(ZeroOptimizerBase):
    """ZeRO-2/3's optimizer: ``optimizer_class`` over the units' shards only. Their
    gradients are ready when `train_step` calls ``step()``; at stage 2 the updated
    shards are then all-gathered into the model's parameters (stage 3 gathers
    them at the next forward)."""

    def __init__(self, model, units: list[Unit], zero_stage: int, optimizer_class, **kwargs):
        self.model, self.units, self.zero_stage = model, units, zero_stage
        self.inner = optimizer_class([u.shard for u in units], **kwargs)
        # mixed precision: the float32 shards are the master weights (`minitp.memory`)
        self.masters = [u.shard for u in units if u.shard.dtype != u.param_dtype]
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for unit in self.units:
            unit.shard.grad = None
            for _, _, p, _ in unit.layout:
                p.grad = None

    def step(self) -> None:
        self.inner.step()
        if self.zero_stage != 2:
            return
        for unit in self.units:  # all posted at once: they travel together
            unit.post_gather()
        with torch.no_grad():
            for unit in self.units:
                for _, _, p, view in unit.views(unit.take_gathered()):
                    p.copy_(view)


def make_optimizer(model, mesh: Mesh, optimizer_class=torch.optim.AdamW, **kwargs):
    """The optimizer for a model from ``mt.parallelize(ref, mesh, zero_stage=s)``,
    ``optimizer_class(..., **kwargs)`` over what this rank steps: the model's
    parameters (s = 0), this rank's 1/dp slice of them (s = 1: `Zero1Optimizer`),
    or its units' shards (s = 2, 3: `Zero23Optimizer`). ``optimizer_class="muon"``: Muon
    for the hidden matrices and AdamW for the rest, at any stage, with ``strategy=`` "gather",
    "owner" or "tp" for Newton–Schulz's whole matrix (`minitp.optim`, docs/muon.md)."""
    if isinstance(optimizer_class, str):
        if optimizer_class != "muon":
            raise ValueError(f"make_optimizer: an optimizer class or 'muon', got "
                             f"{optimizer_class!r}")
        return _muon(model, mesh, **kwargs)
    stage = zero_stage_of(model)
    if stage == 0:
        if is_mixed(model):  # float32 masters of the bf16 parameters
            return MixedPrecisionOptimizer(model.parameters(), optimizer_class, **kwargs)
        return optimizer_class(model.parameters(), **kwargs)
    if stage == 1:  # over dp×cp: the group the gradients are summed over (mesh.dp_cp)
        return Zero1Optimizer(list(model.parameters()), mesh.dp_cp, optimizer_class,
                              expert_axis=mesh.expert_dp, **kwargs)
    return Zero23Optimizer(model, _units(model), stage, optimizer_class, **kwargs)


def _muon(model, mesh: Mesh, strategy: str = "gather", **options):
    """`minitp.optim`'s Muon: inside the ZeRO optimizer of the model's stage (in place of
    its inner SGD, which never steps), or over the parameters at stage 0."""
    from ..optim.distributed import check_muon, make_muon

    check_muon(model, mesh, strategy)
    outer = make_optimizer(model, mesh, torch.optim.SGD, lr=0.0) if zero_stage_of(model) else None
    return make_muon(model, mesh, outer, strategy, **options)


def stepped_tensors(optimizer) -> list[torch.Tensor]:
    """The tensors `optimizer` steps, in its order: a model's parameters (stage 0),
    or the flat shards a ZeRO optimizer keeps (stages 1-3)."""
    inner = optimizer.inner if isinstance(optimizer, ZeroOptimizerBase) else optimizer
    return [p for group in inner.param_groups for p in group["params"]]


def _flat_layouts(optimizer):
    """(shard, dp axis, [(parameter, offset, shape)]) for each flat vector a ZeRO
    optimizer steps a slice of."""
    if isinstance(optimizer, Zero1Optimizer):
        layouts = []
        for flat in optimizer.flats:
            offsets = [0]
            for p in flat.params:
                offsets.append(offsets[-1] + p.numel())
            layouts.append((flat.shard, flat.axis, [(p, o, p.shape) for p, o
                                                    in zip(flat.params, offsets, strict=False)]))
        return layouts
    return [(u.shard, u.dp, [(p, offset, shape) for (_, _, p, offset), shape
                             in zip(u.layout, u.shapes, strict=True)]) for u in optimizer.units]


def per_parameter_state(model, optimizer, state=None) -> dict[nn.Parameter, dict]:
    """Each of the model's parameters' optimizer state, shaped like the parameter:
    the state as it is (stage 0), or each flat shard's state all-gathered over dp
    and cut back into parameters (stages 1-3; collective over dp, untraced).
    Scalars (Adam's ``step``) are shared by a shard's parameters. A parameter
    without state maps to {}. state: {stepped tensor: its state} in the optimizer's
    place (Muon's, laid out so by `minitp.optim.state.by_tensor`)."""
    state = optimizer.state if state is None else state
    if not isinstance(optimizer, ZeroOptimizerBase):
        return {p: state.get(p, {}) for p in model.parameters()}
    out, states = {}, state
    with trace.paused():
        for shard, axis, params in _flat_layouts(optimizer):
            state = states.get(shard, {})
            whole = {k: comm.all_gather(v, axis) if torch.is_tensor(v) and v.shape == shard.shape
                     else v for k, v in state.items()}
            for p, offset, shape in params:
                out[p] = {k: v[offset:offset + shape.numel()].view(shape)
                          if torch.is_tensor(v) and state[k].shape == shard.shape else v
                          for k, v in whole.items()}
    return out


def check_checkpointable(model, optimizer=None) -> None:
    """Raise TypeError, naming what is wrong, where `minitp.checkpoint` cannot write
    the optimizer's state in its dense per-parameter form: an optimizer that is not
    the one `make_optimizer` gives a model at its ZeRO stage (a plain optimizer over
    stage 3's shards steps tensors no dense parameter name stands for). Call it
    before training; `checkpoint.save` calls it before any collective. A
    mixed-precision model is refused: its float32 master weights, which the next
    step starts from, are not written yet (the bf16 parameters are only their
    rounding)."""
    if is_mixed(model):
        raise TypeError("checkpoint: a mixed-precision (param_dtype=bfloat16) model cannot be "
                        "saved yet: its float32 master weights would be lost; train it in "
                        "float32 to save and resume")
    if optimizer is None:
        return
    stage = zero_stage_of(model)
    expected = {1: Zero1Optimizer, 2: Zero23Optimizer, 3: Zero23Optimizer}.get(stage)
    if expected is None:  # stage 0: a plain optimizer
        if isinstance(optimizer, ZeroOptimizerBase) and not isinstance(optimizer, Zero1Optimizer):
            raise TypeError(f"checkpoint: a {type(optimizer).__name__} over a model without "
                            "ZeRO stages 2-3 (make it with mt.make_optimizer(model, mesh, ...))")
        return
    if not isinstance(optimizer, expected):
        raise TypeError(
            f"checkpoint: a model at ZeRO stage {stage} is stepped by a {expected.__name__}, "
            f"not a {type(optimizer).__name__}: make it with mt.make_optimizer(model, mesh, "
            "torch.optim.AdamW, ...), so the saved state can be gathered and resharded")
