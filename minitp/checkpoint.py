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

ZeRO (`minitp.zero`) changes only the first and last step of that. Saving: its
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

Why one file: the dense format, the atomic write that produces it and the
verified read that accepts it are one contract; each half is only checkable
against the other, and the resharding on either side is a few lines over them.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import asdict, fields

import torch

from . import _device, comm, trace, zero
from ._processes import alive
from .mesh import Mesh, world
from .model import GPT, GPTConfig
from .parallelize import parallelize

ADAM_STATE = ("exp_avg", "exp_avg_sq")
FORMAT = "minitp-checkpoint-2"  # 2: meta.json carries a manifest; saved atomically
_READABLE_FORMATS = ("minitp-checkpoint-1", FORMAT)
_META_KEYS = {"format", "config", "step", "dtype", "topology", "has_optimizer", "extra", "files"}


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
    by_param = zero.per_parameter_state(model, optimizer)
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
    for key in ADAM_STATE:
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
        optim = dense_optimizer_state(model, optimizer) if optimizer is not None else None
        if mesh.rank == 0:
            meta = {
                "format": FORMAT, "config": asdict(model.cfg), "step": int(step),
                "dtype": str(next(iter(weights.values())).dtype).removeprefix("torch."),
                "topology": {"dp": mesh.dp_size, "pp": mesh.pp_size, "cp": mesh.cp_size,
                             "tp": mesh.tp_size,
                             "sequence_parallel": bool(getattr(model, "sequence_parallel",
                                                               False)),
                             "zero_stage": zero.zero_stage_of(model)},
                "has_optimizer": optim is not None,
                "extra": extra or {},
            }
            _write_checkpoint(directory, weights, optim, meta)
        comm.barrier(world())


def check_save_target(directory: str) -> None:
    """Raise at once (not after training) if a checkpoint cannot be written there."""
    path = os.path.abspath(directory)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(f"{directory!r} exists and is not a directory")
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise NotADirectoryError(f"cannot create {directory!r}: {parent!r} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write a checkpoint under {parent!r}")


def _write_checkpoint(directory: str, weights: dict, optim: dict | None, meta: dict) -> None:
    """Write the files into a hidden sibling, then swap it in (see the module's docstring)."""
    check_save_target(directory)
    path = os.path.abspath(directory)
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _recover(path)
    _remove_leftovers(path)
    staging = tempfile.mkdtemp(prefix=f".{base}.partial-{os.getpid()}-", dir=parent)
    files = {"model.pt": weights} | ({"optimizer.pt": optim} if optim is not None else {})
    manifest = {}
    for name, obj in files.items():
        _write(os.path.join(staging, name), lambda f, obj=obj: torch.save(obj, f))
        manifest[name] = _fingerprint(os.path.join(staging, name))
    text = json.dumps(meta | {"files": manifest}, indent=1).encode()
    _write(os.path.join(staging, "meta.json"), lambda f: f.write(text))  # last: the seal
    _fsync_directory(staging)
    if os.path.exists(path):
        aside = os.path.join(parent, f".{base}.previous-{os.getpid()}")
        os.rename(path, aside)      # a kill from here ...
        os.rename(staging, path)    # ... to here leaves `aside`, which _recover puts back
        _fsync_directory(parent)
        shutil.rmtree(aside, ignore_errors=True)  # a leftover is removed by the next save
    else:
        os.rename(staging, path)
        _fsync_directory(parent)


def _write(path: str, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fingerprint(path: str) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": os.path.getsize(path), "sha256": digest.hexdigest()}


def _recover(path: str) -> None:
    """A save killed between its two renames left no `path` but the previous
    checkpoint aside: put it back."""
    if os.path.exists(path):
        return
    parent, base = os.path.split(path)
    aside = sorted(glob.glob(os.path.join(parent, f".{base}.previous-*")))
    for candidate in aside:
        if os.path.isfile(os.path.join(candidate, "meta.json")):
            with contextlib.suppress(OSError):  # another rank may be putting it back too
                os.rename(candidate, path)
            return


def _remove_leftovers(path: str) -> None:
    """Remove the hidden siblings a killed save left beside `path` (its half-written
    `.partial-<pid>-*` directory, or the previous checkpoint it had moved aside): up to
    the size of a whole checkpoint each. One whose process is still alive is a save in
    progress, and is left alone."""
    parent, base = os.path.split(path)
    for kind in ("partial", "previous"):
        prefix = f".{base}.{kind}-"
        for stale in glob.glob(os.path.join(parent, glob.escape(prefix) + "*")):
            pid = os.path.basename(stale).removeprefix(prefix).split("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and alive(int(pid)):
                continue
            shutil.rmtree(stale, ignore_errors=True)


def read_meta(directory: str) -> dict:
    """meta.json of a checkpoint, once every file it lists is there, whole and
    unchanged; a clear error naming what is wrong otherwise. What a killed save left
    beside it is removed first (see `_remove_leftovers`)."""
    _recover(os.path.abspath(directory))
    if os.path.isdir(directory):
        _remove_leftovers(os.path.abspath(directory))
    path = os.path.join(directory, "meta.json")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory!r}: no such checkpoint directory")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory!r} is not a minitp checkpoint (no meta.json)")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged (not JSON: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") not in _READABLE_FORMATS:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"{path}: unknown checkpoint format {found!r}")
    _check_meta(path, meta)
    for name, expected in _listed_files(meta).items():
        file = os.path.join(directory, name)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"checkpoint {directory!r} is incomplete: {name} is missing")
        if expected is None:  # format 1 kept no manifest: at least refuse an empty file
            if os.path.getsize(file) == 0:
                raise ValueError(f"checkpoint {directory!r} is damaged: {name} is empty")
        elif _fingerprint(file) != expected:
            raise ValueError(
                f"checkpoint {directory!r} is damaged: {name} is {os.path.getsize(file):,} "
                f"bytes, not the {expected['bytes']:,} it was saved with, or its contents "
                "changed since (SHA-256 differs)")
    for name in _listed_files(meta):
        _check_holds_only_tensors(directory, name)
    return meta


