"""Checks for ex21: one ZeRO-3 unit — the gathered parameters freed after the forward,
refilled in place just before the backward, freed again after it.

At dp = 2 and 3, in float64: every rank wraps each of two small MLP blocks (Ψ_u
= 235 values: 236 after padding at dp = 2, 237 at dp = 3) in the learner's
`Zero3Unit`, and runs two steps on its slice of a batch: forward through both
units, backward of a weighted sum, one SGD step on the shards. The plain blocks
run beside it on the whole batch with autograd (the loss is a sum, so the ranks'
gradients add up to the plain one). Per world size:

* the numbers: the output, the input's gradient and each shard's gradient (this
  rank's slice of the summed gradient) equal the plain blocks', at both steps.
  A backward that fails is named by what autograd found: a saved view whose
  storage holds 0 bytes (nothing refilled it in time, or the refill went into
  another storage), or one written since it was saved (a refill autograd
  counted). A right output with wrong gradients: backward read other values;
* after each unit's forward: the storage of every tensor of at least Ψ_u values
  made during the forward (the gathered vector, which autograd's saved views
  keep alive) holds 0 bytes;
* during backward, at each unit's reduce-scatter, no other unit's gathered
  storage holds a byte (a later unit's: not freed after its backward; an
  earlier unit's: refilled too soon); after backward, none, nor any buffer an
  all-gather filled in backward;
* the trace, per unit and step: one all-gather in the forward, one in backward
  (the refill), one reduce-scatter, each of the whole padded vector;
* gradient accumulation, on fresh units: two micro-batches, both forwards first, then
  both backwards (the first micro-batch's first), then the step. Each backward must
  refill the vector its own forward gathered (the unit has two gathered-and-freed
  vectors at once), and the shards' gradients must be the sum of both backwards'
  (the plain blocks' accumulated ones); afterwards no gathered storage holds a byte.
  Named: a backward that reads a freed vector (the refill went to the unit's latest
  vector, not this forward's), a gradient that is one micro-batch's alone (overwritten,
  not accumulated).

The run on the ranks is ex21_rank.py (with ex21_watch.py, what it sees of memory),
the five judgements ex21_checks.py; this module runs them.
"""

from __future__ import annotations

from ...runtime.launch import launch
from .base import Check, run_per_size
from .ex21_checks import (
    _accumulation,
    _after_forward,
    _collectives,
    _crash,
    _in_backward,
    _numbers,
)
from .ex21_rank import _in_rank

WORLD_SIZES = (2, 3)


def run(module) -> list[Check]:
    def launch_at(n):
        return launch(_in_rank, n, module.Zero3Unit, timeout=20.0)

    return run_per_size(WORLD_SIZES, _names, launch_at, _judge, what="Zero3Unit", size="dp")


def _names(n) -> list[str]:
    return [f"dp={n}: output, input gradient and shard gradients equal the plain blocks'",
            f"dp={n}: after each unit's forward, the gathered storage holds 0 bytes",
            f"dp={n}: in backward only the unit being differentiated is gathered; after, none",
            f"dp={n}: per unit: an all-gather in forward, one in backward, a reduce-scatter",
            f"dp={n}: two micro-batches' backwards before a step: the shard gradients "
            "accumulate to the plain blocks'"]


def _judge(n, names, per_rank) -> list[Check]:
    crashed = _crash(names[0], per_rank)
    if crashed:
        skipped = "not checked: backward failed (see above)"
        return [crashed, _after_forward(names[1], per_rank),
                Check(names[2], False, skipped), Check(names[3], False, skipped),
                _accumulation(names[4], per_rank)]
    return [_numbers(names[0], per_rank), _after_forward(names[1], per_rank),
            _in_backward(names[2], per_rank), _collectives(names[3], per_rank),
            _accumulation(names[4], per_rank)]
