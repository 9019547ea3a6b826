"""Lab: activation memory, measured, beside Korthikanti et al. 2022, Table 2.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198), Table 2, gives the activation bytes per
transformer layer for six settings (`SETTINGS`): no parallelism, tensor
parallelism, with sequence parallelism, with selective recomputation, both,
and full recomputation.

* `korthikanti_bytes`: that formula (a MODEL: arithmetic, not a measurement).
* `activation_table`: real launches of a small GPT for those settings; the
  `minitp.memory.ActivationLedger`'s bytes per layer (MEASURED) beside the
  formula, and every byte of difference named from the ledger (`explain_gap`,
  `GAP_ITEMS`); `activation_scaling`: the same against t, to plot.

Why the measured number is not the formula, in short (the details are in
`GAP_ITEMS`): the paper's model counts only the big tensors of its own kernels;
ours also keeps LayerNorm statistics and an s×s causal mask, torch's CPU
dropout keeps 16-bit masks, our column-parallel layers keep their input after
the sequence all-gather, recomputation keeps an RNG state, and autograd keeps
the divisor √d of the attention scores. Nothing else: the tests check that the
rest is exactly Table 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from ...calc.footprint.memory import activation_bytes_per_layer
from ...memory.activations import ActivationLedger, Saved, _text_table
from ...rules import check_parallel_config, layer_label

# --------------------------------------------------------------------------- the formula
SETTINGS = ("none", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "full")
_OPTIONS = {  # setting -> (sequence_parallel, recompute) for mt.parallelize
    "none": (False, None), "tp": (False, None), "tp+sp": (True, None),
    "tp+selective": (False, "selective"), "tp+sp+selective": (True, "selective"),
    "full": (False, "full"),
}


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int = 1, setting: str = "none"):
    """Activation bytes per transformer layer, Korthikanti et al. 2022, Table 2
    (16-bit activations, 1-byte dropout masks; s sequence, b micro-batch,
    h hidden, a heads, t tensor-parallel size)::

        none             sbh(34 + 5as/h)          tp+selective     sbh(10 + 24/t)
        tp               sbh(10 + 24/t + 5as/ht)  tp+sp+selective  34sbh/t
        tp+sp            sbh/t · (34 + 5as/h)     full             2sbh

    34sbh = LayerNorm inputs 4 + QKV input 2 + Q, K 4 + V 2 + projection input 2
    + its dropout mask 1 + MLP input 2 + GELU input 8 + GELU output 8 + dropout
    mask 1; 5as²b = softmax output 2 + its dropout mask 1 + dropout output 2.
    Tensor parallelism splits 24 of the 34 and all of the 5as²b; sequence
    parallelism the remaining 10. ``t`` is ignored for "none" and "full".
    The arithmetic is `minitp.calc.activation_bytes_per_layer`'s (one source).
    Returns an int when the value is whole, else a float.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    sequence_parallel, recompute = _OPTIONS[setting]
    tp = 1 if setting in ("none", "full") else t
    shape = SimpleNamespace(seq_len=s, d_model=h, n_head=a)
    return activation_bytes_per_layer(shape, b, tp=tp, sp=sequence_parallel, recompute=recompute)


# --------------------------------------------------------------------------- the table
# What our layer keeps beyond Table 2, each found among the ledger's entries by a rule.
GAP_ITEMS = {
    "ln stats": "LayerNorm mean and 1/σ, one each per token (2 LayerNorms × 2 × b·s values, "
                "split by t under sequence parallelism): Table 2 leaves these small buffers out",
    "causal mask": "the s×s bool causal mask that masked_fill keeps, whole on every rank; Table "
                   "2 does not count it (Megatron-LM's fused causal softmax needs no mask tensor)",
    "16-bit masks": "the residual dropouts' masks, kept in the activation dtype, not 1 byte: "
                    "torch's CPU nn.Dropout computes x·noise and keeps the noise (on CUDA it "
                    "keeps a bool mask; ShardedDropout, used under sequence parallelism, keeps "
                    "a bool mask)",
    "gathered inputs": "sequence parallelism: qkv and fc (column-parallel) keep their input as "
                       "all-gathered, b·s·h each, not the b·s·h/t shard (Megatron-LM keeps the "
                       "shard and all-gathers again in backward)",
    "rng state": "the RNG state torch.utils.checkpoint keeps to redraw the same dropout masks "
                 "(torch.get_rng_state(), host memory)",
    "scalars": "Python numbers autograd keeps as 8-byte tensors: √d, from scores = q·kᵀ / √d",
}


