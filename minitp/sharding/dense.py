"""Dense state from shards: the one place that reads the parameter tags to rebuild
the plain model's tensors.

A rank's parameter is tagged (`minitp.sharding.tags`) with the dimension it is split
along over the tensor-parallel axis and, for the padded vocabulary, the true
size. Gathering along that dimension and dropping the padding gives the plain
GPT's tensor; an untagged parameter is replicated and taken as it is. Names are
mapped back to the plain GPT's: wrappers (`Recomputed`, a pipeline stage's
`Skipped`) hold their module as ``module``, and a stage numbers its blocks from 0.
"""

from __future__ import annotations

import re

import torch

from ..runtime import comm, trace
from ..runtime.mesh import Axis
from .tags import tag


def dense_name(name: str, layer_offset: int = 0) -> str:
    """The plain GPT's name for a shard's parameter `name`."""
    name = re.sub(r"(^|\.)module(?=\.)", "", name).lstrip(".")
    # a pipeline stage numbers its blocks from 0; the plain GPT from the stage's first layer
    return re.sub(r"^blocks\.(\d+)", lambda m: f"blocks.{int(m[1]) + layer_offset}", name)


def gather_dense(named_tensors, tp: Axis, layer_offset: int = 0,
                 ep: Axis | None = None, etp: Axis | None = None) -> dict[str, torch.Tensor]:
    """{plain name: dense tensor} from (shard name, parameter, tensor) triples,
    gathered over `tp` where the parameter is split, over `etp` where it is a slice of
    each expert's hidden width, and over `ep` where it is a run of experts (on every rank;
    untraced: bookkeeping, not training). A None tensor (no gradient) stays None."""
    dense = {}
    with trace.paused():
        for name, param, value in named_tensors:
            etp_dim = tag(param, "etp_split_dim")
            if value is not None and etp_dim is not None and etp is not None:
                value = comm.all_gather(value, etp, dim=etp_dim)
            ep_dim = tag(param, "ep_split_dim")
            if value is not None and ep_dim is not None and ep is not None:
                value = comm.all_gather(value, ep, dim=ep_dim)
            dim = tag(param, "tp_split_dim")
            if value is not None and dim is not None:
                value = comm.all_gather(value, tp, dim=dim)
                true_size = tag(param, "tp_true_size")
                if true_size is not None:
                    value = value.narrow(dim, 0, true_size)  # drop vocabulary padding
            dense[dense_name(name, layer_offset)] = value
    return dense
