"""Lab: a vision-language model across ranks (lesson 15) — the two encoder layouts of the
lesson's source (a notes file, named in the lesson's first cell), the encoder trained, run side
by side on real ranks; their trap run on purpose; the pipeline's imbalance timed.

`runs()`: one launch of 4 ranks (tp 4, sequence parallelism, float64, batches of rendered
corpus lines), per layout of the vision encoder ("replicated", "tensor"):

* ``exact``: the largest loss and parameter differences from one device after 3 AdamW steps;
* ``encoder_params``: the encoder's parameters this rank holds; ``states``: every byte of
  model state it holds (`mt.memory.measure_model_states`);
* ``encoder_bytes``: what the encoder costs over tp in one step, from the trace: the
  all-reduces labelled "vision" (the split layout), or how much the step's all-reduce of
  partial gradients grew beside the same decoder reading no image (the replicated one);
* ``seconds``: the median of 5 more steps' wall time on this machine;

and ``no_sum``: the replicated layout with the encoder's partial gradients left out of the
sum over tp — how far it goes from one device, and how far two ranks' copies of the
encoder drift apart.

`pipeline()`: 2 pipeline stages (1F1B, float32), the encoder in the first: each stage's
forward and backward times from the trace, beside the same decoder reading no image.

`reading()`: does the model read? One process trains the same small VLM twice on the same
batches, once shown the images and once a blank picture, and scores held-out batches at
the positions the image shows and at the rest (a minute and more on a CPU: recorded by
`bench/vlm_reads.py`, shown by `show_reading`). Everything here is measured; the formulas
beside it in the lesson (`mt.calc.architectures.vision`) are a MODEL.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ...data import load_tokens, split
from ...data.images import batch_for, image_chars_of
from ...data_parallel.zero import make_optimizer
from ...memory.model_states import measure_model_states
from ...model import GPT
from ...model.config import GPTConfig
from ...parallelize import parallelize
from ...runtime import comm, trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...step import train_step
from ..paths import repo_root
from .modern_transformer import side_by_side

CFG = dict(vocab_size=256, seq_len=32, n_layer=2, n_head=4, d_model=32, n_kv_head=2,
           norm="rmsnorm", positions="rope", mlp="swiglu", bias=False,
           vision_patches=16, vision_layers=2, vision_width=32, vision_heads=4)
LAYOUTS = ("replicated", "tensor")
STEPS, TIMED, LR, ROWS = 3, 5, 1e-2, 4


def _batches(cfg, steps, first=0, rows=ROWS):
    tokens = load_tokens(max_bytes=200_000)  # a slice of the corpus: enough for these steps
    return [tuple(t.to(device()) for t in batch_for(cfg, tokens, s, rows))
            for s in range(first, first + steps)]


def _encoder_of(model) -> list[torch.Tensor]:
    return [p for name, p in model.named_parameters() if name.startswith("vision.")]


def _forget_encoder_sum(model) -> None:
    """The step's sum of partial gradients over tp, without the encoder's."""
    encoder = {id(p) for p in _encoder_of(model)}
    partial = model.partial_grad_parameters
    model.partial_grad_parameters = lambda: [p for p in partial() if id(p) not in encoder]


def _partial_sum_bytes(events) -> int:
    return sum(e.nbytes for e in events if e.label == "sequence-parallel grads")


def _run(cfg, layout, spoil=None, timed=0) -> dict:
    """Lesson 09's side by side (3 AdamW steps beside one device) on rendered batches at tp 4
    with SP, then the median wall time of `timed` more steps and the model states held."""
    run = side_by_side(dict(tp=4), dict(sequence_parallel=True, vision_layout=layout), cfg,
                       spoil, batches=_batches(cfg, STEPS))
    model, mesh, opt = run["model"], run["mesh"], run["optimizer"]
    seconds = []
    with trace.paused():
        for batch in _batches(cfg, timed, first=STEPS):
            comm.barrier(mesh.tp)  # every rank starts the step together
            started = time.perf_counter()
            train_step(model, batch, mesh, opt)
            seconds.append(time.perf_counter() - started)
    return dict(run, seconds=statistics.median(seconds) if seconds else None,
                states=measure_model_states(model, opt)["total"])


def _runs_rank() -> dict:
    cfg = GPTConfig(**CFG)
    text_only = _run(GPTConfig(**{**CFG, "vision_patches": 0}), "replicated")
    out = {}
    for layout in LAYOUTS:
        run = _run(cfg, layout, timed=TIMED)
        if layout == "tensor":
            cost = sum(e.nbytes for e in run["events"]
                       if e.op == "all_reduce" and e.label.startswith("vision"))
        else:
            cost = _partial_sum_bytes(run["events"]) - _partial_sum_bytes(text_only["events"])
        out[layout] = dict(exact=(run["loss_gap"], run["param_gap"]), states=run["states"],
                           encoder_params=sum(p.numel() for p in _encoder_of(run["model"])),
                           encoder_bytes=cost, seconds=run["seconds"])
    spoiled = _run(cfg, "replicated", spoil=_forget_encoder_sum)
    encoder = torch.cat([p.detach().reshape(-1) for p in _encoder_of(spoiled["model"])])
    out["no_sum"] = dict(loss_gap=spoiled["loss_gap"], param_gap=spoiled["param_gap"],
                         encoder=encoder.cpu())
    return out


def runs(timeout: float = 300.0):
    """Each of the 4 ranks' results (see the module docstring)."""
    return launch(_runs_rank, 4, timeout=timeout)


