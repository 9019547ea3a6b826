"""How far mt.calc's model is from published runs: ``python -m minitp.calc.accuracy``
(this module's `main`) writes docs/calc-accuracy.md (tests/calc/test_accuracy.py
regenerates it and fails on a difference).

Three quantities, each with its error per row (predicted / published − 1) and its band:

* model TFLOP/s per GPU by the identity tokens/s × FLOPs per token, the FLOPs
  `model_flops(cfg, 1, causal=True) / s`: 6 × the weight matrices' parameters + 6·s·h·L,
  Megatron-LM's count (causal attention halved). Arithmetic, not a model: it should
  agree to the table's rounding;
* step time: `step_time` with its defaults (efficiency 0.5 of the dense bf16 peak, nothing
  overlapped but context parallelism's ring), the row's layout, sequence parallelism
  wherever tp > 1, and its attention kernel (``causal``). A MODEL;
* MFU: `model_flops` / (step time · GPUs · the cluster's peak), in the row's convention.

Where mt.calc cannot express a row (FP8 compute, an MoE whose experts are not 4h wide,
layers that do not divide into the stages, a system with no `CLUSTERS` preset), the row
says so and gets no prediction: it is in no band.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from ..counts.flops import model_flops
from ..inference.serving import DecoderShape
from ..network.cluster import CLUSTERS
from ..planning.timing import step_time
from . import rows

OUT = Path(__file__).resolve().parents[3] / "docs" / "calc-accuracy.md"


def config(row) -> DecoderShape | str:
    """The row's model as a `DecoderShape` (what every calc function reads), or why
    mt.calc cannot express it."""
    if row.model in rows.LLAMA3:
        return DecoderShape(row.model, n_kv_head=8, vocab_size=128256, seq_len=row.seq,
                            source=rows.LLAMA3_SOURCE, **rows.LLAMA3[row.model])
    if row.model in rows.GPT:
        return gpt(row.model, row.seq)
    return "MoE not expressible: " + rows.UNMODELLED[row.model]


def gpt(name: str, seq_len: int) -> DecoderShape:
    """One of Megatron-LM's GPTs (`rows.GPT`): GPT-2's parts, a 4h GELU MLP."""
    n_layer, d_model, n_head = rows.GPT[name]
    return DecoderShape(name, n_layer, d_model, n_head, n_kv_head=n_head,
                        ffn_hidden=4 * d_model, vocab_size=51200, seq_len=seq_len,
                        source=rows.GPT_SOURCE, norm="layernorm", positions="learned",
                        mlp="gelu", bias=True)


def identity_tflops(row) -> float | None:
    """tokens/s/GPU × Megatron's FLOPs per token, in TFLOP/s (None: not expressible)."""
    cfg = config(row)
    if isinstance(cfg, str) or row.tokens_per_gpu is None:
        return None
    return row.tokens_per_gpu * model_flops(cfg, 1, causal=True) / cfg.seq_len / 1e12


def identity_bound(row) -> float:
    """TFLOP/s the identity may miss by from the table's rounding: ±0.5 on the printed
    TFLOP/s, ±0.5 token/s times the FLOPs per token."""
    cfg = config(row)
    return 0.5 + 0.5 * model_flops(cfg, 1, causal=True) / cfg.seq_len / 1e12


def unmodelled(row) -> list[str]:
    """Why `step_time` cannot predict this row; empty when it can."""
    cfg = config(row)
    if isinstance(cfg, str):
        return [cfg]
    why = []
    if row.precision != "BF16":
        why.append(f"{row.precision} compute not modelled (mt.calc's peak is dense bf16)")
    if row.system not in CLUSTERS:
        why.append(f"no {row.system} preset in calc.CLUSTERS")
    if cfg.n_layer % (row.pp * row.vp):
        why.append(f"{cfg.n_layer} layers do not divide into pp·vp = {row.pp * row.vp} "
                   f"stages (uneven layouts: not in the step-time model)")
    return why


def predicted_step(row) -> float:
    cfg = config(row)
    dp = row.gpus // (row.tp * row.pp * row.cp)
    return step_time(cfg, CLUSTERS[row.system], dp=dp, pp=row.pp, tp=row.tp, cp=row.cp,
                     micro_batch=row.mbs, global_batch=row.gbs, sp=row.tp > 1,
                     recompute=row.recompute, virtual=row.vp, zero_stage=row.zero,
                     causal=row.causal).total


