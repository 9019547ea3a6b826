"""Which elements of the dense model each of a rank's tensors holds, found by running
the model's own plan on numbers that name themselves.

A sharded checkpoint must say, for every element a rank holds, which element of the
plain GPT it is. The sharding rules live in one place (`mt.parallelize` and ZeRO), so
this module does not restate them: it builds a plain GPT whose every element holds its
own *id* (1 + its position in one flat space over all the model's tensors, in float64:
exact up to 2**53), parallelizes that with the run's plan, and reads the ids back out
of the shards. Whatever the plan did (tp's slices, the fused QKV's per-head cut, pp's
stages, ep's experts, ZeRO's flat padded shards: the padding holds 0, "no element"), the
ids say where each element came from.

The flat space (`Space`): the model's parameters, then its experts' biases (a buffer the
plain GPT saves), then Adam's exp_avg and exp_avg_sq over the parameters. A file holds
runs of ids; a rank that loads asks for the ids its own shards hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..data_parallel import zero
from ..model import GPT, GPTConfig
from ..parallelize import parallelize

ADAM_STATE = ("exp_avg", "exp_avg_sq")


def _state_names(cfg: GPTConfig) -> tuple[list[tuple[str, tuple]], list[tuple[str, tuple]]]:
    """(parameters, expert-bias buffers) of the plain GPT: names and shapes, no memory."""
    with torch.device("meta"):
        model = GPT(cfg)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    buffers = [(n, tuple(b.shape)) for n, b in model.named_buffers()
               if n.endswith("router.expert_bias")]
    return params, buffers


@dataclass(frozen=True)
class Space:
    """One flat id space over every tensor a checkpoint holds: `tensors` lists
    (name, shape, first id) in order; ids run from 0 to `size` - 1."""

    tensors: tuple[tuple[str, tuple, int], ...]
    n_params: int  # elements of the parameters (the first family)
    n_model: int   # parameters + expert biases

    @classmethod
    def of(cls, cfg: GPTConfig) -> Space:
        params, buffers = _state_names(cfg)
        tensors, start = [], 0
        for prefix, family in (("model/", params + buffers), *((f"{k}/", params)
                                                                for k in ADAM_STATE)):
            for name, shape in family:
                tensors.append((prefix + name, shape, start))
                start += math.prod(shape)
        n_params = sum(math.prod(s) for _, s in params)
        return cls(tuple(tensors), n_params, n_params + sum(math.prod(s) for _, s in buffers))

    @property
    def size(self) -> int:
        return self.n_model + 2 * self.n_params

    def runs_by_tensor(self, ids: torch.Tensor) -> list[dict]:
        """Sorted unique `ids` as [{"tensor", "shape", "runs": [[start, stop], ...]}],
        each run a range of one tensor's flat elements (its slice)."""
        out = []
        bounds = [(name, shape, first, first + math.prod(shape))
                  for name, shape, first in self.tensors]
        for start, stop in contiguous_runs(ids):
            for name, shape, first, end in bounds:
                lo, hi = max(start, first), min(stop, end)
                if lo >= hi:
                    continue
                if not out or out[-1]["tensor"] != name:
                    out.append({"tensor": name, "shape": list(shape), "runs": []})
                out[-1]["runs"].append([lo - first, hi - first])
        return out


def contiguous_runs(ids: torch.Tensor) -> list[tuple[int, int]]:
    """Sorted unique ids as half-open ranges [start, stop)."""
    if ids.numel() == 0:
        return []
    breaks = torch.nonzero(ids[1:] != ids[:-1] + 1).flatten() + 1
    starts = torch.cat([ids[:1], ids[breaks]]).tolist()
    stops = torch.cat([ids[breaks - 1] + 1, ids[-1:] + 1]).tolist()
    return list(zip(starts, stops, strict=True))


def _id_model(cfg: GPTConfig, space: Space) -> GPT:
    """The plain GPT in float64 whose every element holds 1 + its id in `space`."""
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg).to(torch.float64)
    first = {name.removeprefix("model/"): start for name, _, start in space.tensors
             if name.startswith("model/")}
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in first:
                t.copy_(torch.arange(t.numel(), dtype=torch.float64).view(t.shape)
                        + first[name] + 1)
    return model


def _ids(t: torch.Tensor) -> torch.Tensor:
    """Ids held by a tensor of the id model, flat (-1: padding)."""
    return t.detach().flatten().cpu().round().long() - 1


def local_ids(cfg: GPTConfig, mesh, plan: dict, space: Space) -> tuple[list, list]:
    """(model ids, optimizer ids) of this rank under `plan` (`mt.parallelize`'s keywords):
    model ids: one flat id tensor for each of `local_tensors`' model tensors, in order;
    optimizer ids: one for each tensor the optimizer steps (ids of the parameters:
    add the Adam family's first id to place its state)."""
    plan = {k: v for k, v in plan.items() if k != "param_dtype"}
    from ..runtime import _device

    model = parallelize(_id_model(cfg, space).to(_device.device()), mesh, **plan)
    placeholder = zero.make_optimizer(model, mesh, lambda ts: torch.optim.SGD(ts, lr=0.0))
    tensors, _ = _model_tensors(model)
    return ([_ids(t) for t in tensors],
            [_ids(t) for t in zero.stepped_tensors(placeholder)])


def _model_tensors(model) -> tuple[list[torch.Tensor], list[str]]:
    """A parallel model's tensors that hold state: its parameters (at ZeRO-3: the shards)
    and its experts' biases, in a fixed order, with their local names."""
    named = [*model.named_parameters(), *[(n, b) for n, b in model.named_buffers()
                                          if n.endswith("router.expert_bias")]]
    return [t for _, t in named], [n for n, _ in named]


def local_tensors(model, optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(model tensors, stepped tensors) of a real parallel model, in `local_ids`' order."""
    return _model_tensors(model)[0], zero.stepped_tensors(optimizer)