# The pipeline's model: an encoder doing more FLOPs than a stage's share of the decoder
PIPELINE_CFG = {**CFG, "seq_len": 64, "n_layer": 4, "d_model": 64, "vision_patches": 32,
                "vision_layers": 8, "vision_width": 64}
MICROBATCHES, PIPELINE_ROWS = 4, 8


def _stage_times(events, rank) -> dict:
    """Median milliseconds of this rank's forwards and backwards (trace regions "F…"/"B…")."""
    spans = {"F": [], "B": []}
    for e in events:
        if e.rank == rank and e.op == "compute" and e.label[:1] in spans:
            spans[e.label[:1]].append(1e3 * (e.end - e.start))
    return {kind: statistics.median(ms) for kind, ms in spans.items()}


def _pipeline_rank(steps: int) -> dict:
    out = {}
    for name, patches in (("vlm", PIPELINE_CFG["vision_patches"]), ("text only", 0)):
        cfg = GPTConfig(**{**PIPELINE_CFG, "vision_patches": patches})
        mesh = Mesh(pp=2)
        torch.manual_seed(0)
        model = parallelize(GPT(cfg).to(device()), mesh)
        opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=LR)
        times = []
        for k, batch in enumerate(_batches(cfg, steps, rows=PIPELINE_ROWS)):
            trace.clear()
            with trace.paused() if k == 0 else contextlib.nullcontext():  # the first: warm-up
                train_step(model, batch, mesh, opt, schedule="1f1b", microbatches=MICROBATCHES)
            if k:
                times.append(list(trace.events()))
        out[name] = dict(events=times[-1], times=[_stage_times(ev, mesh.rank) for ev in times])
    return out


def pipeline(steps: int = 6, timeout: float = 300.0):
    """2 stages, 1F1B over 4 microbatches of 2 rows: per rank and model ("vlm", "text
    only"), the last step's events (its timeline) and each traced step's median F and B
    milliseconds (the first step a warm-up, untraced)."""
    return launch(_pipeline_rank, 2, steps, timeout=timeout)


# Does it read? A model small enough to train on a laptop's CPU in a minute or two.
READING_CFG = dict(seq_len=32, n_layer=2, d_model=64, n_head=4, n_kv_head=2, vision_patches=16,
                   vision_width=64, vision_heads=4)
RECORDED = repo_root() / "bench" / "results" / "vlm-reads.json"


def _scores(model, cfg, batches, blank) -> dict:
    """Mean held-out loss at the targets the image shows ("read") and at the rest."""
    P, shown = cfg.vision_patches, image_chars_of(cfg)
    read, rest = [], []
    with torch.no_grad():
        for x, y in batches:
            if blank:
                x = x.clone()
                x[:, :P] = 0  # a blank picture: every pixel off
            logits, _ = model(x)
            loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # IGNORE: 0
            read.append(loss[:, P - 1:P - 1 + shown].mean().item())
            rest.append(loss[:, P - 1 + shown:].mean().item())
    return {"read": statistics.fmean(read), "rest": statistics.fmean(rest)}


def reading(steps: int = 1500, batch: int = 32, seed: int = 0, lr: float = 3e-3,
            progress=None) -> dict:
    """Train `READING_CFG`'s VLM for `steps` AdamW steps on rendered batches, shown the
    images ("image") and, from the same start on the same batches, a blank picture
    ("blank"); each scored on 8 held-out batches of 64 rows. `progress(n)` is called after
    every step (a progress bar's update)."""
    cfg = GPTConfig.vlm(**READING_CFG)
    train_tokens, held_out = split(load_tokens())
    held = [tuple(t.to(device()) for t in batch_for(cfg, held_out, i, 64)) for i in range(8)]
    out = {"steps": steps, "batch": batch, "seed": seed, "lr": lr, "config": READING_CFG}
    for name, blank in (("image", False), ("blank", True)):
        torch.manual_seed(seed)
        model = GPT(cfg).to(device())
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        for step in range(steps):
            x, y = (t.to(device()) for t in batch_for(cfg, train_tokens, step, batch, seed))
            if blank:
                x[:, :cfg.vision_patches] = 0
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if progress is not None:
                progress(1)
        out[name] = _scores(model, cfg, held, blank)
    return out


def show_reading(path: Path | None = None) -> dict | None:
    """Print the recorded `reading()` (`bench/vlm_reads.py`'s JSON): when, where, and the
    held-out losses; return the record, or None (and say so) when none was recorded."""
    path = Path(path or RECORDED)
    if not path.exists():
        print(f"No run of bench/vlm_reads.py is recorded ({path.name}): run it to see one.")
        return None
    rec = json.loads(path.read_text(encoding="utf-8"))
    print(f"recorded {rec['date'][:10]} on {rec['device_name']} by {rec['command']} "
          f"({rec['steps']} steps of {rec['batch']} rows, twice, in {rec['seconds']:.0f} s):")
    print(f"{'shown':>8} {'loss where the image shows the text':>36} {'loss elsewhere':>15}")
    for name in ("image", "blank"):
        print(f"{name:>8} {rec[name]['read']:>36.3f} {rec[name]['rest']:>15.3f}")
    return rec
