"""A sharded checkpoint's manifest, checked field by field before any rank reads a byte.

A manifest says which file holds which elements at which byte, so a wrong one makes a
load read the wrong bytes, or bytes from outside the checkpoint, into the model: a
silent wrong result, never an error. So every field is checked against what `sharded`
writes, and anything else is refused in one line:

* the files are named ``rank-<r>.bin`` for every rank of the topology that wrote them
  (no other name: no ``..``, no absolute path, no sub-folder), each a plain file inside
  the step directory (a symlink is refused: it could point anywhere);
* every value has its type: `step` a non-negative int, `dtype` one minitp writes, Adam's
  step finite and non-negative, each `rng` the hex of one CPU generator state, each
  `sha256` 64 hex digits;
* the holds tile every tensor exactly once (no element claimed twice or never), each
  within its tensor, with the tensor's shape, packed in its file from byte 0 to its end.

The manifest itself is covered by ``manifest.sha256``, written after it and before the
step's directory is renamed into place (`seal`), so an edited field (a config's `causal`,
a hold's offset) is refused as damage. That hash catches a careless edit, not a forger,
who can hash again; a forged manifest still has to pass every check above.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from dataclasses import fields

import torch

from ..model import GPTConfig
from .layout import Space

MANIFEST, SEAL = "manifest.json", "manifest.sha256"
# What `sharded.Saver` writes: its model's floating dtype (bfloat16 runs are refused by
# the CLI, but the library's Saver can write one); Adam's step is a float tensor.
DTYPES = ("float32", "float64", "bfloat16", "float16")
KEYS = {"format", "config", "step", "dtype", "topology", "adam_step", "extra", "tensors", "files"}
FILE_KEYS = {"rank", "bytes", "sha256", "rng", "holds"}
HOLD_KEYS = {"tensor", "shape", "runs", "offset", "bytes"}
TOPOLOGY = ("dp", "pp", "cp", "tp", "ep", "zero_stage")
SHARD = re.compile(r"^rank-(0|[1-9]\d*)\.bin$")
HEX = re.compile(r"^[0-9a-f]*$")
_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str, "None": type(None)}


def digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def check_sealed(directory: str, text: bytes) -> None:
    """Refuse a manifest whose bytes are not the ones ``manifest.sha256`` was written for."""
    try:
        with open(os.path.join(directory, SEAL)) as f:
            sealed = f.read().strip()
    except FileNotFoundError:
        raise ValueError(f"checkpoint {directory!r} is damaged: it has no {SEAL} (the hash "
                         f"of its {MANIFEST}, written with it)") from None
    if sealed != digest(text):
        raise ValueError(f"checkpoint {directory!r} is damaged: {MANIFEST} changed since it "
                         f"was saved (its SHA-256 is not the one {SEAL} holds)")


def _int(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def config_problem(config) -> str | None:
    """Why `config` is not a GPTConfig's fields, each of its annotated type, or None."""
    if not isinstance(config, dict):
        return "config is not an object"
    known = {f.name: f.type for f in fields(GPTConfig)}  # "int", "float | None", ...
    if set(config) - set(known):  # one a newer GPTConfig has may be absent: its default
        return f"config has fields a GPTConfig does not: {sorted(set(config) - set(known))}"
    for name, value in config.items():
        allowed = [t.strip() for t in str(known[name]).split("|")]
        kinds = tuple(_TYPES[t] for t in allowed)
        if (not isinstance(value, kinds) or (isinstance(value, bool) and "bool" not in allowed)
                or (isinstance(value, float) and not math.isfinite(value))):
            return f"config's {name} is {value!r}, not a {known[name]}"
    return None


