"""An uneven model's pipeline, the even layout beside `mt.calc.pipeline_layout`'s choice.

The model is head-heavy (a 4096-token vocabulary on a 64-wide model: the head's 6Vh FLOPs
per token are about 4.6 layers'), so the even split's last stage, which holds the head, is
the slowest. Each layout trains the same steps on real ranks (1F1B); what is MEASURED per
stage is its main thread's CPU time per step (`time.thread_time`), which other processes on
a busy machine do not stretch; the step's time with the waits such a machine causes taken
out (lesson 12's replay: `minitp.course.labs.load_free`); and the wall time (which they
stretch). The balancer's numbers beside them are its MODEL (training FLOPs per token,
torchtitan's count).

    python bench/pipeline_layout.py            # pp 2, 6 layers
    python bench/pipeline_layout.py --pp 3 --n-layer 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import minitp as mt
from minitp.calc.planning.pipeline_layout import end_flops, layer_flops
from minitp.course.labs import load_free
from minitp.rules import parse_unit_label
from minitp.rules.layouts import even_layout, layout_stages, layout_text


def timed_steps(cfg, layout, steps, batch, microbatches):
    """On every rank: `steps` 1F1B steps after one warm-up; per step, this rank's CPU seconds
    and wall seconds, and its trace with `load_free`'s clock readings (for `replay`)."""
    torch.set_num_threads(1)  # compute on the main thread, the one its CPU clock reads
    mesh = mt.Mesh(pp=mt.world().size)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg), mesh, pipeline_layout=layout)
    optimizer = mt.make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
    tokens = torch.randint(0, cfg.vocab_size, (steps + 1, batch, cfg.seq_len + 1),
                           generator=torch.Generator().manual_seed(1))
    out = []
    for step in range(steps + 1):
        x, y = tokens[step, :, :-1], tokens[step, :, 1:]
        mt.trace.clear()
        clock = load_free.RankClock()
        c, w = time.thread_time(), time.perf_counter()
        with load_free.sampled(clock) as readings:
            mt.train_step(model, (x, y), mesh, optimizer, microbatches=microbatches)
        if step:  # the first builds what later steps reuse
            out.append((time.thread_time() - c, time.perf_counter() - w, mt.trace.events(),
                        dict(readings)))
    return out


def replayed_seconds(run, pp: int) -> list[float]:
    """Each step's span from its first unit's start to its last unit's end, the waits a busy
    machine caused taken out (`minitp.course.labs.load_free.replay`)."""
    spans = []
    for step in range(len(run[0])):
        events = [e for rank in run for e in rank[step][2]]
        moved = load_free.replay(events, [rank[step][3] for rank in run], pp, pp, "loop")
        units = [e for e in moved if e.op == "compute" and parse_unit_label(e.label)]
        spans.append(max(e.end for e in units) - min(e.start for e in units))
    return spans


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    cfg = mt.GPTConfig(vocab_size=args.vocab, seq_len=64, n_layer=args.n_layer, n_head=4,
                       d_model=args.d_model)
    costs, (first, last) = layer_flops(cfg), end_flops(cfg)
    layouts = {"even": layout_text(even_layout(cfg.n_layer, args.pp)),
               "balanced": mt.calc.pipeline_layout(cfg, args.pp).layout}
    for name, layout in layouts.items():
        stages = layout_stages(layout, cfg.n_layer, args.pp)
        model = [sum(costs[i] for i in r) + (first if g == 0 else 0)
                 + (last if g == args.pp - 1 else 0) for g, r in enumerate(stages)]
        run = mt.launch(timed_steps, args.pp, cfg, layout, args.steps, 8, 4, timeout=600)
        cpu = [round(1e3 * statistics.median(s[0] for s in rank)) for rank in run]
        wall = statistics.median(max(rank[i][1] for rank in run) for i in range(args.steps))
        replayed = statistics.median(replayed_seconds(run, args.pp))
        print(f"{name:9s} {layout:12s} MODEL MFLOP/token/stage "
              f"{[round(f / 1e6, 2) for f in model]}; MEASURED (medians of {args.steps} steps) "
              f"CPU ms/stage {cpu}, step ms load-free {1e3 * replayed:.0f}, "
              f"wall {1e3 * wall:.0f}")


if __name__ == "__main__":
    main()
