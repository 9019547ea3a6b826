"""Muon on one device (Jordan et al. 2024; torch.optim.Muon), and the split every Muon
user makes: Muon for the hidden layers' weight matrices, AdamW for the rest (the
embeddings, the tied head, LayerNorms, biases), as Moonlight (Liu et al. 2025, arXiv
2502.16982, §2) and torch's own docs (torch/optim/_muon.py, its example) do.

`Muon` is torch.optim.Muon (PyTorch 2.13) step for step: momentum by ``lerp`` (Nesterov by
default), `newton_schulz`, decoupled weight decay ``p *= 1 - lr·wd``, then ``p -= lr'·O``
with lr' torch's shape adjustment. One difference: torch runs Newton–Schulz in bfloat16;
here ``ns_dtype`` says (None: the gradient's dtype, so a float64 run is exact;
``torch.bfloat16`` reproduces torch bit for bit, tests/optim/test_muon.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from .newton_schulz import NS_COEFFICIENTS, NS_EPS, NS_STEPS, adjusted_lr, newton_schulz_blocks

LINEARS = (nn.Linear, ColumnParallelLinear, RowParallelLinear)
MUON_DEFAULTS = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                     ns_coefficients=NS_COEFFICIENTS, eps=NS_EPS, ns_steps=NS_STEPS,
                     adjust_lr_fn=None, ns_dtype=None, block_rows=None)
QKV_SPLITS = (None, "heads")


def is_hidden_matrix(module: nn.Module, attr: str, shape) -> bool:
    """A weight Muon updates: a linear layer's 2-D weight (`shape`: its shape, kept where
    ZeRO-3 has emptied the parameter). Embeddings, the (tied) head, norms and biases are
    not: AdamW steps them."""
    return attr == "weight" and isinstance(module, LINEARS) and len(shape) == 2


def head_rows(model: nn.Module) -> dict[int, int]:
    """id(projection) -> head_dim for the attention projections whose output rows run head by
    head (the GPT's fused ``qkv``; Llama's ``q`` and ``kv``): the blocks a per-head split
    orthogonalises alone. Tensor parallelism splits them by whole heads, so a tp rank's
    rows are whole blocks."""
    return {id(child): m.head_dim for m in model.modules() if hasattr(m, "head_dim")
            for name, child in m.named_children() if name in ("qkv", "q", "kv")}


def split_parameters(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the hidden matrices, the rest) of `model`'s trainable parameters, each once."""
    matrices, rest, seen = [], [], set()
    for module in model.modules():
        for attr, p in module._parameters.items():
            if p is None or id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            (matrices if is_hidden_matrix(module, attr, p.shape) else rest).append(p)
    return matrices, rest


def momentum_input(grad: torch.Tensor, buf: torch.Tensor, momentum: float,
                   nesterov: bool) -> torch.Tensor:
    """torch's momentum, elementwise (so a shard of it is the shard of the whole's): the
    buffer moves toward the gradient (in place), and Newton–Schulz's input is returned."""
    buf.lerp_(grad, 1 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf


def apply_update(param: torch.Tensor, update: torch.Tensor, group: dict, shape) -> None:
    """Decoupled weight decay, then the orthogonalised update at the lr of the WHOLE
    matrix's `shape` (elementwise again: a piece of `param` takes its piece of `update`)."""
    param.mul_(1 - group["lr"] * group["weight_decay"])
    param.add_(update.to(param.dtype), alpha=-adjusted_lr(group["lr"], group["adjust_lr_fn"],
                                                          shape))


def lr_shape(shape, block_rows: int | None) -> tuple[int, int]:
    """The shape torch's lr adjustment reads: the matrix's, or one block's under a split."""
    return (block_rows, shape[1]) if block_rows else tuple(shape)


def check_muon_options(options: dict) -> dict:
    """The Muon options with their defaults; a bad one refused in one line."""
    unknown = set(options) - set(MUON_DEFAULTS)
    if unknown:
        raise TypeError(f"Muon: unknown option(s) {sorted(unknown)}; known: "
                        f"{sorted(MUON_DEFAULTS)}")
    group = {**MUON_DEFAULTS, **options}
    if group["lr"] < 0 or group["momentum"] < 0 or group["weight_decay"] < 0:
        raise ValueError("Muon: lr, momentum and weight_decay must be >= 0")
    adjusted_lr(1.0, group["adjust_lr_fn"], (1, 1))  # refuses an unknown adjustment
    return group


class Muon(torch.optim.Optimizer):
    """torch.optim.Muon over 2-D parameters, with Newton–Schulz in ``ns_dtype``."""

    def __init__(self, params, **options):
        super().__init__(params, check_muon_options(options))
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon steps 2-D matrices only, got {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                x = momentum_input(p.grad, state["momentum_buffer"], group["momentum"],
                                   group["nesterov"])
                o = newton_schulz_blocks(x, group["block_rows"], group["ns_coefficients"],
                                         group["ns_steps"], group["eps"], group["ns_dtype"])
                apply_update(p, o, group, lr_shape(p.shape, group["block_rows"]))


ADAMW_PREFIX = "adamw_"  # make_optimizer's AdamW options: adamw_lr=..., adamw_weight_decay=...


def split_options(options: dict) -> tuple[dict, dict]:
    """(Muon's options, AdamW's) from one keyword set: ``adamw_<name>`` goes to AdamW."""
    adamw = {k[len(ADAMW_PREFIX):]: v for k, v in options.items() if k.startswith(ADAMW_PREFIX)}
    return {k: v for k, v in options.items() if not k.startswith(ADAMW_PREFIX)}, adamw


class Combined:
    """Several optimizers stepped as one (Muon's and AdamW's): what `mt.train_step` and a
    test call on an optimizer."""

    def __init__(self, *optimizers):
        self.optimizers = [o for o in optimizers if o is not None]
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {k: v for o in self.optimizers for k, v in o.state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> list:
        return [o.state_dict() for o in self.optimizers]


def check_qkv_split(qkv_split) -> None:
    if qkv_split not in QKV_SPLITS:
        raise ValueError(f"qkv_split must be None (whole matrices) or 'heads', got {qkv_split!r}")


def muon_with_adamw(model: nn.Module, qkv_split: str | None = None, **options) -> Combined:
    """One device: `Muon` over `model`'s hidden matrices, torch's AdamW over the rest
    (options ``adamw_lr``, ``adamw_weight_decay``, ...; AdamW's lr defaults to Muon's).
    ``qkv_split="heads"``: the attention projections orthogonalised head by head."""
    check_qkv_split(qkv_split)
    muon_options, adamw_options = split_options(options)
    matrices, rest = split_parameters(model)
    adamw_options.setdefault("lr", muon_options.get("lr", MUON_DEFAULTS["lr"]))
    rows = head_rows(model) if qkv_split else {}
    owner = {id(p): id(m) for m in model.modules() for p in m._parameters.values()}
    groups = {}
    for p in matrices:
        groups.setdefault(rows.get(owner[id(p)]), []).append(p)
    muon = Muon([{"params": ps, "block_rows": r} for r, ps in groups.items()],
                **muon_options) if matrices else None
    return Combined(muon, torch.optim.AdamW(rest, **adamw_options) if rest else None)
