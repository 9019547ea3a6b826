"""ex14's reference: which ranks hold each element of a ZeRO-1, tp = 2 checkpoint, who
writes it (the lowest holder), what each file holds, and what each rank of the new
layout needs — built from minitp's own tensor-parallel plan and `FlatShard` (see ex14.py).
"""

from __future__ import annotations

import copy
import functools
import math
from collections import namedtuple

import torch

from ...data_parallel.zero_stage1 import FlatShard
from ...model import GPT, GPTConfig
from ...runtime.mesh import Axis
from ...sharding.tags import tag
from ...tensor_parallel.plan import apply_tensor_parallel

Param = namedtuple("Param", "name shape rule")
BYTES = 4  # float32 state
STATE = ("exp_avg", "exp_avg_sq")
CASES = (  # (label, config, old tp, old dp, new dp)
    ("a 1-layer GPT, tp 2, dp 2 -> tp 1, dp 4",
     GPTConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=2, d_model=8), 2, 2, 4),
    ("a 2-layer GPT, tp 2, dp 3 -> tp 1, dp 2",
     GPTConfig(vocab_size=48, seq_len=6, n_layer=2, n_head=2, d_model=12), 2, 3, 2),
)


def rank_file(r: int) -> str:
    return f"rank-{r}.bin"


class Layout:
    """One model's reference: its table, each tp rank's blocks, each file's elements."""

    def __init__(self, cfg: GPTConfig, tp: int, dp: int, new_dp: int):
        with torch.random.fork_rng(devices=[]):
            dense = GPT(cfg).to(torch.float64)
        self.first, start = {}, 0
        with torch.no_grad():
            for name, p in dense.named_parameters():
                self.first[name] = start
                p.copy_(torch.arange(start + 1, start + p.numel() + 1,
                                     dtype=torch.float64).view_as(p))
                start += p.numel()
        self.shapes = {n: tuple(p.shape) for n, p in dense.named_parameters()}
        self.blocks, rules = {}, {}  # (name, t) -> dense element numbers
        holders = {}  # (tensor, element) -> the global ranks that hold it
        for t in range(tp):
            model = copy.deepcopy(dense)
            apply_tensor_parallel(model, Axis("tp", tuple(range(tp)), t), False)
            params = list(model.parameters())
            for name, p in model.named_parameters():
                dim = tag(p, "tp_split_dim")
                rules[name] = ("vocab" if tag(p, "tp_true_size") is not None else
                               {0: "column", 1: "row", None: None}[dim])
                self.blocks[name, t] = self._elements(p)[1]
                for i in self.blocks[name, t].tolist():
                    holders.setdefault((f"model/{name}", i), set()).update(
                        d * tp + t for d in range(dp))
            for d in range(dp):
                shard = FlatShard(params, Axis("dp", tuple(range(dp)), d), mixed=False).shard
                for item in self._state(shard):
                    holders.setdefault(item, set()).add(d * tp + t)
        self.table = [Param(n, self.shapes[n], rules[n]) for n in self.shapes]
        self.tp, self.holders = tp, holders
        self.owner = {item: min(ranks) for item, ranks in holders.items()}
        self.files = {}
        for item, r in self.owner.items():
            self.files.setdefault(rank_file(r), set()).add(item)
        params = list(dense.parameters())
        self.needs = []  # per new dp rank: {(tensor, element)}
        for d in range(new_dp):
            shard = FlatShard(params, Axis("dp", tuple(range(new_dp)), d), mixed=False).shard
            model = {(f"model/{n}", i) for n, s in self.shapes.items()
                     for i in range(math.prod(s))}
            self.needs.append(model | self._state(shard))

    def _elements(self, values: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        """(tensor name, dense element) of each value of the numbered model; padding dropped."""
        ids = values.detach().flatten().round().long() - 1
        ids = ids[ids >= 0]
        names = list(self.first)
        starts = torch.tensor([self.first[n] for n in names])
        which = torch.searchsorted(starts, ids, right=True) - 1
        return [names[k] for k in which.tolist()], ids - starts[which]

    def _state(self, shard: torch.Tensor) -> set:
        names, elements = self._elements(shard)
        return {(f"{key}/{n}", int(i)) for key in STATE
                for n, i in zip(names, elements.tolist(), strict=True)}

    @property
    def size(self) -> int:
        return sum(len(items) for items in self.files.values())


@functools.cache
def _layout(case: int) -> Layout:
    _, cfg, tp, dp, new_dp = CASES[case]
    return Layout(cfg, tp, dp, new_dp)
