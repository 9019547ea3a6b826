"""Per-rank memory, measured: model states, and the activations autograd keeps.

* `model_state_bytes`: parameters, gradients and optimizer state, summed over
  the tensors this rank actually holds (ZeRO's 2 + 2 + 12 bytes per parameter
  for mixed-precision Adam is the model it is set beside).
* `ActivationLedger`: every tensor autograd saves for backward during a forward
  pass, who saved it, its shape, dtype and bytes — counted once per storage.
* `korthikanti_bytes`: the activation bytes per transformer layer of Korthikanti
  et al. 2022 (arXiv 2205.05198), Table 2, for its six settings.
* `activation_table`: real launches of a small GPT for those settings, the
  ledger's bytes per layer beside the formula, and every byte of difference
  named from the ledger (`activation_scaling`: the same against t, to plot).

Why the measured number is not the formula, in short (the details are in
`GAP_ITEMS`): the paper's model counts only the big tensors of its own kernels;
ours also keeps LayerNorm statistics and an s×s causal mask, torch's CPU
dropout keeps 16-bit masks, our column-parallel layers keep their input after
the sequence all-gather, recomputation keeps an RNG state, and autograd keeps
the divisor √d of the attention scores. Nothing else: the tests check that the
rest is exactly Table 2.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from . import trace
from .calc.memory import activation_bytes_per_layer

# --------------------------------------------------------------------------- formula
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


# --------------------------------------------------------------------------- model states
def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def _unique_storage_bytes(tensors, seen: set) -> int:
    total = 0
    for t in tensors:
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes this rank holds for `model`'s states, read from the tensors themselves:
    ``{"parameters", "gradients", "optimizer", "total", "optimizer_state": {key: bytes}}``.

    Each storage is counted once, so tied parameters (GPT's input and output
    embedding) count once. Compare Rajbhandari et al. 2019 (ZeRO): 2 + 2 + 12
    bytes per parameter for mixed-precision Adam; here, in one dtype of e bytes,
    Adam keeps exp_avg and exp_avg_sq (2e per parameter) and a 4-byte step per
    parameter tensor.
    """
    params = list({id(p): p for p in model.parameters()}.values())
    seen: set = set()
    result = {
        "parameters": _unique_storage_bytes(params, seen),
        "gradients": _unique_storage_bytes((p.grad for p in params if p.grad is not None), seen),
    }
    per_key: dict[str, int] = {}
    if optimizer is not None:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    per_key[key] = per_key.get(key, 0) + _unique_storage_bytes([value], seen)
    result["optimizer"] = sum(per_key.values())
    result["total"] = result["parameters"] + result["gradients"] + result["optimizer"]
    result["optimizer_state"] = per_key
    return result


# --------------------------------------------------------------------------- the ledger
@dataclass(frozen=True)
class Saved:
    """One tensor kept for backward. ``nbytes`` is what it adds to the total: the
    size of its storage the first time that storage is seen, 0 after (``shares``
    then names the entry that counted it)."""

    index: int
    layer: str  # "layer3" (from blocks.3 or the trace label); "" outside the layers
    module: str  # qualified name of the innermost module running ("" without a model)
    module_type: str  # its class name
    op: str  # who saved it: a torch function ("linear"), an autograd Function, "checkpoint"...
    shape: tuple[int, ...]
    dtype: str
    numel: int
    nbytes: int
    shares: int | None = None
    storage: int = 0  # data_ptr of the storage: its identity while it lives
    device: str = "cpu"


def _op_name(func) -> str:
    return getattr(func, "__name__", str(func)).strip("_")


class _CurrentOp(TorchFunctionMode):
    """Remembers which torch function is running, so a pack hook can name the op
    that saved a tensor. Calls inside a handler are not intercepted again, so it
    is the outermost function (``linear``, not the ``addmm`` inside it)."""

    def __init__(self, on_result):
        super().__init__()
        self.name, self.on_result = "", on_result

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.name = _op_name(func)
        try:
            result = func(*args, **(kwargs or {}))
        finally:
            name, self.name = self.name, ""
        if any(type(arg) in (int, float) for arg in args):  # x / 3.0 and the like
            self.on_result(name, result)
        return result