def explain_gap(entries: list[Saved], setting: str, t: int) -> dict[str, int]:
    """The bytes of each `GAP_ITEMS` item among one layer's ledger entries."""
    sequence_parallel = _OPTIONS[setting][0]
    items = dict.fromkeys(GAP_ITEMS, 0)
    for e in entries:
        if e.op == "layer_norm" and e.shape[-1] == 1:  # mean or rstd, (b, s, 1)
            items["ln stats"] += e.nbytes
        elif e.op == "masked_fill" and e.dtype == "bool":
            items["causal mask"] += e.nbytes
        elif e.module_type in ("Dropout", "ShardedDropout"):
            items["16-bit masks"] += e.nbytes - e.numel if e.nbytes else 0  # beyond 1 B each
        elif sequence_parallel and e.module_type == "ColumnParallelLinear" and e.op == "linear":
            items["gathered inputs"] += e.nbytes - e.nbytes // t  # Table 2 counts 1/t
        elif e.op == "checkpoint rng state":
            items["rng state"] += e.nbytes
        elif e.op.endswith(" scalar"):
            items["scalars"] += e.nbytes
    return items


@dataclass
class ActivationTable:
    """Measured activation bytes per layer beside Table 2.

    ``rows``: one dict per (setting, t): measured, formula, ratio (measured /
    formula), gap (measured − formula), explained ({`GAP_ITEMS` item: bytes}) and
    unexplained (gap − Σ explained: 0 when every byte is accounted for).
    ``ledgers[(setting, t)]``: rank 0's whole `ActivationLedger` of that run.
    """

    cfg: object
    micro_batch: int
    dtype: torch.dtype
    rows: list[dict]
    ledgers: dict = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        c, items = self.cfg, list(GAP_ITEMS)
        cells = [("setting", "t", "measured", "formula", "ratio", "gap", "=", *items,
                  "unexplained")]
        for r in self.rows:
            cells.append((r["setting"], str(r["t"]), f"{r['measured']:,}", f"{r['formula']:,}",
                          f"{r['ratio']:.3f}", f"{r['gap']:+,}", "=",
                          *(f"{r['explained'][n]:,}" for n in items), f"{r['unexplained']:,}"))
        dtype = str(self.dtype).removeprefix("torch.")
        return "\n".join([
            "Activation bytes per transformer layer on rank 0: measured (ActivationLedger) "
            "vs Korthikanti et al. 2022, Table 2",
            f"s={c.seq_len} b={self.micro_batch} h={c.d_model} a={c.n_head}, {dtype}, "
            f"dropout {c.dropout}",
            _text_table(cells, right=range(1, len(cells[0]))),
            "gap = measured − formula, every byte of it found in the ledger:",
            *(f"  {name}: {text}" for name, text in GAP_ITEMS.items()),
        ])


def _plan(tp_sizes, settings=None) -> dict[int, list[str]]:
    """Which settings run at which t. By default "none" and "full" at t = 1 (the
    tensor-parallel settings would only repeat them) and all but "none" at t > 1;
    settings named explicitly run at every t ("none" only at t = 1)."""
    chosen = SETTINGS if settings is None else tuple(settings)
    for setting in chosen:
        if setting not in SETTINGS:
            raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    plan = {}
    for t in tp_sizes:
        if settings is None and t == 1:
            here = [s for s in chosen if s in ("none", "full")]
        else:
            here = [s for s in chosen if s != "none" or t == 1]
        if here:
            plan[t] = here
    return plan


