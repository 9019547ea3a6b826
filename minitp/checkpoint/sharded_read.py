"""Reading sharded checkpoints (`sharded`): find the newest complete step, check it in the
parent before any rank starts, and load it at any layout, each rank reading only the
bytes its own shards need.

A rank that loads asks `layout.local_ids` which elements its tensors hold under the new
plan (any dp, tp, pp, cp, ep, ZeRO stage), looks each up in the manifest (which file,
which byte), and reads those bytes with ``os.pread``, one read per contiguous run: the
count of bytes it read is returned, to compare with a dense load, where every rank
reads every byte. The files are raw numbers (no pickle): reading runs no code.
"""

from __future__ import annotations

import json
import math
import os

import torch

from ..model import GPTConfig
from . import files, reshard
from .files import _fingerprint
from .layout import ADAM_STATE, Space, contiguous_runs, local_ids, local_tensors
from .manifest import MANIFEST, check_sealed
from .manifest import check as check_manifest
from .sharded import SHARDED_FORMAT, STEP_DIR, remove_partials, step_dirs


def is_sharded(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def newest_complete(directory: str) -> str | None:
    """The newest ``step-<n>`` under `directory` that has its manifest (an interrupted
    save never does), or None. What killed saves left there is removed first."""
    remove_partials(os.path.abspath(directory))
    complete = [p for _, p in step_dirs(directory) if is_sharded(p)]
    return complete[-1] if complete else None


def read_meta(directory: str) -> dict:
    """`files.read_meta` for either format: a sharded checkpoint's manifest (checked by
    `read_manifest`), or a dense checkpoint's meta.json."""
    return read_manifest(directory) if is_sharded(directory) else files.read_meta(directory)


def resolve(directory: str) -> str:
    """The checkpoint `--load DIR` means: DIR itself if it is one (sharded, or dense with no
    newer step beside it), else DIR's newest complete step. One-line errors otherwise."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{directory!r}: no such checkpoint directory")
    if is_sharded(directory):
        return directory
    dense = os.path.isfile(os.path.join(directory, "meta.json"))
    if not dense and STEP_DIR.match(os.path.basename(os.path.normpath(directory))):
        raise ValueError(f"{directory!r} has no {MANIFEST}: its save was interrupted, so it "
                         f"is incomplete (give its parent directory to use the newest "
                         f"complete step)")
    found = newest_complete(directory)
    if dense and (found is None or _step_of(found) < _dense_step(directory)):
        return directory  # (a run that saved dense, then --save-every: the newer wins)
    if found is None:
        raise FileNotFoundError(f"{directory!r} holds no complete checkpoint (no step-<n> "
                                f"with its {MANIFEST})")
    return found


def _step_of(step_dir: str) -> int:
    return int(STEP_DIR.match(os.path.basename(step_dir)).group(1))


def _dense_step(directory: str) -> float:
    """meta.json's step, or infinity where it cannot be read (`files.read_meta` then says
    what is wrong with it, in one line)."""
    try:
        with open(os.path.join(directory, "meta.json")) as f:
            step = json.load(f)["step"]
        return step if isinstance(step, int) else math.inf
    except (OSError, ValueError, KeyError, TypeError):
        return math.inf


def read_manifest(directory: str, verify: bool = True) -> dict:
    """manifest.json of a sharded checkpoint: sealed by manifest.sha256, every field as
    `sharded` writes it (`manifest.check`: confined to `directory`, the holds tiling every
    tensor once), and with `verify` every file it lists whole and unchanged (size, then
    SHA-256: `files`' check). Returns it with the keys `files.read_meta` gives ("config",
    "step", "dtype", "has_optimizer")."""
    path = os.path.join(directory, MANIFEST)
    with open(path, "rb") as f:
        text = f.read()
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged (not JSON: {exc})") from None
    if not isinstance(parsed, dict) or parsed.get("format") != SHARDED_FORMAT:
        found = parsed.get("format") if isinstance(parsed, dict) else parsed
        raise ValueError(f"{path}: unknown checkpoint format {found!r}"
                         + (" (written by an older minitp, before manifests were sealed)"
                            if found == "minitp-sharded-1" else ""))
    check_sealed(directory, text)
    check_manifest(directory, parsed)
    for name, entry in parsed["files"].items() if verify else ():
        file = os.path.join(directory, name)
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            raise ValueError(f"checkpoint {directory!r} is damaged: {name} is {size:,} bytes, "
                             f"not the {entry['bytes']:,} it was saved with (truncated?)")
        if _fingerprint(file)["sha256"] != entry["sha256"]:
            raise ValueError(f"checkpoint {directory!r} is damaged: {name}'s contents changed "
                             f"since it was saved (SHA-256 differs)")
    return parsed | {"has_optimizer": True}


class Reader:
    """Reads elements of a sharded checkpoint by id (`layout.Space`), counting bytes."""

    def __init__(self, directory: str, manifest: dict):
        self.directory, self.manifest = directory, manifest
        self.dtype = getattr(torch, manifest["dtype"])
        self.itemsize = torch.empty(0, dtype=self.dtype).element_size()
        space = Space.of(GPTConfig(**manifest["config"]))
        first = {name: start for name, _, start in space.tensors}
        self.names = sorted(manifest["files"])
        self.file_of = torch.full((space.size,), -1, dtype=torch.int32)
        self.elem_of = torch.zeros(space.size, dtype=torch.int64)
        for f, name in enumerate(self.names):
            for hold in manifest["files"][name]["holds"]:
                at = hold["offset"] // self.itemsize
                for lo, hi in hold["runs"]:
                    ids = slice(first[hold["tensor"]] + lo, first[hold["tensor"]] + hi)
                    self.file_of[ids] = f
                    self.elem_of[ids] = torch.arange(at, at + hi - lo)
                    at += hi - lo
        self.bytes_read = 0

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        """The values of sorted unique `ids`, read run by run (only those bytes)."""
        out = torch.empty(ids.numel(), dtype=self.dtype)
        files = self.file_of[ids]
        if bool((files < 0).any()):
            raise ValueError(f"checkpoint {self.directory!r}: no file holds some elements")
        for f in torch.unique(files).tolist():
            where = torch.nonzero(files == f).flatten()
            elems = self.elem_of[ids[where]]
            order = torch.argsort(elems)
            elems, where = elems[order], where[order]
            got = []
            fd = os.open(os.path.join(self.directory, self.names[f]), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                for lo, hi in contiguous_runs(elems):
                    data = os.pread(fd, (hi - lo) * self.itemsize, lo * self.itemsize)
                    self.bytes_read += len(data)
                    got.append(torch.frombuffer(bytearray(data), dtype=self.dtype))
            finally:
                os.close(fd)
            out[where] = torch.cat(got)
        return out


def load_into(directory: str, model, optimizer, mesh, plan: dict) -> dict:
    """Fill a parallel `model` (built with `plan`, `mt.parallelize`'s keywords) and its
    `optimizer` (from `zero.make_optimizer`) from the sharded checkpoint, reading only the
    elements this rank holds. Returns the manifest and "bytes_read": this rank's count."""
    manifest = read_manifest(directory, verify=False)  # the parent verified it
    reader = Reader(directory, manifest)
    space = Space.of(model.cfg)
    model_ids, step_ids = local_ids(model.cfg, mesh, plan, space)
    adam = [ids[ids >= 0] + space.n_model + k * space.n_params
            for k in range(len(ADAM_STATE)) for ids in step_ids]
    wanted = torch.unique(torch.cat([ids[ids >= 0] for ids in model_ids + step_ids] + adam))
    cache = torch.zeros(space.size, dtype=reader.dtype)
    cache[wanted] = reader.read(wanted)
    models, stepped = local_tensors(model, optimizer)
    with torch.no_grad():
        for t, ids in zip(models + stepped, model_ids + step_ids, strict=True):
            keep = ids >= 0
            flat = t.data.view(-1)
            flat[keep.to(flat.device)] = cache[ids[keep]].to(flat)
    step = torch.tensor(manifest["adam_step"]["value"],
                        dtype=getattr(torch, manifest["adam_step"]["dtype"]))
    for t, ids in zip(stepped, step_ids, strict=True):
        keep = ids >= 0
        state = {"step": step.clone()}
        for k, key in enumerate(ADAM_STATE):
            value = torch.zeros(t.numel(), dtype=t.dtype)
            value[keep] = cache[ids[keep] + space.n_model + k * space.n_params].to(t.dtype)
            state[key] = value.view(t.shape).to(t.device)
        optimizer.state[t] = state
    rng = manifest["files"].get(f"rank-{mesh.rank}.bin", {}).get("rng")
    if rng is not None and len(manifest["files"]) == mesh.world_size:
        torch.set_rng_state(torch.frombuffer(bytearray(bytes.fromhex(rng)), dtype=torch.uint8))
    return manifest | {"bytes_read": reader.bytes_read}


def load_dense(directory: str, config: GPTConfig | None = None):
    """`reshard.load_dense` for either format: (plain GPT, meta, dense Adam state); a
    sharded checkpoint is read whole, in this one process."""
    if not is_sharded(directory):
        return reshard.load_dense(directory, config)
    manifest = read_manifest(directory)
    cfg = GPTConfig(**manifest["config"]) if config is None else config
    space = Space.of(GPTConfig(**manifest["config"]))
    values = Reader(directory, manifest).read(torch.arange(space.size))
    tensors = {}
    for name, shape, start in space.tensors:
        tensors[name] = values[start:start + torch.Size(shape).numel()].view(shape).clone()
    model = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    step = torch.tensor(manifest["adam_step"]["value"],
                        dtype=getattr(torch, manifest["adam_step"]["dtype"]))
    optim = {"step": step, **{key: {k.removeprefix(f"{key}/"): v for k, v in tensors.items()
                                    if k.startswith(f"{key}/")} for key in ADAM_STATE}}
    return reshard._gpt_from(cfg, model), manifest, optim


def load(directory: str, mesh, optimizer_factory=None, device=None,
         config: GPTConfig | None = None, **plan):
    """`reshard.load` for either format (the same arguments; plan: `mt.parallelize`'s
    keywords). A sharded checkpoint: (model, optimizer, manifest with "bytes_read"); the
    model is built at `plan` on a forked RNG (every initial value is overwritten), then
    filled by `load_into`, each rank reading only its own elements."""
    if not is_sharded(directory):
        return reshard.load(directory, mesh, optimizer_factory=optimizer_factory,
                            device=device, config=config, **plan)
    from ..data_parallel import zero
    from ..model import GPT
    from ..parallelize import parallelize
    from ..runtime import _device

    manifest = read_manifest(directory, verify=False)
    cfg = GPTConfig(**manifest["config"]) if config is None else config
    device = _device.device() if device is None else device
    with torch.random.fork_rng(devices=[]):
        ref = GPT(cfg).to(device, getattr(torch, manifest["dtype"]))
    model = parallelize(ref, mesh, **plan)
    factory = optimizer_factory or (lambda ts: torch.optim.Adam(ts, lr=0.0))
    optimizer = zero.make_optimizer(model, mesh, factory)
    meta = load_into(directory, model, optimizer, mesh, plan)
    return model, optimizer if optimizer_factory is not None else None, meta
