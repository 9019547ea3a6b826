"""Lab: eight bits across ranks — FP8's formats, its scales, its three scalings, the amax
group run right and wrong, and the bytes of an 8-bit all-gather (lesson 23).

* `formats` / `draw_formats`: e4m3 and e5m2 read off torch (``torch.finfo`` and every one of
  their 256 bit patterns): each positive value and the step to the next, drawn;
* `scale_errors`: tensors of small, ordinary and large magnitude cast with and without a
  scale, the relative error MEASURED against the float64 tensor;
* `three_scalings`: one linear layer (`fp8.Fp8Linear`) whose input has an outlier token
  and grows step by step, its output under tensorwise, delayed and rowwise scaling against
  the float64 layer, MEASURED per step;
* `backward_casts`: rowwise's two backward GEMMs from the forward's casts reused against
  casts taken again along the axis each GEMM keeps (torchao's, and the library's), on the
  same tensors, each against float64, MEASURED;
* `amax_group_run`: one launch of 2 ranks, a tiny GPT at tp = 2 with sequence parallelism in
  FP8 (`mt.parallelize(fp8="tensorwise")`), trained beside the one-process FP8 run
  (`fp8.reference_step`) with the amax groups right, then with each rank's own amax
  (``fp8_local_scales=True``, the trap): per step the loss's distance from one process, and
  the scale each rank used for one sequence-split input, MEASURED;
* `gather_bytes`: one ZeRO-3 step at dp = 2, its blocks' parameter all-gathers in bf16 and in
  8 bits (``fp8_all_gather=True``): the bytes the kernel counted (``sent_bytes``, MEASURED)
  and the trace's ring model, beside `calc.fp8_all_gather_bytes` (a MODEL).
"""

from __future__ import annotations

import warnings

import torch

from ... import fp8
from ...calc.footprint.fp8 import fp8_all_gather_bytes
from ...data_parallel import make_optimizer
from ...model import GPT, GPTConfig
from ...parallelize import parallelize
from ...runtime import trace
from ...runtime._device import device
from ...runtime.launch import launch
from ...runtime.mesh import Mesh
from ...sharding.dense import dense_name
from ...sharding.tags import tag
from ...step import train_step

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def formats() -> list[dict]:
    """Per format: its largest value, smallest normal and subnormal, and the step at 1."""
    rows = []
    for name, dtype in FORMATS.items():
        info = torch.finfo(dtype)
        values = fp8.representable(fp8.FORMATS[name])
        rows.append({"format": name, "max": info.max, "smallest normal": info.smallest_normal,
                     "smallest subnormal": values[values > 0].min().item(),
                     "step at 1": info.eps})
    return rows


def draw_formats(ax):
    """Every positive value of each format against its relative step to the next."""
    for name in FORMATS:
        v = fp8.representable(fp8.FORMATS[name])
        v = v[v > 0]
        ax.step(v[:-1], (v[1:] - v[:-1]) / v[:-1], where="post", label=name)
        ax.axvline(v.max().item(), ls=":", color=ax.lines[-1].get_color())
    ax.set(xscale="log", yscale="log", xlabel="value", ylabel="step to the next value / value",
           title="FP8's values and steps (dotted: the largest)")
    ax.legend()