def _rank_ledgers(cfg, micro_batch: int, dtype, settings, seed: int):
    """On every rank of a launch: one forward pass per setting, under a ledger."""
    from ...model import GPT
    from ...parallelize import parallelize
    from ...runtime.mesh import Mesh

    mesh = Mesh(dp=1, pp=1, tp=torch.distributed.get_world_size())
    torch.manual_seed(seed)
    ref = GPT(cfg).to(dtype)
    x = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len))
    y = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len))
    ledgers = {}
    for setting in settings:
        sequence_parallel, recompute = _OPTIONS[setting]
        model = parallelize(ref, mesh, sequence_parallel=sequence_parallel, recompute=recompute)
        with ActivationLedger(model) as ledger:
            _, loss = model(x, y)
        del loss, model  # free this graph before the next one
        ledgers[setting] = ledger
    return ledgers if mesh.tp.rank == 0 else None


def _row(cfg, micro_batch: int, setting: str, t: int, ledger: ActivationLedger) -> dict:
    layers = ledger.per_layer()
    if len(set(layers.values())) != 1:
        raise RuntimeError(f"{setting}, t={t}: the layers keep different bytes: {layers}")
    measured = layers[layer_label(0)]
    formula = korthikanti_bytes(cfg.seq_len, micro_batch, cfg.d_model, cfg.n_head, t, setting)
    explained = explain_gap(ledger.layer(layer_label(0)), setting, t)
    return {"setting": setting, "t": t, "measured": measured, "formula": formula,
            "ratio": measured / formula, "gap": measured - formula, "explained": explained,
            "unexplained": measured - formula - sum(explained.values())}


def activation_table(cfg, micro_batch: int, tp_sizes=(1, 2, 4), dtype=torch.bfloat16,
                     settings=None, seed: int = 0, timeout: float = 120.0) -> ActivationTable:
    """Activation bytes per transformer layer, measured in real launches (one per t),
    beside `korthikanti_bytes`, the gap put under `GAP_ITEMS`.

    A GPT of `cfg` in a 16-bit `dtype` (Table 2's assumption), parallelized for
    each setting with the matching sequence_parallel / recompute, runs one
    forward pass of a (micro_batch, seq_len) batch under an `ActivationLedger`
    on every rank; rank 0's bytes per layer make a row. `cfg.dropout` must be > 0,
    since the formula counts dropout masks. `settings` (default: all of
    `SETTINGS`, see `_plan` for which t each runs at) picks the rows. Runs on
    CPU processes (gloo) on any machine, so the numbers are the same everywhere.
    """
    from ...runtime.launch import launch

    if not cfg.dropout > 0:
        raise ValueError("Table 2 counts dropout masks: use a GPTConfig with dropout > 0")
    if torch.empty((), dtype=dtype).element_size() != 2:
        raise ValueError(f"Table 2 is for 16-bit activations, got {dtype}")
    plan = _plan(tp_sizes, settings)
    for t, here in plan.items():
        for setting in here:
            sequence_parallel, recompute = _OPTIONS[setting]
            check_parallel_config(cfg, tp=t, sequence_parallel=sequence_parallel,
                                  recompute=recompute)
    rows, ledgers = [], {}
    for t, here in plan.items():
        run = launch(_rank_ledgers, t, cfg, micro_batch, dtype, here, seed, backend="gloo",
                     timeout=timeout)
        for setting in here:
            rows.append(_row(cfg, micro_batch, setting, t, run[0][setting]))
            ledgers[(setting, t)] = run[0][setting]
    return ActivationTable(cfg, micro_batch, dtype, rows, ledgers)


def activation_scaling(cfg, micro_batch: int, tp_sizes=(1, 2, 4), dtype=torch.bfloat16,
                       seed: int = 0, timeout: float = 120.0) -> dict[str, list]:
    """Activation bytes per layer as t grows, tensor parallelism without and with
    sequence parallelism, measured and by the formula (lesson 05's plot):
    ``{"t": [...], "tp": [...], "tp formula": [...], "tp+sp": [...], "tp+sp formula": [...]}``."""
    table = activation_table(cfg, micro_batch, tp_sizes, dtype, ("tp", "tp+sp"), seed, timeout)
    out: dict[str, list] = {"t": list(tp_sizes)}
    for setting in ("tp", "tp+sp"):
        rows = [r for r in table.rows if r["setting"] == setting]
        out[setting] = [r["measured"] for r in rows]
        out[f"{setting} formula"] = [r["formula"] for r in rows]
    return out