def published_step(row) -> float | None:
    """Printed, or from tokens/s/GPU: GBS·s / (tokens/s/GPU · GPUs)."""
    if row.step_s is not None:
        return row.step_s
    if row.tokens_per_gpu is not None:
        return row.gbs * row.seq / (row.tokens_per_gpu * row.gpus)
    return None


def mfu_of(row, seconds: float) -> float:
    flops = model_flops(config(row), row.gbs, causal=row.causal)
    return flops / (seconds * row.gpus * CLUSTERS[row.system].peak_flops)


def step_and_mfu(row) -> dict:
    """Published and predicted step time and MFU of one row (None where absent)."""
    out = dict(step=published_step(row), mfu=row.mfu, step_pred=None, mfu_pred=None,
               why=unmodelled(row))
    if out["why"]:
        return out
    out["step_pred"] = predicted_step(row)
    out["mfu_pred"] = mfu_of(row, out["step_pred"])
    if out["mfu"] is None and out["step"] is not None:
        out["mfu"] = mfu_of(row, out["step"])
    return out


def weak_scaling() -> list[tuple]:
    """(model, GPUs, tp, published, predicted) efficiency: FLOP/s per GPU against one
    GPU's, `step_time` on DGX-2H V100s with 8 sequences a replica, no recomputation."""
    def per_gpu(name, gpus, tp):
        cfg = gpt(name, 1024)
        dp = gpus // tp
        seconds = step_time(cfg, CLUSTERS["v100"], dp=dp, tp=tp, micro_batch=8,
                            global_batch=8 * dp).total
        return model_flops(cfg, 8 * dp) / seconds / gpus

    one = per_gpu("1.2B", 1, 1)
    return [(name, gpus, tp, published, per_gpu(name, gpus, tp) / one)
            for name, gpus, tp, published in rows.WEAK_SCALING]


def _convention_gap(model: str, seq: int) -> float:
    cfg = config(rows.Published("", "", model, 1, "BF16", 1, 1, seq))
    return model_flops(cfg, 1) / model_flops(cfg, 1, causal=True) - 1


def _err(pred, pub) -> float | None:
    return None if pred is None or pub is None else pred / pub - 1


def _pct(x, digits=1) -> str:
    return "—" if x is None else f"{100 * x:+.{digits}f}%"


