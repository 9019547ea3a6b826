"""A checkpoint on disk: written atomically (a hidden sibling, fsynced, swapped in by
rename; the previous one moved aside first and removed last), read only once every
file is there, whole, unchanged and holding nothing but tensors, and what a killed
save left beside it removed. The format and the resharding: `minitp.checkpoint`.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pickle
import re
import secrets
import shutil
import stat

import torch

from ..runtime._processes import alive
from .manifest import DTYPES, config_problem

FORMAT = "minitp-checkpoint-2"  # 2: meta.json carries a manifest; saved atomically
_READABLE_FORMATS = ("minitp-checkpoint-1", FORMAT)
STEP_DIR = re.compile(r"^step-(\d+)$")  # a sharded save's step (`sharded`)
_DENSE_FILES = {"model.pt", "optimizer.pt"}
_META_KEYS = {"format", "config", "step", "dtype", "topology", "has_optimizer", "extra", "files"}


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
    if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write into {directory!r} (no write permission)")


def step_names(directory: str) -> list[str]:
    """The ``step-<n>`` entries in `directory`: a sharded save's steps."""
    return sorted(n for n in os.listdir(directory) if STEP_DIR.match(n)) if os.path.isdir(
        directory) else []


def _check_finite(directory: str, tree) -> None:
    """Refuse to replace a checkpoint with non-finite numbers (a diverged run's)."""
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        for t in tree:
            _check_finite(directory, t)
    elif isinstance(tree, torch.Tensor) and tree.is_floating_point() and not bool(
            torch.isfinite(tree).all()):
        raise ValueError(f"checkpoint {directory!r}: the state holds non-finite values (the "
                         f"run diverged?); not saved, what was there is kept")


def write_checkpoint(directory: str, weights: dict, optim: dict | None, meta: dict) -> None:
    """Write the files into a hidden sibling, then swap it in (see the module's docstring)."""
    check_save_target(directory)
    _check_finite(directory, [weights, optim or {}])
    if step_names(directory):  # the swap below would remove the whole directory
        raise ValueError(f"--save {directory!r} holds sharded steps ({step_names(directory)[-1]}"
                         f", ...): a dense save replaces the whole directory; save elsewhere")
    path = os.path.abspath(directory)
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    _recover(path)
    _remove_leftovers(path)
    staging = _make_staging(parent, f".{base}.partial-{os.getpid()}-")
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


def _make_staging(parent: str, prefix: str) -> str:
    """A new hidden directory `prefix` + random letters under `parent`, with the mode the
    umask gives (0755 under 022, like any directory the user makes), not mkdtemp's 0700:
    renamed into place it is the checkpoint, and a classmate must be able to read it."""
    while True:
        path = os.path.join(parent, prefix + secrets.token_hex(4))
        try:
            os.mkdir(path)  # 0o777 & ~umask; fails rather than reuse a name
        except FileExistsError:
            continue
        return path


def _write(path: str, write) -> None:
    # O_NOFOLLOW: a symlink planted at `path` is refused, never written through
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
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
        pid = candidate.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and alive(int(pid)):
            return  # a live save between its two renames: it puts its own back
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
    why = config_problem(meta["config"])
    step = meta["step"]
    if why is None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        why = f"step is {step!r}, not a whole number of steps >= 0"
    if why is None and meta["dtype"] not in DTYPES:
        why = f"dtype is {meta['dtype']!r}; minitp writes one of {DTYPES}"
    if why is None and not isinstance(meta["has_optimizer"], bool):
        why = f"has_optimizer is {meta['has_optimizer']!r}, not true or false"
    listed = meta.get("files", {})
    if why is None and (not isinstance(listed, dict) or set(listed) - _DENSE_FILES
                        or not all(isinstance(e, dict) for e in listed.values())):
        why = (f"files must name only {sorted(_DENSE_FILES)}, each with its bytes and sha256 "
               "(nothing outside the checkpoint is read)")
    for name in listed if why is None else ():
        file = os.path.join(os.path.dirname(path), name)
        if os.path.lexists(file) and not stat.S_ISREG(os.lstat(file).st_mode):
            why = f"{name} is not a plain file inside the checkpoint (a symlink?)"
    if why is not None:
        raise ValueError(f"{path}: {why}")


def _listed_files(meta: dict) -> dict:
    if "files" in meta:
        return meta["files"]
    return {"model.pt": None} | ({"optimizer.pt": None} if meta["has_optimizer"] else {})