def _check_holds_only_tensors(directory: str, name: str) -> None:
    """Unpickle `name` as `torch.load(weights_only=True)` would (memory-mapped: its bytes
    are not read), so that a file holding anything but tensors (a manifest can be
    re-sealed to match a malicious one) is refused in one line before any rank starts,
    not by every rank with a torch traceback that suggests weights_only=False."""
    try:
        torch.load(os.path.join(directory, name), weights_only=True, mmap=True,
                   map_location="cpu")
    except pickle.UnpicklingError as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line),
                      "it holds objects that are not tensors")
        raise ValueError(
            f"checkpoint {directory!r}: {name} holds more than tensors, and minitp loads only "
            f"tensors (torch.load(weights_only=True) refused it: {reason}); do not load it "
            "with weights_only=False unless you trust where it came from") from None
    except RuntimeError as exc:
        raise ValueError(f"checkpoint {directory!r}: {name} is not a file torch.save wrote "
                         f"({str(exc).strip().splitlines()[0]})") from None


def _check_meta(path: str, meta: dict) -> None:
    unknown = set(meta) - _META_KEYS
    missing = {"config", "step", "dtype", "has_optimizer"} - set(meta)
    if unknown or missing:
        raise ValueError(f"{path}: " + "; ".join(
            ([f"unknown keys {sorted(unknown)}"] if unknown else [])
            + ([f"missing keys {sorted(missing)}"] if missing else [])))
    known = {f.name for f in fields(GPTConfig)}
    if not isinstance(meta["config"], dict) or set(meta["config"]) - known:
        odd = sorted(set(meta["config"]) - known) if isinstance(meta["config"], dict) else "?"
        raise ValueError(f"{path}: config has fields a GPTConfig does not: {odd}")


def _listed_files(meta: dict) -> dict:
    if "files" in meta:
        return meta["files"]
    return {"model.pt": None} | ({"optimizer.pt": None} if meta["has_optimizer"] else {})


def load_dense(directory: str) -> tuple[GPT, dict, dict | None]:
    """The plain GPT of a checkpoint, its meta, and its dense Adam state (or None).
    No process group needed: this is also how a single process reads one."""
    meta = read_meta(directory)
    cfg = GPTConfig(**meta["config"])
    ref = _gpt_from(cfg, torch.load(os.path.join(directory, "model.pt"), weights_only=True))
    optim = None
    if meta["has_optimizer"]:
        optim = torch.load(os.path.join(directory, "optimizer.pt"), weights_only=True)
    return ref, meta, optim


def load_dense_optimizer(ref: GPT, optimizer, dense: dict) -> None:
    """Put dense Adam state into `optimizer` over the plain GPT `ref`'s parameters."""
    for name, p in ref.named_parameters():
        optimizer.state[p] = {"step": dense["step"].clone(),
                              **{k: dense[k][name].clone().to(p) for k in ADAM_STATE}}


def load(directory: str, mesh: Mesh, sequence_parallel: bool = False, recompute=None,
         virtual_stages: int = 1, optimizer_factory=None, device=None, zero_stage: int = 0,
         tp_overlap: bool = False):
    """Rebuild a checkpoint for this rank of `mesh`: returns (model, optimizer, meta).

    device: where this rank's shard lives (default `mt.device()`: its GPU under NCCL).
    zero_stage: the ZeRO stage to resume at, whatever stage wrote the file.
    tp_overlap: as `mt.parallelize`'s (it changes how a step runs, not what is saved).

    optimizer_factory: called with the tensors this rank steps (e.g.
    ``lambda params: torch.optim.Adam(params, lr=1e-3)``): the parallel model's
    parameters, or at a ZeRO stage its shards (through `mt.make_optimizer`);
    the saved Adam state is resharded into it. None: no optimizer (returned as None).
    """
    ref, meta, dense_optim = load_dense(directory)
    device = _device.device() if device is None else device
    ref = ref.to(device)
    plan = dict(sequence_parallel=sequence_parallel, recompute=recompute,
                virtual_stages=virtual_stages, zero_stage=zero_stage, tp_overlap=tp_overlap)
    model = parallelize(ref, mesh, **plan)
    optimizer = None
    if optimizer_factory is not None:
        optimizer = zero.make_optimizer(model, mesh, optimizer_factory)
        if dense_optim is not None:
            shards = {key: _shard_like(ref, dense_optim[key], mesh, plan, device)
                      for key in ADAM_STATE}
            for index, t in enumerate(zero.stepped_tensors(optimizer)):
                optimizer.state[t] = {"step": dense_optim["step"].clone(),
                                      **{k: shards[k][index] for k in ADAM_STATE}}
    return model, optimizer, meta


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
    model.load_state_dict(tensors, strict=True)
    return model