def _saver_from_stack() -> tuple[str, list[torch.Tensor]]:
    """Who saves when no torch function runs: a custom autograd Function (its
    ``apply`` is on the stack) or torch.utils.checkpoint storing its inputs —
    then also the RNG states it keeps to replay dropout in the recomputation."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        where, names = frame.f_code.co_name, frame.f_locals
        if where == "_checkpoint_without_reentrant_generator":
            states = [names.get("fwd_cpu_state"), *(names.get("fwd_device_states") or [])]
            return "checkpoint", [s for s in states if isinstance(s, torch.Tensor)]
        cls = names.get("cls")
        if where == "apply" and isinstance(cls, type) and issubclass(cls, torch.autograd.Function):
            if cls.__name__ != "_NoopSaveInputs":  # older torch: checkpoint saves through it
                return cls.__name__.lstrip("_"), []
        frame = frame.f_back
    return "?", []


class ActivationLedger:
    """Context manager: records every tensor autograd saves for backward inside it.

        with ActivationLedger(model) as ledger:
            logits, loss = model(x, y)
        ledger.total_bytes, ledger.per_layer(), ledger    # the last prints the table

    Built on ``torch.autograd.graph.saved_tensors_hooks``: its pack hook sees each
    tensor as autograd saves it. Counted once per storage (q, k and v, views of
    one qkv tensor, count once); parameters (and views of them, like the Wᵀ a
    linear layer saves) are model state, not activations, and are left out.

    Recomputation (torch.utils.checkpoint, non-reentrant, as `minitp.recompute`):
    inside a checkpointed region checkpoint's own hooks replace ours and keep
    nothing but a placeholder; what stays alive is what checkpoint stores for
    itself — the region's inputs (they pass through our hook: op "checkpoint")
    and the CPU (and device) RNG state it restores to redraw the same dropout
    masks (op "checkpoint rng state"; host memory even on a GPU). So with full
    recomputation a layer shows its input and that RNG state, nothing else.

    Also counted: Python numbers that autograd keeps as 8-byte tensors (``x /
    3.0`` keeps 3.0 to divide the gradient by). Autograd saves those without
    calling saved-tensor hooks; the ledger finds them on the result's grad_fn
    (op "<function> scalar"). They live even inside a checkpointed region.

    Names: ``layer`` from a module name ``blocks.<i>`` or the trace label
    ``layer<i>``; ``module`` from forward hooks on `model`'s modules; ``op``
    from a torch-function mode that remembers the function running.
    """

    def __init__(self, model: nn.Module | None = None):
        self.model = model
        self.entries: list[Saved] = []
        self._first: dict[tuple[str, int], tuple[int, StorageWeakRef]] = {}
        self._modules: list[nn.Module] = []
        self._names: dict[int, str] = {}
        self._excluded: set[tuple[str, int]] = set()
        self._handles: list = []
        self._contexts: list = []

    # -- recording -----------------------------------------------------------------
    def __enter__(self) -> ActivationLedger:
        if self.model is not None:
            for name, module in self.model.named_modules():
                self._names[id(module)] = name
                self._handles.append(module.register_forward_pre_hook(self._enter_module))
                self._handles.append(
                    module.register_forward_hook(self._leave_module, always_call=True))
            state = [*self.model.parameters(), *self.model.buffers()]
            self._excluded = {_storage_key(t) for t in state}
        self._mode = _CurrentOp(self._record_unhooked)
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._contexts = [self._mode, hooks]
        for context in self._contexts:
            context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for context in reversed(self._contexts):
            context.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._contexts, self._handles, self._modules = [], [], []
        self._mode = None

    def _enter_module(self, module, args) -> None:
        self._modules.append(module)

    def _leave_module(self, module, args, output) -> None:
        if self._modules and self._modules[-1] is module:
            self._modules.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if trace._in_backward():  # a recomputation, or a backward with create_graph
            return tensor
        op, extra = self._mode.name, []
        if not op:
            op, extra = _saver_from_stack()
        self._record(tensor, op)
        for state in extra:
            self._record(state, "checkpoint rng state", only_if_new=True)
        return tensor  # keep the tensor itself: recording changes nothing

    def _record_unhooked(self, name: str, result) -> None:
        grad_fn = getattr(result, "grad_fn", None)
        if grad_fn is None or trace._in_backward():
            return
        for attr in dir(grad_fn):
            if attr.startswith("_raw_saved_"):
                raws = getattr(grad_fn, attr)
                for raw in raws if isinstance(raws, (list, tuple)) else [raws]:
                    if raw.unpack_hook is None and isinstance(raw.data, torch.Tensor):
                        self._record(raw.data, f"{name} scalar")

    def _record(self, tensor: torch.Tensor, op: str, only_if_new: bool = False) -> None:
        key = _storage_key(tensor)
        base = tensor._base if tensor._base is not None else tensor
        if key in self._excluded or isinstance(base, nn.Parameter):
            return  # model state, not an activation
        first = self._first.get(key)
        if first is not None and first[1].expired():
            first = None  # that storage was freed and its address reused
        if first is not None and only_if_new:
            return
        index = len(self.entries)
        if first is None:
            storage = tensor.untyped_storage()
            self._first[key] = (index, StorageWeakRef(storage))
            nbytes, shares = storage.nbytes(), None
        else:
            nbytes, shares = 0, first[0]
        module = self._modules[-1] if self._modules else None
        name = _plain_name(self._names.get(id(module), ""))
        self.entries.append(Saved(
            index=index, layer=_layer_of(name), module=name,
            module_type=type(module).__name__ if module is not None else "", op=op,
            shape=tuple(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."),
            numel=tensor.numel(), nbytes=nbytes, shares=shares, storage=key[1],
            device=key[0],
        ))

    # -- reading ---------------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def per_layer(self) -> dict[str, int]:
        """Bytes per transformer layer, {"layer0": …, "layer1": …}, in forward order."""
        layers: dict[str, int] = {}
        for e in self.entries:
            if e.layer:
                layers[e.layer] = layers.get(e.layer, 0) + e.nbytes
        return layers

    def layer(self, name: str) -> list[Saved]:
        """The entries of one layer, e.g. ``ledger.layer("layer0")``."""
        return [e for e in self.entries if e.layer == name]

    def table(self, layer: str | None = None) -> str:
        """One line per entry (of one layer, if named); "= #i": same storage as entry i."""
        cells = [("#", "layer", "module", "op", "shape", "dtype", "bytes")]
        for e in self.entries if layer is None else self.layer(layer):
            counted = f"{e.nbytes:,}" if e.shares is None else f"= #{e.shares}"
            cells.append((str(e.index), e.layer or "-", e.module or "-", e.op, str(e.shape),
                          e.dtype, counted))
        return _text_table(cells, right=(0, 6))

    def __repr__(self) -> str:
        layers = self.per_layer()
        other = self.total_bytes - sum(layers.values())
        summary = " · ".join([f"{k} {v:,}" for k, v in layers.items()] + [f"other {other:,}"])
        return (f"ActivationLedger: {len(self.entries)} saved tensors, {self.total_bytes:,} "
                f"bytes ({summary})\n{self.table()}")

    def __getstate__(self):  # what travels back from a rank: the record, not the hooks
        return {"entries": self.entries}

    def __setstate__(self, state) -> None:
        self.__init__()
        self.entries = state["entries"]


def _text_table(cells: list[tuple[str, ...]], right=()) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in cells)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _plain_name(module_name: str) -> str:
    """blocks.0.module.attn -> blocks.0.attn: leave out `Recomputed`'s wrapped ``module``."""
    return re.sub(r"(^|\.)module(?=\.|$)", "", module_name).lstrip(".")


def _layer_of(module_name: str) -> str:
    found = re.search(r"(?:^|\.)blocks\.(\d+)(?:\.|$)", module_name)
    if found:
        return f"layer{found.group(1)}"
    found = re.search(r"(?:^|\.)(layer\d+)(?:\.|$)", trace.recorder().label)
    return found.group(1) if found else ""


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
    from .mesh import Mesh
    from .model import GPT
    from .parallelize import parallelize

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
    measured = layers["layer0"]
    formula = korthikanti_bytes(cfg.seq_len, micro_batch, cfg.d_model, cfg.n_head, t, setting)
    explained = explain_gap(ledger.layer("layer0"), setting, t)
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
    from .launch import launch
    from .parallelize import check_parallel_config

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
