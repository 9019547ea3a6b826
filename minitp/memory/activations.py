"""The activations autograd keeps, measured: `ActivationLedger` records every tensor
saved for backward during a forward pass, who saved it, its shape, dtype and bytes —
counted once per storage.

The course's experiment that sets the ledger beside Korthikanti et al. 2022, Table 2
(the formula, the measured table and every byte of the gap named) is a laboratory,
`minitp.course.labs.activations`, which imports this module (never the reverse).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from ..rules import layer_label, parse_layer_label
from ..runtime import trace
from .model_states import local, storage_key


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
            self._excluded = {storage_key(t) for t in state}
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
        if tensor.numel() == 0:  # a placeholder (some torch builds' checkpoint saves one
            return tensor        # before its inputs): no bytes; its RNG states come with them
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
        if tensor.numel() == 0:  # keeps no bytes (a placeholder some torch builds save on
            return               # CUDA beside checkpoint's real inputs): not an activation
        key = storage_key(tensor)
        base = tensor._base if tensor._base is not None else tensor
        if (key in self._excluded or isinstance(base, nn.Parameter)
                or getattr(base, "zero_gathered", False)):  # ZeRO-3's gathered parameters
            return  # model state, not an activation
        first = self._first.get(key)
        if first is not None and first[1].expired():
            first = None  # that storage was freed and its address reused
        if first is not None and only_if_new:
            return
        index = len(self.entries)
        if first is None:
            storage = local(tensor).untyped_storage()
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
    return ".".join(part for part in module_name.split(".") if part and part != "module")


def _layer_of(module_name: str) -> str:
    """The layer label ("layer3") of a saved tensor: from the module that runs
    (``blocks.3…``), else from the trace label (set by the pipeline's stages),
    else "" (outside the transformer layers)."""
    parts = module_name.split(".")
    for part, index in zip(parts[:-1], parts[1:], strict=True):
        if part == "blocks" and index.isdigit():
            return layer_label(int(index))
    index = parse_layer_label(trace.recorder().label)
    return "" if index is None else layer_label(index)
