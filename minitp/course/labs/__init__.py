"""The course's laboratories: experiments that launch runs and compare what they
measure with the papers' formulas.

A lab sits above the library: it uses `minitp` (launch, parallelize, the trace,
the memory ledger, the calculator) the way a student's notebook would, and
nothing in the library imports it. Each lab is one module:

* `activations`: activation bytes per layer, measured by the ledger, beside
  Korthikanti et al. 2022, Table 2, with every byte of the gap named (lessons
  05 and 07);
* `pipedream`: PipeDream's asynchronous 1F1B with weight stashing beside
  PipeDream-Flush, on real processes: stashed versions counted, loss curves
  (lesson 11);
* `zero_bubble`: 1F1B, ZB-H1 and ZB-H2 on real ranks with unit costs set by sleep
  (bubbles, the step's gradient-norm all-reduce, each stage's bytes held: the ledger's
  activations and the W passes' stored (x, g)), float64 runs beside one device, and each
  rank's squared gradients for the global norm (lesson 12);
* `uneven_pipeline`: two stages of unequal cost (a layout, the costs set by sleep in
  proportion to each stage's modelled FLOPs): the step and the bubble measured, and one
  float64 step beside one device (lesson 11);
* `load_free`: a rank's clock that a wait for a core does not move (its CPU time plus
  the sleep its units asked for), and the step replayed on those clocks, so a shared
  machine's waits do not read as bubble (lesson 12);
* `planning`: the planner's model of a machine against the machine: its
  constants profiled on real ranks, its step times measured (lesson 17);
* `scaling`: Megatron-LM's weak-scaling family, shrunk, timed on real processes
  and split into compute and communication from the trace (lesson 16);
* `explorer`: memory per GPU and step time of runs too large to launch, from
  `minitp.calc`, with an ipywidgets front end (lesson 17);
* `megatron_or_zero`: one GPT with tensor parallelism and with ZeRO 0-3 on the
  same ranks, measured side by side, and ZeRO-3's parameter bytes through a
  step (lesson 21);
* `muon`: Muon's three strategies (gather, owner, tp) under ZeRO-1 on real ranks beside
  one device, their bytes, FLOPs and state, and when owner beats gather, a model (lesson 22);
* `moe`: a mixture of experts trained on one device with each way of balancing its
  load (loads and routing step by step), one step of expert parallelism traced on 4
  ranks (all-to-all rows and bytes, each rank's expert compute, a forced straggler),
  and the mesh against one device in float64 (lesson 26);
* `latent`: latent attention's cache and absorbed decode measured, its tp traps and serving
  cache on 2 ranks, and the expert rows today's layout and folding compute (lesson 27);
* `blocks_of_scales`: MXFP8 and NVFP4 across ranks: block scales against one a tensor, the
  casts on 2 ranks with and without an amax all-reduce, ZeRO-3's 8-bit gather with a
  boundary inside a block and block-atomic, its bytes from the trace (lesson 24);
* `long_sequences`: what sequence parallelism leaves whole, activation memory
  against sequence length with and without context parallelism, the ring's
  trace, and the causal work per rank with and without load balancing (lesson 08);
* `step_timing`: training steps of several models timed in turn on every rank
  (lesson 07 and `bench/gpu_figures.py`);
* `gpu_figures`: the figures `bench/gpu_figures.py` recorded on a GPU, read back
  for lessons 01, 07 and 16 (or a plain statement that none was recorded).

The labs are imported on first use (``minitp.course.labs.scaling``), not with the
package: the explorer pulls in ipywidgets, which ranks never need.
"""

from __future__ import annotations

import importlib

LABS = ("activations", "explorer", "gpu_figures", "long_sequences", "megatron_or_zero", "moe",
        "pipedream", "planning", "scaling", "step_timing", "uneven_pipeline", "zero_bubble")

__all__ = list(LABS)


def __getattr__(name):
    if name in LABS:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
