"""Checkpoints that reshard: save at one (dp, pp, tp), load at another.

A checkpoint holds the *dense* model — the plain GPT's parameters under its own
names — never a rank's shard. Saving gathers the shards (`full_state_dict`);
loading builds the plain GPT from those weights and parallelizes it for the
mesh at hand. So the file knows nothing of the topology that wrote it, and
any topology the config admits can read it.

Adam's state is sharded exactly like the parameters (exp_avg and exp_avg_sq
have each parameter's shape), so it is gathered and resharded the same way:
put the state tensors where the parameters are, gather them with
`full_state_dict`; on load, build a GPT whose "weights" are the dense state and
parallelize that. The model's own plan does the slicing, so there is no second
copy of the sharding rules to keep in step.

ZeRO (`minitp.data_parallel.zero`) changes only the first and last step of that. Saving: its
optimizer keeps flat shards of the parameters' state, so each shard's state is
all-gathered over dp and cut back into per-parameter tensors
(`zero.per_parameter_state`); at stage 3 the parameters themselves are gathered
for the save (`zero.gathered`). Loading at stage s: the GPT made of the dense
state is parallelized *at stage s* too, and the shards its optimizer would step
are this rank's state. So the file is the same at every stage, and a checkpoint
saved at (dp 4, ZeRO-3) resumes at (dp 2, tp 2) or at any stage elsewhere.

Files in the directory (one rank writes, every rank reads)::

    model.pt      dense parameters        torch.save of {name: tensor}
    optimizer.pt  dense Adam state        {"step": tensor, "exp_avg": {name: tensor}, ...}
                  (Muon's: "momentum_buffer" too, `minitp.optim.state`)
    meta.json     config, step, topology that wrote it, anything in `extra`, and the
                  size and SHA-256 of every other file (the manifest)

A checkpoint is complete or absent, never half-written, and a save never destroys
the previous one before the new one is whole: everything is written into a hidden
sibling directory and fsynced, then the sibling takes the directory's place by
rename (the old directory is moved aside first and removed last). If a kill lands
between those two renames, the next `read_meta`/`load` finds the directory missing
and the previous checkpoint aside, and puts it back. Reading checks the manifest,
so a damaged checkpoint is named as such before any process starts.

Everything is read with ``torch.load(weights_only=True)``: a checkpoint is data,
and loading one must not run code. For exact resume, the batches and random
numbers of step k must be functions of (seed, k) alone (`minitp.data` and
`minitp.train` make them so): `step` in meta.json is the whole data position.

Where each part lives: `minitp.checkpoint.files` holds the on-disk contract (the
atomic write, the verified read, what a killed save left); this module gathers the
shards into it and reshards out of it.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import asdict

import torch

from ..data_parallel import zero
from ..model import GPT, GPTConfig
from ..optim import state as muon_state
from ..optim.muon import Combined
from ..parallelize import parallelize
from ..rules import model_chunks
from ..runtime import _device, comm, trace
from ..runtime.mesh import Mesh, world
from .files import FORMAT, read_meta, write_checkpoint

ADAM_STATE = ("exp_avg", "exp_avg_sq")

@contextlib.contextmanager
def _parameters_replaced_by(model, values: dict):
    """Inside: each parameter p holds values[p] (same shape) instead of its weights."""
    saved = {}
    try:
        for p, value in values.items():
            saved[p] = p.data
            p.data = value
        yield
    finally:
        for p, data in saved.items():
            p.data = data


def dense_optimizer_state(model, optimizer) -> dict:
    """Adam's state gathered to dense tensors under the plain GPT's names (collective:
    every rank calls it). Returns {"step": tensor, "exp_avg": {...}, "exp_avg_sq": {...}}.
    At ZeRO stage 3 call it inside `zero.gathered(model)` (the parameters whole)."""
    params = list(model.parameters())
    muon = getattr(getattr(optimizer, "inner", optimizer), "is_muon", False)
    keys = muon_state.KEYS if muon else ADAM_STATE  # Muon's laid out as Adam's is
    by_param = zero.per_parameter_state(model, optimizer, muon_state.by_tensor(model, optimizer)
                                        if muon else None)
    states = [by_param.get(p, {}) for p in params]
    if not all(all(k in s for k in ADAM_STATE) for s in states):
        raise ValueError("the optimizer has no Adam state for every parameter yet: take at "
                         "least one step with torch.optim.Adam / AdamW before saving it")
    for p, s in zip(params, states, strict=True):
        if s["exp_avg"].shape != p.shape:
            raise NotImplementedError(
                "this optimizer's state is not shaped like its parameters (a ZeRO-sharded "
                "optimizer?): checkpoint.save can only gather per-parameter Adam state")
    dense = {"step": states[0]["step"].detach().clone()}
    for key in keys:
        with _parameters_replaced_by(model, {p: s[key] for p, s in zip(params, states,
                                                                          strict=True)}):
            dense[key] = {k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()}
    return dense


def save(model, directory: str, step: int, optimizer=None, extra: dict | None = None) -> None:
    """Write `model` (and `optimizer`'s Adam state) densely to `directory`.

    Collective: call it on every rank (the shards are gathered); global rank 0
    writes; every rank returns once the files are complete. Any ZeRO stage: the
    file is the same dense one (`zero.check_checkpointable` first: an optimizer
    that is not the model's stage's is refused before anything is gathered).
    """
    mesh: Mesh = model.mesh
    if not hasattr(model, "full_state_dict"):
        raise TypeError("checkpoint.save expects a parallel model (from mt.parallelize)")
    zero.check_checkpointable(model, optimizer)
    with trace.paused(), zero.gathered(model):  # bookkeeping, not part of the run traced
        weights = {k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()}
        weights.update(dense_expert_biases(model, mesh))
        optim = dense_optimizer_state(model, optimizer) if optimizer is not None else None
        if mesh.rank == 0:
            meta = {
                "format": FORMAT, "config": asdict(model.cfg), "step": int(step),
                "dtype": str(next(iter(weights.values())).dtype).removeprefix("torch."),
                "topology": {"dp": mesh.dp_size, "pp": mesh.pp_size, "cp": mesh.cp_size,
                             "tp": mesh.tp_size, "ep": mesh.ep_size,
                             "sequence_parallel": bool(getattr(model, "sequence_parallel",
                                                               False)),
                             "zero_stage": zero.zero_stage_of(model)},
                "has_optimizer": optim is not None,
                "extra": extra or {},
            }
            write_checkpoint(directory, weights, optim, meta)
        comm.barrier(world())


def dense_expert_biases(model, mesh: Mesh) -> dict:
    """Every MoE layer's expert bias (a buffer the plain GPT saves in its state dict) under
    its plain name, on every rank: each pipeline stage fills in its own layers' and the
    stages sum the table (every layer is on one stage)."""
    cfg = model.cfg
    moe = [i for i in range(cfg.n_layer) if cfg.n_experts and cfg.is_moe_layer(i)]
    if not moe:
        return {}
    table = torch.zeros(cfg.n_layer, cfg.n_experts, device=_device.device())
    for chunk in model_chunks(model):
        for j, block in enumerate(chunk.blocks):
            layer = getattr(block, "module", block).mlp  # a recomputed block wraps it
            if hasattr(layer, "router"):
                table[chunk.layer_offset + j] = layer.router.expert_bias
    table = comm.all_reduce(table, mesh.pp).cpu()
    return {f"blocks.{i}.mlp.router.expert_bias": table[i].clone() for i in moe}


def load_dense(directory: str, config: GPTConfig | None = None
               ) -> tuple[GPT, dict, dict | None]:
    """The plain GPT of a checkpoint, its meta, and its dense Adam state (or None).
    No process group needed: this is also how a single process reads one.
    config: the GPTConfig to build (default the checkpoint's); it must hold the same
    tensors (e.g. another top_k: `minitp.train`'s --load applies the routing flags)."""
    meta = read_meta(directory)
    cfg = GPTConfig(**meta["config"]) if config is None else config
    ref = _gpt_from(cfg, torch.load(os.path.join(directory, "model.pt"), weights_only=True))
    optim = None
    if meta["has_optimizer"]:
        optim = torch.load(os.path.join(directory, "optimizer.pt"), weights_only=True)
    return ref, meta, optim


def load_dense_optimizer(ref: GPT, optimizer, dense: dict) -> None:
    """Put dense Adam state into `optimizer` over the plain GPT `ref`'s parameters (Muon's
    into `mt.optim.muon_with_adamw(ref)`'s)."""
    if _saved_by_muon(dense, isinstance(optimizer, Combined)):
        return muon_state.load_one_process(ref, optimizer, dense)
    for name, p in ref.named_parameters():
        optimizer.state[p] = {"step": dense["step"].clone(),
                              **{k: dense[k][name].clone().to(p) for k in ADAM_STATE}}


def load(directory: str, mesh: Mesh, sequence_parallel: bool = False, recompute=None,
         virtual_stages: int = 1, optimizer_factory=None, device=None, zero_stage: int = 0,
         tp_overlap: bool = False, placement: str = "loop", vision_layout: str = "replicated",
         config: GPTConfig | None = None, validated: bool = False, cp_comm: str = "ring",
         cp_a2a_size: int | None = None, pipeline_layout=None, muon: dict | None = None):
    """Rebuild a checkpoint for this rank of `mesh`: returns (model, optimizer, meta).

    device: where this rank's shard lives (default `mt.device()`: its GPU under NCCL).
    zero_stage: the ZeRO stage to resume at, whatever stage wrote the file.
    tp_overlap, placement, vision_layout, cp_comm, cp_a2a_size, pipeline_layout: as
    `mt.parallelize`'s (they change how a step runs, not what is saved: the dense state
    loads at any pipeline layout), validated: as `mt.parallelize`'s. config: as
    `load_dense`'s.

    optimizer_factory: called with the tensors this rank steps (e.g.
    ``lambda params: torch.optim.Adam(params, lr=1e-3)``): the parallel model's
    parameters, or at a ZeRO stage its shards (through `mt.make_optimizer`);
    the saved Adam state is resharded into it. None: no optimizer (returned as None).
    muon: ``mt.make_optimizer(model, mesh, "muon", **muon)`` instead, the saved Muon state
    resharded into it (`minitp.optim.state`).
    """
    ref, meta, dense_optim = load_dense(directory, config)
    device = _device.device() if device is None else device
    ref = ref.to(device)
    plan = dict(sequence_parallel=sequence_parallel, recompute=recompute,
                virtual_stages=virtual_stages, zero_stage=zero_stage, tp_overlap=tp_overlap,
                placement=placement, vision_layout=vision_layout, cp_comm=cp_comm,
                cp_a2a_size=cp_a2a_size, pipeline_layout=pipeline_layout)
    model = parallelize(ref, mesh, **plan, validated=validated)
    optimizer = None
    if dense_optim is not None and (muon is not None or optimizer_factory is not None):
        _saved_by_muon(dense_optim, muon is not None)
    if muon is not None:
        optimizer = zero.make_optimizer(model, mesh, "muon", **muon)
        if dense_optim is not None:
            muon_state.load_tensors(model, optimizer, {
                key: _shard_like(ref, dense_optim[key], mesh, plan, device)
                for key in muon_state.KEYS}, dense_optim["step"])
    elif optimizer_factory is not None:
        optimizer = zero.make_optimizer(model, mesh, optimizer_factory)
        if dense_optim is not None:
            shards = {key: _shard_like(ref, dense_optim[key], mesh, plan, device)
                      for key in ADAM_STATE}
            for index, t in enumerate(zero.stepped_tensors(optimizer)):
                optimizer.state[t] = {"step": dense_optim["step"].clone(),
                                      **{k: shards[k][index] for k in ADAM_STATE}}
    return model, optimizer, meta


def _saved_by_muon(dense: dict, muon: bool) -> bool:
    """Whether `dense` is Muon's state; one line if it is not the optimizer's own kind (each
    holds zeros where the other optimizer steps an element: never a silent restart)."""
    saved = muon_state.MOMENTUM in dense
    if saved != muon:
        raise ValueError(f"checkpoint: its optimizer state is {'Muon' if saved else 'Adam'}'s, "
                         f"not {'Muon' if muon else 'Adam'}'s")
    return saved


def _shard_like(ref: GPT, dense: dict, mesh, plan: dict, device):
    """This rank's shards of the dense tensors `dense` (named like ref's parameters), in
    the order the model's optimizer steps them: parallelize a GPT made of them with
    the same `plan` and take what its optimizer would step (at a ZeRO stage: its
    flat shards). The optimizer made for it is a placeholder, never stepped."""
    holder = _gpt_from(ref.cfg, dense).to(device)
    sharded = parallelize(holder, mesh, **plan)
    placeholder = zero.make_optimizer(sharded, mesh, lambda ts: torch.optim.SGD(ts, lr=0.0))
    return [t.detach().clone() for t in zero.stepped_tensors(placeholder)]


def _gpt_from(cfg: GPTConfig, tensors: dict) -> GPT:
    """A plain GPT holding `tensors` (dtype theirs). Its random init is overwritten at
    once, so it runs on a forked RNG: loading must not move the caller's random stream."""
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg).to(next(iter(tensors.values())).dtype)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # Adam's state has no expert bias (a buffer, not a parameter): only that may be missing
    if unexpected or any(not name.endswith("router.expert_bias") for name in missing):
        raise RuntimeError(f"checkpoint: tensors do not match the model (missing {missing}, "
                           f"unexpected {unexpected})")
    return model