def _share(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _num(x, fmt) -> str:
    return "—" if x is None else format(x, fmt)


def _layout(row) -> str:
    parts = [f"{axis}{size}" for axis, size in (("tp", row.tp), ("pp", row.pp), ("cp", row.cp),
                                                  ("vp", row.vp), ("ep", row.ep)) if size > 1]
    return "·".join(parts + ["FSDP"] * bool(row.zero)) or "dp only"


_STEP_ROWS = rows.TORCHTITAN + rows.KORTHIKANTI + rows.LLAMA3_PAPER


def bands() -> dict[str, list[float]]:
    """Each quantity's errors (predicted / published − 1) over the rows the model expresses,
    as docs/calc-accuracy.md's "Error bands" table summarises them (`mt.calc.accuracy_bands`)."""
    steps = [step_and_mfu(r) for r in _STEP_ROWS]
    errors = {
        "model TFLOP/s by the identity (Megatron-Bridge)":
            [_err(identity_tflops(r), r.tflops) for r in rows.MEGATRON_BRIDGE],
        "step time (MODEL)": [_err(s["step_pred"], s["step"]) for s in steps],
        "MFU (MODEL)": [_err(s["mfu_pred"], s["mfu"]) for s in steps],
        "weak-scaling efficiency (MODEL; t = 1 is the reference, left out)":
            [_err(pred, pub) for _, gpus, _, pub, pred in weak_scaling() if gpus > 1]}
    return {quantity: [e for e in values if e is not None] for quantity, values in errors.items()}


def _band(errors) -> str:
    if not errors:
        return "| 0 | — | — | — |"
    return (f"| {len(errors)} | {_pct(min(errors))} | {_pct(statistics.median(errors))} | "
            f"{_pct(max(errors))} |")


def markdown() -> str:
    """docs/calc-accuracy.md, every number recomputed from `rows`."""
    ident = [(r, identity_tflops(r)) for r in rows.MEGATRON_BRIDGE]
    steps = [(r, step_and_mfu(r)) for r in _STEP_ROWS]
    weak = weak_scaling()
    lines = [
        "# mt.calc against published runs",
        "",
        "Generated by `python -m minitp.calc.accuracy` from the rows in "
        "`minitp/calc/accuracy/rows.py` (each names its source); do not edit by hand: "
        "`tests/calc/test_accuracy.py` regenerates it and fails on a difference. "
        "Error = predicted / published − 1. What each quantity is, and its conventions, "
        "is `minitp/calc/accuracy/report.py`'s docstring: the TFLOP/s identity is arithmetic "
        "(Megatron-LM's FLOPs per token, causal attention halved: `calc.model_flops(..., "
        "causal=True)`); step time and MFU are the MODEL `calc.step_time` at its default "
        "efficiency 0.5 of the dense bf16 peak. A row mt.calc cannot express says why and "
        "is in no band.",
        "",
        "## Error bands",
        "",
        "| quantity | rows | min | median | max |",
        "|---|---:|---:|---:|---:|",
        *(f"| {quantity} " + _band(errors) for quantity, errors in bands().items()),
        "",
        "## Megatron-Bridge, 25.11 NeMo Container: model TFLOP/s by the identity",
        "",
        f"Source: {rows.MB_SOURCE.format('…')}. Within rounding: |identity − printed| ≤ "
        "0.5 TFLOP/s + 0.5 token/s × FLOPs per token. No row's step time is modelled: "
        "every dense Llama row is FP8 (or on GB200/GB300, which calc.CLUSTERS lacks) and "
        "every other row is an MoE mt.calc cannot express.",
        "",
        "| system | model | GPUs | precision | layout | tokens/s/GPU | TFLOP/s printed | "
        "identity | error | within rounding | why no step time |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r, t in ident:
        within = "—" if t is None else ("yes" if abs(t - r.tflops) <= identity_bound(r)
                                        else "no")
        lines.append(f"| {r.source.split(': ')[-1]} | {r.model} | {r.gpus} | {r.precision} | "
                     f"{_layout(r)} | {r.tokens_per_gpu:.0f} | {r.tflops:.0f} | "
                     f"{_num(t, '.1f')} | {_pct(_err(t, r.tflops), 2)} | {within} | "
                     f"{'; '.join(unmodelled(r))} |")
    lines += ["", "## FLOPs conventions", "",
              "`calc.flops_per_iteration` and `calc.model_flops` count the core attention "
              "(QKᵀ and ·V) three ways: by default every row's full s × s (Korthikanti et al. "
              "2022, Eq. 7: what the course's MFUs use); `causal=True` half of it, as "
              "Megatron-LM's `num_floating_point_operations` (megatron/training/training.py) "
              "and so Megatron-Bridge's model TFLOP/s do; `doc_lengths=` packed documents, "
              "Σ Lᵢ² per row in place of s². Full attention counts these models' FLOPs "
              "higher by:", ""]
    lines += [f"- {name} at s = {seq}: {_pct(_convention_gap(name, seq))}"
              for name, seq in (("LLAMA3_8B", 8192), ("LLAMA3_70B", 8192),
                                ("LLAMA3.1_405B", 8192), ("LLAMA3.1_405B", 131072))]
    lines += [
        "",
        "## Step time and MFU",
        "",
        "Published step time: printed, or GBS·s / (tokens/s/GPU · GPUs); published MFU: "
        "printed, or the row's model FLOPs over that step time and the cluster's peak.",
        "",
        "| source | model | GPUs | precision | layout | step s printed | MODEL | error | "
        "MFU printed | MODEL | error | notes |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r, s in steps:
        notes = "; ".join(s["why"] + list(r.notes)
                          + ([] if r.causal else ["full attention counted (Eq. 7)"]))
        lines.append(f"| {r.source} | {r.model} | {r.gpus} | {r.precision} | {_layout(r)} | "
                     f"{_num(s['step'], '.2f')} | {_num(s['step_pred'], '.2f')} | "
                     f"{_pct(_err(s['step_pred'], s['step']))} | {_share(s['mfu'])} | "
                     f"{_share(s['mfu_pred'])} | {_pct(_err(s['mfu_pred'], s['mfu']))} | "
                     f"{notes} |")
    lines += [
        "",
        f"## Weak scaling: {rows.WEAK_SOURCE}",
        "",
        "FLOP/s per GPU against the 1.2B model's on one GPU; 8 sequences of 1024 per "
        "replica, DGX-2H V100s (`calc.DGX2H_V100`), no recomputation.",
        "",
        "| model | GPUs | tp | published | MODEL | error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {name} | {gpus} | {tp} | {pub:.0%} | {pred:.1%} | {_pct(_err(pred, pub))} |"
              for name, gpus, tp, pub, pred in weak]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Write docs/calc-accuracy.md (or the path given)."""
    path = Path((argv or sys.argv[1:] or [OUT])[0])
    path.write_text(markdown(), encoding="utf-8")
    print(f"wrote {path}")

