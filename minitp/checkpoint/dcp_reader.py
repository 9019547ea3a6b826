"""torch.distributed.checkpoint (DCP) reads minitp's sharded checkpoints: a `StorageReader`
over the manifest, so that a DCP user loads one without minitp's loaders::

    sd = mt.GPT(cfg).double().state_dict()
    torch.distributed.checkpoint.load(sd, storage_reader=mt.checkpoint.DCPReader(step_dir))

What DCP sees: each of the manifest's tensors as one whole chunk (offsets 0, its dense
shape), the model's under its plain GPT name (``wte.weight``, ...), Adam's moments under
``exp_avg/<name>`` and ``exp_avg_sq/<name>``. minitp's files hold flat runs of elements,
not DCP's rectangular chunks, so the chunk is virtual: for each read item (a box of one
tensor: DCP's storage offsets and lengths) the reader computes the flat ids of the box's
elements and reads only those bytes (`sharded_read.Reader`, ``os.pread``), whatever file
each lies in. A state dict may ask for any subset of the keys (DCP refuses keys the
checkpoint lacks).

Tested: a dense state dict in one process (no process group), values equal bit for bit
(tests/export/test_dcp_reader.py). Multi-rank DCP loads (DTensor or ShardedTensor state
dicts, each rank asking for its own boxes) go through the same read path but are untested.
"""

from __future__ import annotations

import os

import torch
from torch.distributed.checkpoint import (
    LoadPlan,
    LoadPlanner,
    Metadata,
    StorageReader,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from .sharded_read import Reader, is_sharded, read_manifest


def dcp_name(manifest_name: str) -> str:
    """A manifest tensor's key in DCP's state dict: the model's without ``model/``."""
    return manifest_name.removeprefix("model/")


class DCPReader(StorageReader):
    """Reads the sharded checkpoint in `directory` (a ``step-<n>`` directory holding a
    manifest.json) for `torch.distributed.checkpoint.load`."""

    def __init__(self, directory: str | os.PathLike):
        super().__init__()
        self.reset(directory)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is None:
            return
        directory = os.fspath(checkpoint_id)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"DCPReader: {directory!r}: no such checkpoint directory")
        if not is_sharded(directory):
            raise ValueError(f"DCPReader: {directory!r} is not a sharded minitp checkpoint (no "
                             "manifest.json): give a step-<n> directory, or read a dense "
                             "one with mt.checkpoint.load_dense")
        self.directory = directory
        self.manifest = read_manifest(directory)  # sealed, every field checked, files whole
        self.reader = Reader(directory, self.manifest)
        self.first, self.shapes, start = {}, {}, 0
        for name, shape in self.manifest["tensors"]:
            self.first[dcp_name(name)] = start
            self.shapes[dcp_name(name)] = torch.Size(shape)
            start += self.shapes[dcp_name(name)].numel()

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    def read_metadata(self) -> Metadata:
        dtype = getattr(torch, self.manifest["dtype"])
        return Metadata(state_dict_metadata={
            name: TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype), size=shape,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)),
                                             sizes=shape)])
            for name, shape in self.shapes.items()})

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool) -> None:
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:  # (the metadata lists tensors only)
                raise ValueError(f"DCPReader: {item.storage_index.fqn!r} is not a tensor")
            name = item.storage_index.fqn
            box = torch.arange(self.shapes[name].numel()).view(self.shapes[name])
            for dim, (at, length) in enumerate(zip(item.storage_offsets, item.lengths,
                                                   strict=True)):
                box = box.narrow(dim, at, length)
            # a box's flat ids in row-major order are sorted and unique, as `read` needs
            values = self.reader.read(box.flatten() + self.first[name])
            target = planner.resolve_tensor(item).detach()
            target.copy_(values.view(box.shape))
            planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return is_sharded(os.fspath(checkpoint_id))
