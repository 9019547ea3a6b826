"""`mt.debug.first_divergence`: the first module whose result on a mesh departs from one
device's, with its rank, phase and tensor.

Every rank runs the same step twice, in float64: the plain GPT in this one process (one
device's step; the one-process FP8 model under ``fp8=``) and this rank's part of it on the
mesh (`mt.parallelize` with the options given, one `mt.train_step` at learning rate 0). Hooks
(`minitp.debug.record`) keep each module's outputs, and its input gradients in backward, and
after the step the parameters' gradients as the optimizer would read them (after every
reduction: data-parallel, sequence-parallel partial sums, the tied embedding). Each rank
compares what it holds with the matching part of one device's tensor (`minitp.debug.layout`
says which part, and what is not comparable) and reports its first departure; the parent
keeps the earliest: forward in execution order, then backward in execution order (a
module's input gradients, then its parameters' gradients), the lowest rank on a tie. The
earliest departure is where the bug is: every later module inherits it.

Parameter gradients are compared at ZeRO stage 0 only: at stages 1-3 they are
reduce-scattered into dp shards (at stage 1 by the optimizer's step, after which a rank's
``.grad`` is still its own unreduced one). "Execution order" is the order in which the hooks
fire: a module's forward hook when its forward returns (a layer before the block holding it),
its backward hook when its input gradients are computed.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import asdict, dataclass, field

import torch

from ..data_parallel import make_optimizer
from ..fp8 import convert
from ..fp8.reference import accumulate, one_process_microbatches
from ..model import GPT
from ..model.mla import REPLICATED
from ..parallelize import parallelize
from ..pipeline.stages import Skipped
from ..rules import check_parallel_config, model_chunks
from ..rules.fp8_groups import check_fp8_config
from ..runtime._device import device
from ..runtime.launch import launch
from ..runtime.mesh import Mesh
from ..sharding.dense import dense_name
from ..step import train_step
from .layout import Place, in_row_order, local_part, param_part
from .record import PHASES, Recorder, plain_modules, rank_modules

NOISE = 1e-15  # float64's rounding of numbers near 1 (2.2e-16), with room for a sum or two
AXES = ("dp", "pp", "cp", "tp", "ep")


@dataclass
class Divergence:
    """Where a mesh first departs from one device: `module` (the plain GPT's name),
    `rank`, `phase` ("forward" or "backward"), `tensor` (``output``, ``grad_input[0]``,
    ``weight.grad``...) and `difference` (the largest absolute difference, float64);
    `reference` and `mesh`: the compared tensors' statistics (mean, std, absmax)."""

    module: str
    rank: int
    phase: str
    tensor: str
    difference: float
    reference: dict = field(default_factory=dict, repr=False)
    mesh: dict = field(default_factory=dict, repr=False)

    def summary(self) -> dict:
        """The five fields the command line prints as JSON."""
        return {k: v for k, v in asdict(self).items() if k not in ("reference", "mesh")}


def _stats(t: torch.Tensor) -> dict:
    return {"mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else 0.0,
            "absmax": float(t.abs().max())}


def check_divergence_input(cfg, mesh_sizes: dict, tolerance: float, microbatches: int,
                           rows: int, options: dict, schedule=None, packed: bool = False) -> int:
    """Everything refused before a process starts, each in one line; returns the world size."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance)
            and tolerance >= NOISE):
        raise ValueError(f"tolerance {tolerance!r}: it must be a number of at least "
                         f"float64's noise, {NOISE:g} (below it every module would depart)")
    unknown = sorted(set(mesh_sizes) - set(AXES))
    if unknown:
        raise ValueError(f"mesh sizes {unknown} are not axes; the axes are {', '.join(AXES)}")
    if options.get("param_dtype") is not None:
        raise ValueError("first_divergence compares in float64: leave param_dtype out "
                         "(bf16 departs from one device by its own rounding)")
    if cfg.dropout:
        raise ValueError(f"dropout={cfg.dropout}: each rank draws its own masks, so nothing "
                         "would match one device; compare with dropout=0")
    known = set(inspect.signature(parallelize).parameters) - {"ref", "mesh", "validated"}
    if set(options) - known:
        raise ValueError(f"{sorted(set(options) - known)} are not mt.parallelize's options; "
                         f"it takes {', '.join(sorted(known))}")
    sizes = {axis: int(mesh_sizes.get(axis, 1)) for axis in AXES}
    plan = {k: v for k, v in options.items() if not k.startswith("fp8") and k != "bucket_bytes"}
    check_parallel_config(cfg, **sizes, microbatches=microbatches, batch_size=rows,
                          schedule=schedule, **plan)
    fp8 = {k: options.get(k) for k in ("fp8", "fp8_local_scales", "fp8_all_gather")}
    if fp8["fp8"] is not None and packed:
        raise ValueError("fp8 with a packed batch: FP8's one-process step (minitp.fp8.accumulate)"
                         " takes no positions; compare FP8 on an unpacked batch")
    if any(fp8.values()):
        check_fp8_config(fp8["fp8"], bool(fp8["fp8_local_scales"]),
                         tp_overlap=options.get("tp_overlap", False),
                         recompute=options.get("recompute"), all_gather=bool(fp8["fp8_all_gather"]),
                         zero_stage=options.get("zero_stage", 0))
    return sizes["dp"] * sizes["pp"] * sizes["cp"] * sizes["tp"]


def _random_batch(cfg, rows: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len), generator=generator)
                 for _ in range(2))


def _reference(plain, batch, options, dp: int, microbatches: int):
    """One device's step, recorded, the global row of each recorded row, and its loss."""
    ref = copy.deepcopy(plain)
    fp8 = options.get("fp8")
    if fp8 is not None:
        convert(ref, fp8)
    recorder = Recorder(plain_modules(ref))
    x, y, *packed = batch
    order = None
    if fp8 is not None:  # the microbatches the ranks cast together, as `--check` runs them
        loss = accumulate(ref, (x, y), dp, microbatches)
        rows = torch.arange(x.shape[0])
        order = torch.cat([r for r, _ in one_process_microbatches((rows, rows), dp,
                                                                  microbatches)])
    else:
        loss = ref(x, y, positions=packed[0] if packed else None)[1]
        loss.backward()
    recorder.remove()
    return ref, recorder, order, float(loss)


def _partial_inputs(cfg, mesh, options, rec: Recorder):
    """Whether a module's input gradients on this rank are a partial sum over tp (see
    `minitp.debug.layout`): an input mapped once for two layers (`ParallelInput`), and under
    sequence parallelism the replicated vision encoder's, whose image every tp rank runs
    while each back-propagates only its own part of the sequence; and latent attention's
    replicated modules, rotation and ``keys`` (`minitp.model.mla`), whose outputs feed only
    this rank's heads (their parameters' gradients, summed by the step, are still compared)."""
    encoder = (cfg.vision_patches and options.get("sequence_parallel") and mesh.tp.size > 1
               and options.get("vision_layout", "replicated") == "replicated")
    latent = getattr(cfg, "kv_lora_rank", 0) and mesh.tp.size > 1

    def partial(name: str) -> bool:
        return (getattr(rec.modules[name], "input_mapped", False)
                or bool(encoder) and (name == "vision" or name.startswith("vision."))
                or bool(latent) and ".attn." in name
                and name.rsplit(".", 1)[-1] in (*REPLICATED, "rope", "keys"))
    return partial


def _first(ref, ref_rec, order, rec, model, place: Place, tolerance: float, grads: bool,
           partial):
    """This rank's first departure (phase index, order index, Divergence) and how many
    tensors it compared."""
    compared = 0
    ref_params = dict(ref.named_parameters())
    by_module = {}
    if grads:
        for chunk in model_chunks(model):
            skipped = tuple(n + "." for n, m in chunk.named_modules() if isinstance(m, Skipped))
            for name, p in chunk.named_parameters():
                if name.startswith(skipped):  # the last stage's copy of the tied embedding:
                    continue  # its gradient is the first stage's after their sum
                dense = dense_name(name, chunk.layer_offset)
                by_module.setdefault(dense.rpartition(".")[0], []).append((dense, p))
    for phase_index, phase in enumerate(PHASES):
        for index, name in enumerate(ref_rec.order[phase]):
            pairs = []
            if name in rec.calls[phase] and not (phase == "backward" and partial(name)):
                mine, theirs = rec.calls[phase][name], ref_rec.calls[phase][name]
                for label in theirs[0]:
                    if not all(label in call for call in mine):
                        continue
                    locals_ = [c[label] for c in mine]
                    if theirs[0][label].dim() == 0 and (len(mine) > 1 or len(theirs) > 1):
                        continue  # a scalar per microbatch: not the batch's
                    ref_t = in_row_order([c[label] for c in theirs], order, place)
                    local = torch.cat(locals_) if len(locals_) > 1 else locals_[0]
                    pairs.append((label, local_part(ref_t, local, place)))
            if phase == "backward":
                for dense, p in by_module.get(name, []):
                    if p.grad is None or ref_params[dense].grad is None:
                        continue
                    part = param_part(ref_params[dense].grad.double(), p, place)
                    local = p.grad.double()[tuple(slice(0, n) for n in part.shape)]
                    pairs.append((f"{dense.rpartition('.')[2]}.grad", (part, local)))
            for label, both in pairs:
                if both is None:
                    continue
                compared += 1
                ref_t, local = both
                difference = float((ref_t - local).abs().max()) if ref_t.numel() else 0.0
                if not difference <= tolerance:  # NaN departs too
                    return (phase_index, index, Divergence(
                        name, 0, phase, label, difference, _stats(ref_t), _stats(local))), compared
    return None, compared


def compare_on_rank(cfg, mesh_sizes: dict, batch=None, tolerance: float = 1e-9,
                    microbatches: int = 1, schedule=None, seed: int = 0, spoil=None,
                    **options) -> dict:
    """On every rank: one device's step and this rank's on the mesh, compared. Returns
    ``{"first": (phase index, order index, Divergence) or None, "compared": n, "loss":
    the mesh's step's loss, "reference_loss": one device's}``;
    `earliest` of every rank's is the answer. `spoil(model)`: breaks the parallel model
    first (a trap run on purpose)."""
    mesh = Mesh(**mesh_sizes)
    if batch is None:
        batch = _random_batch(cfg, 2 * mesh.dp.size * microbatches, seed)
    batch = tuple(t.to(device()) for t in batch)
    torch.manual_seed(seed)
    plain = GPT(cfg).to(device(), torch.float64)
    ref, ref_rec, order, ref_loss = _reference(plain, batch, options, mesh.dp.size, microbatches)
    model = parallelize(plain, mesh, **options)
    if spoil is not None:
        spoil(model)
    rec = Recorder(rank_modules(model))
    optimizer = make_optimizer(model, mesh, torch.optim.SGD, lr=0.0)
    loss = train_step(model, batch, mesh, optimizer, schedule=schedule,
                      microbatches=microbatches)
    rec.remove()
    place = Place(rows=batch[0].shape[0], seq_len=batch[0].shape[1], vocab=cfg.vocab_size,
                  dp=mesh.dp.size, dp_rank=mesh.dp.rank, cp=mesh.cp.size, cp_rank=mesh.cp.rank,
                  tp=mesh.tp.size, tp_rank=mesh.tp.rank, ep=mesh.ep.size, ep_rank=mesh.ep.rank,
                  microbatches=microbatches)
    first, compared = _first(ref, ref_rec, order, rec, model, place, tolerance,
                             options.get("zero_stage", 0) == 0,
                             _partial_inputs(cfg, mesh, options, rec))
    if first is not None:
        first[2].rank = mesh.rank
    return {"first": first, "compared": compared, "loss": loss, "reference_loss": ref_loss}


def earliest(results) -> Divergence | None:
    """The earliest departure of every rank's `compare_on_rank` result (None: none)."""
    found = [r["first"] for r in results if r["first"] is not None]
    if not found:
        return None
    return min(found, key=lambda f: (f[0], f[1], f[2].rank))[2]


def first_divergence(cfg, mesh_sizes: dict, *, batch=None, tolerance: float = 1e-9,
                     microbatches: int = 1, schedule=None, seed: int = 0, spoil=None,
                     timeout: float = 120.0, **parallelize_options) -> Divergence | None:
    """The first module whose result on the mesh `mesh_sizes` (``dict(tp=4)``, ...) departs
    from one device's by more than `tolerance`, or None where none does (see the module).

    cfg: the GPTConfig (dropout 0); batch: (x, y) or packed (x, y, positions), the global
    batch (default: random ids, 2 rows per dp rank and microbatch, from `seed`, which also
    seeds the weights); tolerance: the largest absolute difference (float64) that is not a
    departure; microbatches, schedule: `mt.train_step`'s; spoil(model): run on every rank on
    its parallel model before the step (a bug put in on purpose, as the lessons' traps are);
    parallelize_options: `mt.parallelize`'s (``sequence_parallel=True``, ``cp_comm="a2a"``,
    ``fp8="tensorwise"``...). A tolerance below float64's noise, a mesh the model cannot
    split, an option parallelize does not take, bf16 (``param_dtype``) or dropout: refused
    in one line (ValueError) before any process starts."""
    rows = batch[0].shape[0] if batch is not None else 2 * mesh_sizes.get("dp", 1) * microbatches
    world = check_divergence_input(cfg, mesh_sizes, tolerance, microbatches, rows,
                                   parallelize_options, schedule,
                                   packed=batch is not None and len(batch) == 3)
    run = launch(compare_on_rank, world, cfg, dict(mesh_sizes), batch, tolerance, microbatches,
                 schedule, seed, spoil, timeout=timeout, **parallelize_options)
    return earliest(run)
