"""Periodic sharded checkpoints: every rank writes its own shard, synchronously or
beside the next steps, into ``DIR/step-<n>/``, sealed by a manifest.

Who writes what: each element of the model and of Adam's state is written once, by
the lowest global rank that holds it (`layout`: the ids of what each rank holds; one
all-reduce(min) of a table of holders at the start picks the owners). Replicas over
dp and cp therefore write nothing twice: without ZeRO the dp-rank-0 replica writes the
model and Adam's state; at ZeRO-1/2/3 every dp rank writes its own 1/dp of Adam's state
(and at ZeRO-3 of the parameters); tp and pp ranks each write their slice, ep ranks their
experts. A rank's file ``rank-<r>.bin`` is its owned elements, raw, in id order.

The write is atomic, as `files`' dense checkpoint is: the ranks write into
``DIR/.step-<n>.partial/``; each seals its own file with a small ``rank-<r>.done``
(its size, SHA-256 and RNG state), written by rename; global rank 0 waits for every
seal, writes ``manifest.json`` (what each file holds: tensor, global shape, the runs of
its flat elements = the slice, byte offset, dtype; each file's size and SHA-256) and
``manifest.sha256`` (the manifest's own hash: `manifest`), fsyncs, and renames the
directory to ``step-<n>``. Then it removes all but the newest `keep`. A step directory
without its manifest is never used (`sharded_read`). Global rank 0 holds the directory's
writer lock from construction to `close()` (`writer_lock`): one run writes there at a time.
A snapshot holding a non-finite value is refused, so a diverged run never rotates good
steps out; a full disk ends the save in one line, its partial step removed.

Asynchronous (`asynchronous=True`): the step blocks only for the snapshot (a gather of
the owned elements into new host memory: a copy to the host on a GPU, a clone on a
CPU); a thread writes it while the next steps run. One save at a time: the next
snapshot waits for the previous write to end. Both land on the trace (`mt.launch`'s
timeline): "checkpoint: snapshot" on the step's thread, "checkpoint: write" on the
writer's, each a compute event with op "compute" and those labels. The writer's thread
runs no collective: ranks agree through the files alone, so it never races the step's
collectives on the same process group.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import asdict

import torch

from ..data_parallel import zero
from ..runtime import _device, comm, trace
from ..runtime.mesh import world
from . import writer_lock
from .files import STEP_DIR, _fsync_directory, _write
from .layout import ADAM_STATE, Space, local_ids, local_tensors
from .manifest import MANIFEST, SEAL, digest

SHARDED_FORMAT = "minitp-sharded-2"  # 2: manifest.sha256 seals the manifest


def step_dirs(directory: str) -> list[tuple[int, str]]:
    """(step, path) of every ``step-<n>`` directory under `directory`, oldest first."""
    found = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        m = STEP_DIR.match(name)
        if m and os.path.isdir(os.path.join(directory, name)):
            found.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(found)


def remove_partials(directory: str, writer: bool = False) -> None:
    """Remove what killed saves left: ``.step-<n>.partial``, ``.step-<n>.previous`` and a
    ``step-<n>`` without its manifest. Only when no run is writing there (`writer_lock`),
    unless the caller is that writer: a live save's files are never removed. A symlink
    planted in their place is unlinked, never followed."""
    with contextlib.nullcontext(True) if writer else writer_lock.no_writer(directory) as free:
        if not free:
            return
        pattern = os.path.join(glob.escape(directory), ".step-*.")
        unsealed = [p for _, p in step_dirs(directory)
                    if not os.path.isfile(os.path.join(p, MANIFEST))]
        for stale in glob.glob(pattern + "partial") + glob.glob(pattern + "previous") + unsealed:
            if os.path.islink(stale) or not os.path.isdir(stale):
                with contextlib.suppress(FileNotFoundError):  # (another rank's clean-up)
                    os.unlink(stale)
            else:
                shutil.rmtree(stale, ignore_errors=True)


class Saver:
    """Saves one run's sharded checkpoints. Construct it on every rank (collective: the
    owners are agreed once), then call `save(step)` on every rank; `close()` waits for an
    asynchronous write still running. plan: `mt.parallelize`'s keywords the model was
    built with. extra: JSON-able facts for the manifest (the run's seed, say)."""

    def __init__(self, model, optimizer, mesh, directory: str, plan: dict, keep: int = 2,
                 asynchronous: bool = False, extra: dict | None = None, timeout: float = 300.0):
        if getattr(getattr(optimizer, "inner", optimizer), "is_muon", False):
            raise TypeError("checkpoint: sharded saves of Muon's state are not written yet "
                            "(a dense checkpoint.save is)")
        self.model, self.optimizer, self.mesh = model, optimizer, mesh
        self.directory = os.path.abspath(directory)
        self.keep, self.asynchronous = keep, asynchronous
        self.extra, self.timeout, self.rank = extra or {}, timeout, mesh.rank
        self.cfg = model.cfg
        self.space = Space.of(self.cfg)
        self._lock = None  # rank 0 holds the directory's writer lock (`writer_lock`)
        if self.rank == 0:
            os.makedirs(self.directory, exist_ok=True)
            self._lock = writer_lock.acquire(self.directory)
            remove_partials(self.directory, writer=True)
        with trace.paused():
            model_ids, step_ids = local_ids(self.cfg, mesh, plan, self.space)
            n = mesh.world_size
            held = torch.full((self.space.size,), n, dtype=torch.int32)
            for ids in model_ids:
                held[ids[ids >= 0]] = self.rank
            for family in range(len(ADAM_STATE)):
                for ids in step_ids:
                    held[self._adam_ids(ids[ids >= 0], family)] = self.rank
            owner = comm.all_reduce(held.to(_device.device()), world(), op="min").cpu()
            # (a barrier too: the partials are gone before anyone writes)
        self.mine = torch.nonzero(owner == self.rank).flatten()
        # where each source's owned elements go in this rank's file: (which, local, slot)
        self.copies = []
        for which, ids_list in (("model", model_ids), *((k, step_ids) for k in ADAM_STATE)):
            family = ADAM_STATE.index(which) if which != "model" else None
            for index, ids in enumerate(ids_list):
                local = torch.nonzero(ids >= 0).flatten()
                flat = ids[local] if family is None else self._adam_ids(ids[local], family)
                mine = owner[flat] == self.rank
                self.copies.append((which, index, local[mine],
                                    torch.searchsorted(self.mine, flat[mine])))
        self.layout = None
        if self.rank == 0:
            self.layout = {r: self.space.runs_by_tensor(torch.nonzero(owner == r).flatten())
                           for r in range(n)}
        self.plan_text = {"dp": mesh.dp_size, "pp": mesh.pp_size, "cp": mesh.cp_size,
                          "tp": mesh.tp_size, "ep": mesh.ep_size,
                          "zero_stage": zero.zero_stage_of(model)}
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _adam_ids(self, ids: torch.Tensor, family: int) -> torch.Tensor:
        return ids + self.space.n_model + family * self.space.n_params

    # ----------------------------------------------------------------- the snapshot
    def snapshot(self) -> tuple[torch.Tensor, dict]:
        """This rank's owned elements, copied into new host memory, and Adam's step."""
        models, stepped = local_tensors(self.model, self.optimizer)
        states = [self.optimizer.state.get(t, {}) for t in stepped]
        if not all(all(k in s for k in ADAM_STATE) for s in states):
            raise ValueError("a sharded checkpoint needs Adam's state: save after a step")
        out = torch.empty(self.mine.numel(), dtype=models[0].dtype)
        for which, index, local, slot in self.copies:
            source = models[index] if which == "model" else states[index][which]
            out[slot] = source.detach().flatten()[local.to(source.device)].cpu().to(out.dtype)
        adam_step = states[0]["step"]
        return out, {"value": float(adam_step),
                     "dtype": str(adam_step.dtype).removeprefix("torch.")}

    def save(self, step: int) -> None:
        """Save step `step` (the number of steps taken: the next batch is step's)."""
        self.wait()
        with trace.region("checkpoint: snapshot"):
            values, adam_step = self.snapshot()
        if not bool(torch.isfinite(values).all()):  # never rotate good steps out with these
            raise ValueError(f"checkpoint step {step}: rank {self.rank} holds non-finite "
                             f"values (the run diverged?); not saved, the steps saved "
                             f"before are kept")
        rng = torch.get_rng_state().numpy().tobytes().hex()
        traced = trace.recorder().enabled  # the write is drawn if the save is
        if not self.asynchronous:
            self._write(step, values, adam_step, rng, traced)
            return
        self._thread = threading.Thread(target=self._write_catching,
                                        args=(step, values, adam_step, rng, traced), daemon=True,
                                        name=f"checkpoint-step-{step}")
        self._thread.start()

    def wait(self) -> None:
        """Wait for the asynchronous write in flight (if any); raise what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """Wait for the write in flight, then let another run write here."""
        try:
            self.wait()
        finally:
            if self._lock is not None:
                writer_lock.release(self._lock)
                self._lock = None

    def _write_catching(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as exc:  # re-raised on the step's thread by wait()
            self._error = exc

    # ----------------------------------------------------------------- the write
    def _write(self, step: int, values: torch.Tensor, adam_step: dict, rng: str,
               traced: bool) -> None:
        rec = trace.recorder()
        start = rec.now()
        staging = os.path.join(self.directory, f".step-{step}.partial")
        try:
            os.makedirs(staging, exist_ok=True)
            if os.path.islink(staging):  # planted: writing through it writes elsewhere
                raise FileExistsError(f"{staging!r} is a symlink; minitp writes only into "
                                      f"a directory of its own")
            name = f"rank-{self.rank}.bin"
            data = memoryview(values.numpy()).cast("B")  # the snapshot's bytes, not a copy
            _write(os.path.join(staging, name), lambda f: f.write(data))
            seal = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "rng": rng}
            done = os.path.join(staging, f"rank-{self.rank}.done")
            _write(done + ".tmp", lambda f: f.write(json.dumps(seal).encode()))
            os.rename(done + ".tmp", done)
            if self.rank == 0:
                self._seal(step, staging, values.dtype, adam_step)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if self.rank == 0:  # its half-written step: the space back, the old steps kept
                shutil.rmtree(staging, ignore_errors=True)
            raise OSError(exc.errno, f"checkpoint step {step}: the disk under "
                                     f"{self.directory!r} is full (rank {self.rank}); this "
                                     f"step is not saved, the steps saved before are "
                                     f"kept") from None
        if traced:  # appended whatever the step's thread has paused meanwhile
            rec.events.append(trace.Event(
                rank=rec.rank, op="compute", axis="", shape=(), dtype="",
                nbytes=values.numel() * values.element_size(), model_bytes=0, start=start,
                end=rec.now(), label="checkpoint: write"))

    def _seal(self, step: int, staging: str, dtype, adam_step: dict) -> None:
        n = self.mesh.world_size
        seals = {}
        deadline = time.monotonic() + self.timeout
        while len(seals) < n:
            for r in range(n):
                done = os.path.join(staging, f"rank-{r}.done")
                if r not in seals and os.path.isfile(done):
                    with open(done) as f:
                        seals[r] = json.load(f)
            if len(seals) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"checkpoint step {step}: ranks "
                                       f"{sorted(set(range(n)) - set(seals))} never sealed")
                time.sleep(0.005)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        files = {}
        for r in range(n):
            holds, offset = [], 0
            for entry in self.layout[r]:
                count = sum(b - a for a, b in entry["runs"])
                holds.append(entry | {"offset": offset, "bytes": count * itemsize})
                offset += count * itemsize
            files[f"rank-{r}.bin"] = {"rank": r, "bytes": seals[r]["bytes"],
                                      "sha256": seals[r]["sha256"], "rng": seals[r]["rng"],
                                      "holds": holds}
        manifest = {"format": SHARDED_FORMAT, "config": asdict(self.cfg), "step": int(step),
                    "dtype": str(dtype).removeprefix("torch."), "topology": self.plan_text,
                    "adam_step": adam_step, "extra": self.extra,
                    "tensors": [[name, list(shape)] for name, shape, _ in self.space.tensors],
                    "files": files}
        text = json.dumps(manifest, indent=1).encode()
        _write(os.path.join(staging, MANIFEST), lambda f: f.write(text))
        _write(os.path.join(staging, SEAL), lambda f: f.write(digest(text).encode()))
        for r in range(n):
            os.remove(os.path.join(staging, f"rank-{r}.done"))
        _fsync_directory(staging)
        final = os.path.join(self.directory, f"step-{step}")
        if os.path.exists(final):  # the same step saved again (a rerun into one DIR)
            aside = os.path.join(self.directory, f".step-{step}.previous")
            os.rename(final, aside)
            os.rename(staging, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(staging, final)
        _fsync_directory(self.directory)
        self._prune(step)

    def _prune(self, step: int) -> None:
        """Keep the newest `keep` complete steps up to `step`."""
        complete = [(s, p) for s, p in step_dirs(self.directory)
                    if s <= step and os.path.isfile(os.path.join(p, MANIFEST))]
        for _, path in complete[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