def _relative(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def scale_errors(seed: int = 0) -> list[dict]:
    """Relative error of a cast, with scale 1 and with max/amax, per format and magnitude."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64).to(device())
    rows = []
    for magnitude in (1e-4, 1.0, 1e4):
        t = x * magnitude
        for name, fmt in fp8.FORMATS.items():
            scale = fp8.scale_from_amax(t.abs().max(), fmt)
            unscaled = fp8.quantize(t, torch.ones((), dtype=t.dtype, device=t.device), fmt)
            rows.append({"magnitude": magnitude, "format": name,
                         "no scale": _relative(unscaled, t),
                         "max/amax": _relative(fp8.quantize(t, scale, fmt), t)})
    return rows


def three_scalings(steps: int = 4, growth: float = 1.5, outlier: float = 1e4,
                   seed: int = 0) -> dict:
    """scaling -> per step, the relative error of the layer's output against float64 on the
    ordinary tokens and on the outlier token, (ordinary, outlier): the input is 32 tokens, one
    of them `outlier` times larger, the whole input `growth` times larger each step."""
    g = torch.Generator().manual_seed(seed)
    d = 64
    weight = (torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5).to(device())
    x0 = torch.randn(32, d, generator=g, dtype=torch.float64).to(device())
    x0[0] *= outlier  # one token far larger than the rest
    errors = {}
    for scaling in ("tensorwise", "delayed", "rowwise"):
        layer = fp8.Fp8Linear(d, d, bias=False, dtype=torch.float64, device=device())
        layer.weight.data.copy_(weight)
        layer.fp8 = fp8.LayerScales(scaling, name=scaling)
        errors[scaling] = []
        for step in range(steps):
            x = x0 * growth**step
            y, exact = layer(x).detach(), x @ weight.T
            errors[scaling].append((_relative(y[1:], exact[1:]), _relative(y[:1], exact[:1])))
    return errors


def backward_casts(outlier: float = 1e4, quiet: bool = True, seed: int = 0) -> dict:
    """Rowwise's backward, two ways, against float64 on the same tensors: relative errors
    {"reuse" | "re-cast": {"dgrad": …, "wgrad": …}}, MEASURED. "re-cast" is the library's
    (`fp8.Fp8Linear`, torchao's recipe: each operand cast again along the axis its GEMM
    keeps); "reuse" multiplies the forward's per-token and per-row casts and one per-token
    cast of g in both GEMMs, scales inside each sum, which no scaled GEMM computes. x: 32
    tokens, token 0 `outlier` times the rest; `quiet`: its gradient divided by as much, so
    that every token's term of ∂W = gᵀx is of one size (else the outlier's term is most of
    it)."""
    g = torch.Generator().manual_seed(seed)
    d = 64
    weight = (torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5).to(device())
    x = torch.randn(32, d, generator=g, dtype=torch.float64).to(device())
    grad = torch.randn(32, d, generator=g, dtype=torch.float64).to(device())
    x[0] *= outlier
    if quiet:
        grad[0] /= outlier
    exact = {"dgrad": grad @ weight, "wgrad": grad.T @ x}
    layer = fp8.Fp8Linear(d, d, bias=False, dtype=torch.float64, device=device())
    layer.weight.data.copy_(weight)
    layer.fp8 = fp8.LayerScales("rowwise")
    xs = x.clone().requires_grad_()
    layer(xs).backward(grad)
    s = layer.fp8  # reuse: the forward's casts (taken again), g cast once, per token
    xq, wq, gq = s.input.cast(x), s.weight.cast(weight), s.grad.cast(grad)
    got = {"reuse": {"dgrad": gq @ wq, "wgrad": gq.T @ xq},
           "re-cast": {"dgrad": xs.grad, "wgrad": layer.weight.grad}}
    return {way: {gemm: _relative(t, exact[gemm]) for gemm, t in grads.items()}
            for way, grads in got.items()}


CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=16)
WATCHED = "blocks.0.mlp.fc"  # a column-parallel layer whose input SP splits over tp


def _watched(model):
    found = [s for name, s in fp8.fp8_layers(model).items() if name.endswith(WATCHED)]
    if len(found) != 1:
        raise ValueError(f"no one FP8 layer named {WATCHED}")
    return found[0].input


def _shard_drift(model, ref, tp) -> float:
    """The largest difference of this rank's parameter shards from one process's slices."""
    plain, worst = dict(ref.named_parameters()), 0.0
    for name, p in model.named_parameters():
        whole = plain[dense_name(name)].detach()
        dim = tag(p, "tp_split_dim")
        if dim is not None:
            whole = whole.chunk(tp.size, dim=dim)[tp.rank]
        worst = max(worst, (p.detach() - whole).abs().max().item())
    return worst


def _train(local_scales: bool, steps: int):
    mesh, cfg = Mesh(tp=2), GPTConfig(**CFG)
    torch.manual_seed(0)
    ref = GPT(cfg).double().to(device())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the trap's warning: on purpose here
        model = parallelize(ref, mesh, sequence_parallel=True, fp8="tensorwise",
                               fp8_local_scales=local_scales)
    fp8.convert(ref, "tensorwise")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-2)
    g = torch.Generator().manual_seed(1)
    drift, scales, shards = [], [], []
    for _ in range(steps):
        x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=g).to(device())
        batch = (x[:, :-1], x[:, 1:])
        expected = fp8.reference_step(ref, batch, ref_opt, 1, 1)
        loss = train_step(model, batch, mesh, opt)
        drift.append(abs(loss - expected))
        scales.append(_watched(model).last_scale.item())
        shards.append(_shard_drift(model, ref, mesh.tp))
    return {"drift": drift, "scale": scales, "shards": shards}


def _both(steps: int):
    return {"right": _train(False, steps), "local": _train(True, steps)}


def amax_group_run(steps: int = 8):
    """Per rank: {"right"|"local": {"drift": |loss - one process| per step (the same on
    every rank: the loss is summed over tp), "shards": the largest difference of the rank's
    parameter shards from one process's, "scale": the watched input's scale, per step}}."""
    return launch(_both, 2, steps, timeout=120)


def draw_amax_groups(run, axes):
    left, right = axes
    for kind, style in (("right", "-"), ("local", "--")):
        for rank, per_rank in enumerate(run):
            steps = range(1, len(per_rank[kind]["shards"]) + 1)
            shards = [max(d, 1e-17) for d in per_rank[kind]["shards"]]
            left.plot(steps, shards, style, marker="o", label=f"{kind} scales, rank {rank}")
            right.plot(steps, per_rank[kind]["scale"], style, marker="o",
                       label=f"{kind} scales, rank {rank}")
    left.set(yscale="log", xlabel="step", ylabel="largest |shard − one process's| (≥ 1e-17)",
             title="each rank's parameters, drift from one process")
    right.set(xlabel="step", ylabel="scale (448 / amax)",
              title=f"{WATCHED}'s input scale, per rank")
    left.legend(fontsize=8)
    right.legend(fontsize=8)


GATHER_CFG = dict(vocab_size=16, seq_len=8, n_layer=1, n_head=4, d_model=64)


def _gather_step():
    mesh, cfg = Mesh(dp=2), GPTConfig(**GATHER_CFG)
    x = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(0)).to(device())
    out = {}
    for name, options in (("bf16", dict(param_dtype=torch.bfloat16)),
                          ("fp8", dict(fp8="tensorwise", fp8_all_gather=True))):
        torch.manual_seed(0)
        model = parallelize(GPT(cfg).to(device()), mesh, zero_stage=3, **options)
        optimizer = make_optimizer(model, mesh, torch.optim.AdamW, lr=1e-3)
        before = len(trace.events())
        train_step(model, (x, x), mesh, optimizer)
        for e in trace.events()[before:]:
            if e.label.startswith("zero params blocks"):
                got = out.setdefault((name, e.op, e.dtype), {"model": 0, "sent": 0})
                got["model"] += e.model_bytes
                got["sent"] = None if got["sent"] is None or e.sent_bytes is None \
                    else got["sent"] + e.sent_bytes
    return out


def gather_bytes() -> dict:
    """Rank 0's blocks' parameter gathers over one step, bf16 and 8-bit: (run, op, dtype) ->
    {"model": the trace's ring model, "sent": the kernel's count (None: not readable here)}."""
    return launch(_gather_step, 2, timeout=120)[0]


def gather_model(gathers: int = 2) -> dict:
    """MODEL (`calc.fp8_all_gather_bytes`), the same step at dp = 2: the block's four weights
    in 8 bits (one shared scale each: its amax all-reduced), against every value of the block
    in bf16 (its 13·d biases and norm values too); `gathers` a step (forward, backward)."""
    d = GATHER_CFG["d_model"]
    weights = [fp8_all_gather_bytes(r, c, 2) for r, c in
               [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]]
    return {"fp8 values": gathers * sum(w["values"] for w in weights),
            "bf16": gathers * (sum(w["bf16"] for w in weights) + 13 * d * 2 / 2)}