def check(directory: str, manifest: dict) -> GPTConfig:
    """Every field of `manifest` (a parsed manifest.json, its format already known) as
    `sharded` writes it; returns its config. Raises ValueError (or FileNotFoundError for
    a missing shard) in one line."""
    def refuse(why: str):
        raise ValueError(f"checkpoint {directory!r}: {MANIFEST}: {why}")

    if set(manifest) != KEYS:
        refuse(f"its fields are not a sharded checkpoint's: {sorted(set(manifest) ^ KEYS)}")
    if (why := config_problem(manifest["config"])) is not None:
        refuse(why)
    try:
        cfg = GPTConfig(**manifest["config"])
    except ValueError as exc:
        refuse(f"config: {exc}")
    tensors = [[name, list(shape)] for name, shape, _ in Space.of(cfg).tensors]
    if manifest["tensors"] != tensors:
        raise ValueError(f"checkpoint {directory!r}: its tensors are not those of the model "
                         f"its config describes (a checkpoint from another model)")
    if not _int(manifest["step"]):
        refuse(f"step is {manifest['step']!r}, not a whole number of steps >= 0")
    if manifest["dtype"] not in DTYPES:
        refuse(f"dtype is {manifest['dtype']!r}; minitp writes one of {DTYPES}")
    topology = manifest["topology"]
    if (not isinstance(topology, dict) or set(topology) != set(TOPOLOGY)
            or not all(_int(topology[k], 1) for k in TOPOLOGY[:-1])
            or topology["zero_stage"] not in (0, 1, 2, 3)):
        refuse(f"topology is {topology!r}, not sizes >= 1 and a ZeRO stage 0-3")
    adam = manifest["adam_step"]
    if (not isinstance(adam, dict) or set(adam) != {"value", "dtype"}
            or adam["dtype"] not in DTYPES or not isinstance(adam["value"], (int, float))
            or isinstance(adam["value"], bool) or not math.isfinite(adam["value"])
            or adam["value"] < 0):
        refuse(f"adam_step is {adam!r}, not a finite count >= 0 with a float dtype")
    if not isinstance(manifest["extra"], dict):
        refuse("extra is not an object")
    files = manifest["files"]
    if not isinstance(files, dict):
        refuse(f"files is a {type(files).__name__}, not an object naming each rank's file")
    world = math.prod(topology[k] for k in ("dp", "pp", "cp", "tp"))
    if world > len(files):  # (a count first: a forged topology's world can be huge)
        refuse(f"lists {len(files)} files, where the topology's {world} ranks each wrote one")
    expected = {f"rank-{r}.bin" for r in range(world)}
    if set(files) != expected:
        odd = sorted(set(files) - expected)
        refuse(f"names files {odd} that are not a rank's file of this topology" if odd else
               f"lacks {sorted(expected - set(files))}: every rank's file is listed")
    itemsize = torch.empty(0, dtype=getattr(torch, manifest["dtype"])).element_size()
    shapes = {name: tuple(shape) for name, shape in tensors}
    claimed = {name: [] for name in shapes}
    for name, entry in files.items():
        _check_file(directory, name, entry, shapes, claimed, itemsize, refuse)
    for name, runs in claimed.items():
        at = 0
        for lo, hi in sorted(runs):
            if lo != at:
                refuse(f"{name}'s elements {min(lo, at)} to {max(lo, at)} are "
                       + ("held twice" if lo < at else "held by no file"))
            at = hi
        if at != math.prod(shapes[name]):
            refuse(f"{name}'s elements from {at} on are held by no file")
    return cfg


def _check_file(directory, name, entry, shapes, claimed, itemsize, refuse) -> None:
    """One file's entry: its fields, its holds packed from byte 0, and the file itself
    a plain file inside `directory` (its size and hash: `sharded_read.read_manifest`)."""
    if not isinstance(entry, dict) or set(entry) != FILE_KEYS:
        refuse(f"{name}'s entry has fields {sorted(entry) if isinstance(entry, dict) else '?'}"
               f", not {sorted(FILE_KEYS)}")
    if entry["rank"] != int(SHARD.match(name).group(1)) or isinstance(entry["rank"], bool):
        refuse(f"{name}'s rank is {entry['rank']!r}")
    if not isinstance(entry["sha256"], str) or not HEX.match(entry["sha256"]) \
            or len(entry["sha256"]) != 64:
        refuse(f"{name}'s sha256 is not 64 hex digits")
    state = 2 * torch.get_rng_state().numel()  # hex digits of one CPU generator's state
    if not isinstance(entry["rng"], str) or not HEX.match(entry["rng"]) \
            or len(entry["rng"]) != state:
        refuse(f"{name}'s rng is not {state} hex digits (a CPU generator's state)")
    if not _int(entry["bytes"]) or not isinstance(entry["holds"], list):
        refuse(f"{name}'s bytes or holds are not a count and a list")
    offset = 0
    for hold in entry["holds"]:
        if not isinstance(hold, dict) or set(hold) != HOLD_KEYS:
            refuse(f"{name} has a hold without the fields {sorted(HOLD_KEYS)}")
        tensor = hold["tensor"]
        if not isinstance(tensor, str) or tensor not in shapes:
            refuse(f"{name} holds {tensor!r}, which is not a tensor of this model")
        if not isinstance(hold["shape"], list) or tuple(hold["shape"]) != shapes[tensor]:
            refuse(f"{name} gives {tensor} the shape {hold['shape']!r}, not "
                   f"{list(shapes[tensor])}")
        if hold["offset"] != offset:
            refuse(f"{name}'s hold of {tensor} starts at byte {hold['offset']!r}, not "
                   f"{offset} (the holds are packed in order)")
        runs, count = hold["runs"], 0
        if not isinstance(runs, list) or not all(
                isinstance(r, list) and len(r) == 2 and _int(r[0]) and _int(r[1], r[0] + 1)
                for r in runs):
            refuse(f"{name}'s runs of {tensor} are not [start, stop) pairs with start < stop")
        for lo, hi in runs:
            if hi > math.prod(shapes[tensor]):
                refuse(f"{name}'s run [{lo}, {hi}) is past {tensor}'s "
                       f"{math.prod(shapes[tensor])} elements")
            claimed[tensor].append((lo, hi))
            count += hi - lo
        if hold["bytes"] != count * itemsize:
            refuse(f"{name}'s hold of {tensor} is {hold['bytes']!r} bytes, not the "
                   f"{count * itemsize} its runs make")
        offset += count * itemsize
    if offset != entry["bytes"]:
        refuse(f"{name}'s holds make {offset} bytes, not its {entry['bytes']}")
    path = os.path.join(directory, name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {directory!r} is incomplete: shard {name} is "
                                f"missing") from None
    if not stat.S_ISREG(mode):
        refuse(f"{name} is not a plain file inside the checkpoint (a symlink?): refused, "
               f"so that a checkpoint never reads a file outside itself")
